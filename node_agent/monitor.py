"""`Monitor`: the agent's state, and the one place a `NodeHealth` report is assembled.

A background poller samples NVML every `poll_interval_s` (and feeds the thermal watch, which
needs regular samples whether or not anyone scrapes); the Xid watcher records events as they
arrive; a report combines the last sample with a fresh (cached) heartbeat scan, so a scrape
never waits on NVML and rank ages are exact at the time of the request.

Verdicts that come from events (Xids) hold until the agent restarts: on a real node that is
after the GPU reset or reboot that repairs it. Injected faults hold until `DELETE /faults`.
A hang verdict names its job, run and attempt, and lasts while the rank's process does: a
rank whose process is gone (a cancelled or crashed run) is reported `gone`, never hung, so a
run that ended leaves no verdict for the next one to read (and `NodeHealth.about` keeps an
attempt's evidence to its own verdicts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from trainyard.node_agent.config import AgentConfig
from trainyard.node_agent.gpu_probe import NvmlProbe, XidWatcher
from trainyard.node_agent.heartbeat_reader import HeartbeatReader
from trainyard.node_agent.models import (
    UNHEALTHY_KINDS,
    FaultRequest,
    GpuStatus,
    NodeHealth,
    RankHeartbeat,
    Verdict,
)
from trainyard.node_agent.verdicts import (
    FINISHED_PHASES,
    ThermalWatch,
    ecc_verdict,
    hang_verdicts,
    rank_status,
    xid_verdict,
)
from trainyard.plugins.run.heartbeat import Heartbeat, own_pid_namespace

log = logging.getLogger(__name__)


def current_ranks(ranks: Iterable[RankHeartbeat], now: float, *, finished_after_s: float) -> list[RankHeartbeat]:
    """The ranks worth reporting, by (job, run, attempt, rank). An attempt is over, and
    forgotten, when a newer attempt of its run beats on this node (the control plane starts attempt N+1
    only after attempt N ended: a rank of N killed mid-step is a crash already handled, not a
    hang), or when all its ranks finished more than `finished_after_s` ago (0: kept)."""
    ranks = list(ranks)
    newest_attempt: dict[tuple[str, str], int] = {}
    for r in ranks:
        newest_attempt[r.job, r.run] = max(r.attempt, newest_attempt.get((r.job, r.run), r.attempt))
    by_attempt: dict[tuple[str, str, int], list[RankHeartbeat]] = {}
    for r in ranks:
        if r.attempt == newest_attempt[r.job, r.run]:
            by_attempt.setdefault((r.job, r.run, r.attempt), []).append(r)
    kept = []
    for group in by_attempt.values():
        finished = all(r.phase in FINISHED_PHASES for r in group)
        if finished and finished_after_s and now - max(r.time for r in group) > finished_after_s:
            continue
        kept += group
    return sorted(kept, key=lambda r: (r.job, r.run, r.attempt, r.rank))


def process_alive(beat: Heartbeat) -> bool | None:
    """Whether the rank's process still lives, where this agent can tell: only when it shares
    the writer's PID namespace (the embedded stack; a DaemonSet with `hostPID` sees other pods'
    processes under other numbers, and says None). A reused pid reads as alive: then the hang
    rules decide, as before."""
    if not beat.pid_ns or beat.pid_ns != own_pid_namespace() or not beat.pid:
        return None
    from trainyard.plugins.run.processes import is_alive

    return is_alive(beat.pid)


class Monitor:
    def __init__(self, config: AgentConfig, probe: NvmlProbe | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._probe = probe if probe is not None else NvmlProbe()
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._scan_lock = threading.Lock()
        self._thermal = ThermalWatch(config.thermal_threshold_c, config.thermal_window_s)
        self._reader = HeartbeatReader(config.heartbeat_dir)
        self._gpus: list[GpuStatus] = []
        self._sampled_at = self._started
        self._ecc_onsets: dict[int, float] = {}
        """GPU → first sample with an uncorrectable ECC error or lost."""
        self._xid_counts: dict[int | None, Counter[int]] = {}
        self._xid_verdicts: dict[tuple[int | None, int, bool], Verdict] = {}
        self._node_fault: Verdict | None = None
        self._watcher: XidWatcher | None = None
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        """Find the GPUs (or say, once, that there are none), take a first sample, watch Xids."""
        if self._probe.open():
            log.info("%d NVIDIA GPU(s), driver %s", self._probe.gpu_count, self._probe.driver_version)
            self._watcher = self._probe.watch_xids(self.record_xid, self.config.xid_wait_ms)
        else:
            log.warning("no NVIDIA GPU/driver (%s): reporting %d CPU slots",
                        self._probe.error, self.config.cpu_slots)
        self.poll()

    def start(self) -> None:
        """Poll in the background every `poll_interval_s`."""
        self._poller = threading.Thread(target=self._poll_loop, name="gpu-poller", daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.config.poll_interval_s):
            try:
                self.poll()
            except Exception:  # a bad sample must not end the witness
                log.exception("GPU poll failed")

    def close(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=self.config.poll_interval_s + 5.0)
        if self._watcher is not None:
            self._watcher.stop()
        self._probe.close()

    # --- inputs --------------------------------------------------------------------------------
    @property
    def has_gpus(self) -> bool:
        return self._probe.available

    @property
    def device_count(self) -> int:
        """GPUs, or CPU slots on a node without them: the indexes a fault may name."""
        return self._probe.gpu_count if self.has_gpus else self.config.cpu_slots

    def poll(self) -> None:
        gpus = self._probe.read()
        now = self._clock()
        with self._lock:
            self._gpus = gpus
            self._sampled_at = now
            for gpu in gpus:
                self._thermal.update(gpu.index, gpu.temperature_celsius, now)
                if ecc_verdict(gpu, now) is None:
                    self._ecc_onsets.pop(gpu.index, None)
                else:
                    self._ecc_onsets.setdefault(gpu.index, now)

    def record_xid(self, gpu: int | None, xid: int, *, injected: bool = False) -> Verdict | None:
        """Count an Xid event; a fatal one fails the GPU (first occurrence of each code kept)."""
        now = self._clock()
        verdict = xid_verdict(gpu, xid, now, injected=injected)
        with self._lock:
            self._xid_counts.setdefault(gpu, Counter())[xid] += 1
            if verdict is not None:
                verdict = self._xid_verdicts.setdefault((gpu, xid, injected), verdict)
        level = logging.ERROR if verdict is not None else logging.WARNING
        log.log(level, "Xid %d on GPU %s%s", xid, gpu, " (injected)" if injected else "")
        return verdict

    def inject(self, fault: FaultRequest) -> None:
        """Apply a `POST /faults` body. Raises ValueError for a device this node does not have."""
        if fault.gpu is not None:
            if fault.gpu >= self.device_count:
                raise ValueError(f"gpu {fault.gpu} does not exist: this node reports "
                                 f"{self.device_count} device(s)")
            self.record_xid(fault.gpu, fault.xid, injected=True)
            return
        reason = fault.reason or "marked unhealthy by fault injection"
        with self._lock:
            self._node_fault = Verdict(kind="node_unhealthy", reason=reason, since=self._clock(), injected=True)
        log.error("node marked unhealthy (injected): %s", reason)

    def clear_faults(self) -> None:
        with self._lock:
            self._node_fault = None
            self._xid_verdicts = {k: v for k, v in self._xid_verdicts.items() if not v.injected}
        log.warning("injected faults cleared")

    def xid_counts(self) -> dict[int | None, dict[int, int]]:
        with self._lock:
            return {gpu: dict(c) for gpu, c in self._xid_counts.items()}

    # --- the report ----------------------------------------------------------------------------
    def health(self) -> NodeHealth:
        now = self._clock()
        with self._scan_lock:
            beats = self._reader.scan()
            invalid, named = self._reader.invalid_files, self._reader.invalid
        forget = self.config.forget_after_s
        newest: dict[tuple[str, str, int, int], RankHeartbeat] = {}
        for path, beat in beats:  # one entry per (job, run, attempt, rank): the newest file wins
            key = (beat.job, beat.run, beat.attempt, beat.rank)
            if (not forget or now - beat.time <= forget) and (key not in newest or beat.time > newest[key].time):
                newest[key] = rank_status(beat, now, str(path), process_alive=process_alive(beat))
        ranks = current_ranks(newest.values(), now, finished_after_s=self.config.forget_finished_after_s)
        with self._lock:
            gpus = [g.model_copy(update={"xid_events": dict(self._xid_counts.get(g.index, {}))})
                    for g in self._gpus]
            verdicts = self._gpu_verdicts(gpus)
            verdicts += sorted(self._xid_verdicts.values(), key=lambda v: (v.since, -1 if v.gpu is None else v.gpu))
            if self._node_fault is not None:
                verdicts.append(self._node_fault)
        verdicts += hang_verdicts(ranks)
        if not self.has_gpus:
            verdicts.insert(0, Verdict(kind="no_gpu", since=self._started, reason=(
                f"no NVIDIA GPU/driver ({self._probe.error}): reporting {self.config.cpu_slots} CPU slots")))
        return NodeHealth(
            node=self.config.node, time=now,
            healthy=not any(v.kind in UNHEALTHY_KINDS for v in verdicts),
            verdicts=verdicts,
            accelerator="nvidia" if self.has_gpus else "cpu",
            gpus=gpus, slots=0 if self.has_gpus else self.config.cpu_slots,
            driver_version=self._probe.driver_version, probe_error=self._probe.error,
            ranks=ranks, invalid_heartbeat_files=invalid, invalid_heartbeats=named,
            uptime_s=now - self._started, fault_injection=self.config.enable_fault_injection,
        )

    def _gpu_verdicts(self, gpus: list[GpuStatus]) -> list[Verdict]:
        """ECC / lost / thermal verdicts from the last sample (call with the lock held)."""
        verdicts: list[Verdict] = []
        for gpu in gpus:
            ecc = ecc_verdict(gpu, self._ecc_onsets.get(gpu.index, self._sampled_at))
            if ecc is not None:
                verdicts.append(ecc)
            thermal = self._thermal.verdict(gpu.index, gpu.temperature_celsius, self._sampled_at)
            if thermal is not None:
                verdicts.append(thermal)
        return verdicts
