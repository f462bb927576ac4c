"""The rules that turn readings into verdicts (seed §5 "Failure Detection").

Kept apart from the probes so each rule is a small pure function tested with a fake clock:
- a fatal Xid, an uncorrectable ECC error, or a lost GPU → `gpu_failed`;
- above `threshold_c` for `window_s` without a break → `thermal`;
- a heartbeat older than its job's hang timeout (rank not finished, process not gone) → `hang`,
  for the ranks `hang_culprits` (`plugins/run/rules.py`, shared with the control plane) blames,
  not every rank that waits for them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from trainyard.node_agent.models import GpuStatus, RankHeartbeat, Verdict
from trainyard.plugins.run.heartbeat import DATA_FIELDS, Heartbeat
from trainyard.plugins.run.rules import FINISHED_PHASES, Stalled, hang_culprits

FATAL_XIDS: dict[int, str] = {
    48: "double-bit (uncorrectable) ECC error",
    63: "ECC row remapping/page retirement recorded: the bad rows are fenced only after a GPU reset",
    64: "ECC row remapping/page retirement failed: the memory can no longer protect itself",
    74: "NVLink error: collectives over this GPU's links are broken",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate: HBM is degrading, a double-bit error is likely next",
    94: "contained ECC error: the process on the GPU was killed and the rows need a reset to remap",
    95: "uncontained ECC error: every process on the GPU is affected, a GPU reset is required",
    119: "GSP RPC timeout: the GPU system processor stopped answering, a reset is required",
    120: "GSP error: the GPU system processor faulted, a reset is required",
}
"""Xids after which a GPU is drained rather than trusted with the next attempt.

Why these (NVIDIA's Xid catalog and the A100/H100 memory-error guides): 48/94/95 are
uncorrectable memory errors; 63/64 are row-remap events that need a reset (63) or mean the
remapper failed (64); 92 predicts them; 74 breaks NCCL over NVLink; 79, 119 and 120 leave the
GPU unusable until a reset. All of them either already killed the training processes or make
the next attempt on this GPU likely to die; restarting the gang on the same GPU would burn a
restart from `maxRestarts` for nothing (seed §5: single GPU error → replace node).
Application-caused Xids (13 graphics exception, 31 MMU fault, 43 stopped processing, 45
preemptive cleanup) are counted but not judged: the same node runs the next attempt fine.
"""


def xid_verdict(gpu: int | None, xid: int, when: float, *, injected: bool = False,
                fatal_xids: dict[int, str] | None = None) -> Verdict | None:
    """`gpu_failed` for a fatal Xid, None for one that does not condemn the GPU."""
    table = FATAL_XIDS if fatal_xids is None else fatal_xids
    if xid not in table:
        return None
    where = f"GPU {gpu}" if gpu is not None else "a GPU NVML could not name"
    return Verdict(kind="gpu_failed", gpu=gpu, xid=xid, since=when, injected=injected,
                   reason=f"Xid {xid} on {where}: {table[xid]}")


def ecc_verdict(gpu: GpuStatus, when: float) -> Verdict | None:
    """`gpu_failed` when the volatile uncorrectable ECC counter is above zero, or the GPU is lost."""
    if gpu.lost:
        return Verdict(kind="gpu_failed", gpu=gpu.index, since=when,
                       reason=f"GPU {gpu.index} is lost (NVML: GPU is lost)")
    count = gpu.ecc_volatile_uncorrectable
    if count:
        return Verdict(kind="gpu_failed", gpu=gpu.index, since=when,
                       reason=f"GPU {gpu.index} has {count} uncorrectable ECC error(s) since the driver loaded")
    return None


class ThermalWatch:
    """Tracks, per GPU, since when the temperature has stayed above the threshold.

    Fed one sample per poll. A sample at or below the threshold, or a missing reading, ends
    the excursion; the verdict holds once the excursion has lasted `window_s`.
    """

    def __init__(self, threshold_c: float = 83.0, window_s: float = 60.0) -> None:
        if window_s < 0:
            raise ValueError(f"thermal window must be >= 0 s, got {window_s}")
        self.threshold_c = threshold_c
        self.window_s = window_s
        self._above_since: dict[int, float] = {}

    def update(self, gpu: int, temperature_c: float | None, now: float) -> None:
        if temperature_c is None or temperature_c <= self.threshold_c:
            self._above_since.pop(gpu, None)
        else:
            self._above_since.setdefault(gpu, now)

    def verdict(self, gpu: int, temperature_c: float | None, now: float) -> Verdict | None:
        since = self._above_since.get(gpu)
        if since is None or now - since < self.window_s:
            return None
        return Verdict(kind="thermal", gpu=gpu, since=since,
                       reason=f"GPU {gpu} at {temperature_c:g} °C, above {self.threshold_c:g} °C "
                              f"for {now - since:.0f} s (window {self.window_s:g} s)")


def rank_status(beat: Heartbeat, now: float, path: str = "", *, process_alive: bool | None = None) -> RankHeartbeat:
    """Judge one heartbeat at `now`. A non-finite loss counts as `nan` even if the writer did
    not set the flag (a hand-written loop or an older runtime). `process_alive` is whether the
    rank's process still lives (None: the caller cannot see it); a gone process is not hung."""
    age = max(0.0, now - beat.time)
    gone = process_alive is False
    stale = age > beat.hang_timeout_s and beat.phase not in FINISHED_PHASES and not gone
    nan = beat.nan or (beat.loss is not None and not math.isfinite(beat.loss))
    return RankHeartbeat(job=beat.job, run=beat.run, attempt=beat.attempt, rank=beat.rank, local_rank=beat.local_rank,
                         pid=beat.pid, phase=beat.phase, step=beat.step, time=beat.time, age_s=age,
                         signal=beat.signal,
                         restart=beat.restart,
                         loss=beat.loss, tokens_per_s=beat.tokens_per_s, nan=nan,
                         hang_timeout_s=beat.hang_timeout_s, stale=stale, alive_at=beat.alive_at,
                         frozen=None if gone or beat.phase in FINISHED_PHASES else beat.frozen(now), gone=gone,
                         path=path,
                         **{name: getattr(beat, name) for name in DATA_FIELDS})


def hang_verdicts(ranks: Iterable[RankHeartbeat]) -> list[Verdict]:
    """`hang` for each culprit (`hang_culprits`) of each attempt among `ranks` (its live,
    unfinished ones weighed together)."""
    by_attempt: dict[tuple[str, str, int], list[RankHeartbeat]] = {}
    for r in ranks:
        if not r.gone and r.phase not in FINISHED_PHASES:
            by_attempt.setdefault((r.job, r.run, r.attempt), []).append(r)
    verdicts = []
    for group in by_attempt.values():
        blamed = set(hang_culprits(Stalled(r.rank, r.step, r.frozen, r.stale, r.signal == "activity") for r in group))
        verdicts += [hang_verdict(r) for r in group if r.rank in blamed]  # a culprit not stale yet: soon
    return [v for v in verdicts if v is not None]


def hang_verdict(rank: RankHeartbeat) -> Verdict | None:
    if not rank.stale:
        return None
    run = f" run {rank.run}" if rank.run else ""
    how = {True: "; its process shows no sign of life either (stopped or frozen)",
           False: "; its process is alive (stuck in its own code, or waiting for a peer)"}.get(rank.frozen, "")
    if rank.signal == "activity":
        return Verdict(kind="hang", job=rank.job, run=rank.run or None, attempt=rank.attempt, rank=rank.rank,
                       since=rank.time, step=None, frozen=rank.frozen,
                       reason=f"rank {rank.rank} of job {rank.job!r}{run} attempt {rank.attempt} (a plain script, "
                              f"watched by its activity): no CPU time and no I/O for {rank.age_s:.0f} s "
                              f"(hang timeout {rank.hang_timeout_s:g} s)")
    return Verdict(kind="hang", job=rank.job, run=rank.run or None, attempt=rank.attempt, rank=rank.rank,
                   since=rank.time, step=rank.step, frozen=rank.frozen,
                   reason=f"rank {rank.rank} of job {rank.job!r}{run} attempt {rank.attempt}: no heartbeat "
                          f"for {rank.age_s:.0f} s (hang timeout {rank.hang_timeout_s:g} s), "
                          f"last at step {rank.step} in phase {rank.phase!r}{how}")
