"""Verdict rules (seed §5) with a fake clock: fatal Xid, ECC, thermal window, hang, faults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.node_agent.fake_nvml import FakeGpu, FakeNvml
from trainyard.node_agent.config import AgentConfig
from trainyard.node_agent.gpu_probe import NvmlProbe
from trainyard.node_agent.models import FaultRequest
from trainyard.node_agent.monitor import Monitor
from trainyard.node_agent.verdicts import (
    FATAL_XIDS,
    ThermalWatch,
    xid_verdict,
)
from trainyard.plugins.files import write_atomic
from trainyard.plugins.run.heartbeat import (
    Heartbeat,
    heartbeat_path,
    own_pid_namespace,
    write_heartbeat,
)
from trainyard.plugins.run.rules import Stalled, hang_culprits


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _monitor(tmp_path: Path, gpus: int = 2, clock: Clock | None = None, **config: object) -> tuple[Monitor, FakeNvml]:
    fake = FakeNvml([FakeGpu(uuid=f"GPU-{i}") for i in range(gpus)])
    cfg = AgentConfig(node="n", heartbeat_dir=tmp_path / "hb", xid_wait_ms=10, **config)  # type: ignore[arg-type]
    monitor = Monitor(cfg, NvmlProbe(fake.module), clock=clock or Clock())
    monitor.open()
    return monitor, fake


def _beat(rank: int = 0, *, time: float, job: str = "j", attempt: int = 0, phase: str = "train",
          hang_timeout_s: float = 600.0, step: int = 7, run: str = "", pid: int | None = None) -> Heartbeat:
    """A beat of a live rank (this test's own process, so the agent finds it alive)."""
    return Heartbeat(job=job, run=run, attempt=attempt, rank=rank, pid=os.getpid() if pid is None else pid, step=step,
                     time=time, loss=2.5, tokens_per_s=1234.0, phase=phase, hang_timeout_s=hang_timeout_s)


def _write_as_is(directory: Path, beat: Heartbeat) -> None:
    """The file as `beat` says, its `alive_at` and `pid_ns` included (`write_heartbeat` stamps
    both with the writing moment and this process)."""
    write_atomic(heartbeat_path(directory, beat.rank), beat.model_dump_json())


def test_fatal_xids_are_the_documented_set() -> None:
    assert {48, 79, 63, 64, 74, 92, 94, 95, 119, 120} == set(FATAL_XIDS)
    for benign in (13, 31, 43, 45):
        assert xid_verdict(0, benign, 1.0) is None
    verdict = xid_verdict(5, 48, 12.0)
    assert verdict is not None
    assert (verdict.kind, verdict.gpu, verdict.xid, verdict.since) == ("gpu_failed", 5, 48, 12.0)
    assert "double-bit" in verdict.reason


def test_thermal_needs_the_whole_window_above_the_threshold() -> None:
    watch = ThermalWatch(threshold_c=83.0, window_s=60.0)
    watch.update(0, 84.0, 0.0)
    watch.update(0, 90.0, 59.9)
    assert watch.verdict(0, 90.0, 59.9) is None
    watch.update(0, 85.0, 60.0)
    verdict = watch.verdict(0, 85.0, 60.0)
    assert verdict is not None and (verdict.kind, verdict.gpu, verdict.since) == ("thermal", 0, 0.0)
    watch.update(0, 83.0, 61.0)  # exactly at the threshold is not above it
    assert watch.verdict(0, 83.0, 61.0) is None
    watch.update(0, 84.0, 62.0)
    assert watch.verdict(0, 84.0, 121.9) is None  # a new excursion starts its own window
    watch.update(0, None, 130.0)  # a missing reading ends the excursion too
    assert watch.verdict(0, None, 200.0) is None
    with pytest.raises(ValueError, match="-1"):
        ThermalWatch(window_s=-1)


def test_thermal_through_the_monitor_with_a_fake_clock(tmp_path: Path) -> None:
    clock = Clock()
    monitor, fake = _monitor(tmp_path, clock=clock, thermal_window_s=2.0, thermal_threshold_c=83.0)
    try:
        fake.gpus[1].temperature = 88
        for _ in range(2):
            clock.now += 1.0
            monitor.poll()
            assert monitor.health().healthy
        clock.now += 1.0
        monitor.poll()
        health = monitor.health()
        assert not health.healthy
        (verdict,) = health.unhealthy_verdicts()
        assert (verdict.kind, verdict.gpu) == ("thermal", 1) and "88 °C" in verdict.reason
        fake.gpus[1].temperature = 70
        monitor.poll()
        assert monitor.health().healthy
    finally:
        monitor.close()


def test_volatile_uncorrectable_ecc_fails_the_gpu_aggregate_alone_does_not(tmp_path: Path) -> None:
    clock = Clock()
    monitor, fake = _monitor(tmp_path, clock=clock)
    try:
        fake.gpus[0].ecc_aggregate = 3  # old, repaired errors
        monitor.poll()
        assert monitor.health().healthy
        fake.gpus[0].ecc_volatile = 1
        monitor.poll()
        onset = clock.now
        clock.now += 30
        monitor.poll()
        health = monitor.health()
    finally:
        monitor.close()
    assert health.failed_gpus == [0]
    (verdict,) = health.unhealthy_verdicts()
    assert verdict.since == onset and "1 uncorrectable ECC error" in verdict.reason


def test_stale_heartbeat_is_a_hang_of_the_job_not_of_the_node(tmp_path: Path) -> None:
    clock = Clock()
    monitor, _ = _monitor(tmp_path, clock=clock)
    hb = tmp_path / "hb" / "j" / "attempt-0"
    try:
        write_heartbeat(hb, _beat(0, time=clock.now - 5, hang_timeout_s=10))
        write_heartbeat(hb, _beat(1, time=clock.now - 11, hang_timeout_s=10, step=3))
        write_heartbeat(tmp_path / "hb" / "old", _beat(0, job="old", time=clock.now - 300, phase="done", hang_timeout_s=10))
        health = monitor.health()
    finally:
        monitor.close()
    assert health.healthy  # a hung job does not condemn the node
    by_key = {(r.job, r.rank): r for r in health.ranks}
    assert by_key["j", 0].stale is False and by_key["j", 0].age_s == pytest.approx(5)
    assert by_key["j", 1].stale is True and by_key["j", 1].step == 3
    assert by_key["old", 0].stale is False  # finished ranks stop beating on purpose
    (hang,) = [v for v in health.verdicts if v.kind == "hang"]
    assert (hang.job, hang.attempt, hang.rank, hang.since) == ("j", 0, 1, clock.now - 11)
    assert health.verdicts_for("j", 0) == [hang] and health.verdicts_for("j", 1) == []


def test_the_newest_file_per_rank_wins_and_old_ones_are_forgotten(tmp_path: Path) -> None:
    clock = Clock()
    monitor, _ = _monitor(tmp_path, clock=clock, forget_after_s=100)
    try:
        write_heartbeat(tmp_path / "hb" / "a", _beat(0, time=clock.now - 50, step=1))
        write_heartbeat(tmp_path / "hb" / "b", _beat(0, time=clock.now - 1, step=9))
        write_heartbeat(tmp_path / "hb" / "c", _beat(0, job="gone", time=clock.now - 101))
        ranks = monitor.health().ranks
    finally:
        monitor.close()
    assert [(r.job, r.rank, r.step) for r in ranks] == [("j", 0, 9)]


def test_injected_faults_fail_and_clear_without_touching_real_ones(tmp_path: Path) -> None:
    monitor, _ = _monitor(tmp_path, gpus=4, enable_fault_injection=True)
    try:
        monitor.record_xid(0, 48)  # a real one
        monitor.inject(FaultRequest(gpu=3, xid=79))
        monitor.inject(FaultRequest(node_unhealthy=True, reason="game day"))
        health = monitor.health()
        assert health.failed_gpus == [0, 3]
        assert {(v.kind, v.injected) for v in health.unhealthy_verdicts()} == {
            ("gpu_failed", False), ("gpu_failed", True), ("node_unhealthy", True)}
        assert any(v.reason == "game day" for v in health.verdicts)
        monitor.inject(FaultRequest(gpu=2, xid=13))  # benign: counted only
        with pytest.raises(ValueError, match=r"gpu 4 does not exist: this node reports 4 device"):
            monitor.inject(FaultRequest(gpu=4))
        monitor.clear_faults()
        health = monitor.health()
    finally:
        monitor.close()
    assert health.failed_gpus == [0] and not health.healthy
    assert monitor.xid_counts() == {0: {48: 1}, 3: {79: 1}, 2: {13: 1}}  # counters never go back


def test_fault_request_takes_exactly_one_fault() -> None:
    assert FaultRequest.model_validate({"gpu": 3}).xid == 79
    for bad in ({}, {"gpu": 1, "node_unhealthy": True}, {"xid": 48}, {"gpu": -1}, {"gpu": 0, "colour": "red"}):
        with pytest.raises(ValueError):
            FaultRequest.model_validate(bad)


def test_rank_status_ages_and_flags_non_finite_losses() -> None:
    from trainyard.node_agent.verdicts import rank_status

    beat = Heartbeat.model_validate_json(
        '{"job": "j", "rank": 2, "pid": 1, "step": 9, "time": 100.0, "loss": NaN, "hang_timeout_s": 30}')
    status = rank_status(beat, now=95.0)  # a writer's clock slightly ahead: age is never negative
    assert (status.age_s, status.nan, status.stale) == (0.0, True, False)
    assert rank_status(beat, now=130.5).stale is True
    assert rank_status(beat.model_copy(update={"phase": "diverged"}), now=1e9).stale is False


def test_an_attempt_followed_by_a_newer_one_is_forgotten_and_no_hang_is_reported(tmp_path: Path) -> None:
    # Attempt 0: rank 1 was killed at step 120 (its heartbeat stopped); attempt 1 resumed and
    # finished. Six minutes later the crashed attempt must not show as a hang.
    clock = Clock()
    monitor, _ = _monitor(tmp_path, clock=clock, forget_finished_after_s=600)
    try:
        write_heartbeat(tmp_path / "hb" / "j" / "attempt-0", _beat(0, time=clock.now - 400, step=120, hang_timeout_s=120))
        write_heartbeat(tmp_path / "hb" / "j" / "attempt-0", _beat(1, time=clock.now - 420, step=120, hang_timeout_s=120))
        for rank in (0, 1):
            write_heartbeat(tmp_path / "hb" / "j" / "attempt-1",
                            _beat(rank, attempt=1, time=clock.now - 360, step=200, phase="done", hang_timeout_s=120))
        write_heartbeat(tmp_path / "hb" / "k", _beat(0, job="k", time=clock.now - 400, hang_timeout_s=120))
        health = monitor.health()
        assert [(r.job, r.attempt, r.rank) for r in health.ranks] == [("j", 1, 0), ("j", 1, 1), ("k", 0, 0)]
        assert [(v.kind, v.job) for v in health.verdicts if v.kind == "hang"] == [("hang", "k")]  # k has no successor
        clock.now += 300  # the finished attempt is dropped once past its grace
        assert [(r.job, r.attempt) for r in monitor.health().ranks] == [("k", 0)]
    finally:
        monitor.close()


def test_two_runs_of_a_job_on_one_node_are_two_gangs(tmp_path: Path) -> None:
    # Two triggers of one job: run a is on its second attempt, run b (started later) on its
    # first and hung. Neither hides the other, and the hang names b.
    clock = Clock()
    monitor, _ = _monitor(tmp_path, clock=clock)
    try:
        for rank in (0, 1):
            write_heartbeat(tmp_path / "hb" / "j" / "a" / "1", _beat(rank, run="a", attempt=1, time=clock.now - 5))
            write_heartbeat(tmp_path / "hb" / "j" / "b" / "0",
                            _beat(rank, run="b", time=clock.now - 400, hang_timeout_s=120))
        health = monitor.health()
        assert [(r.run, r.attempt, r.rank) for r in health.ranks] == [("a", 1, 0), ("a", 1, 1), ("b", 0, 0), ("b", 0, 1)]
        hangs = health.verdicts_for("j", 0, run="b")
        assert [v.rank for v in hangs] == [0, 1] and all("run b attempt 0" in v.reason for v in hangs)
        assert health.verdicts_for("j", run="a") == []
    finally:
        monitor.close()


def test_a_hang_blames_the_frozen_rank_not_the_ranks_waiting_for_it(tmp_path: Path) -> None:
    # Rank 1 was stopped (SIGSTOP): its last write is as old as its last step. Ranks 0 and 2
    # wait for it in a collective: their steps are as old, but their writer threads still beat.
    clock = Clock()
    monitor, _ = _monitor(tmp_path, clock=clock)
    hb = tmp_path / "hb" / "j" / "r" / "0"
    ns = own_pid_namespace()
    try:
        for rank, alive_at in ((0, clock.now - 1), (1, clock.now - 61), (2, clock.now - 2)):
            _write_as_is(hb, _beat(rank, run="r", time=clock.now - 61, step=40, hang_timeout_s=60).model_copy(
                update={"alive_at": alive_at, "pid_ns": ns}))
        health = monitor.health()
    finally:
        monitor.close()
    assert [(r.rank, r.stale, r.frozen) for r in health.ranks] == [(0, True, False), (1, True, True), (2, True, False)]
    (hang,) = health.verdicts_for("j", 0, run="r")
    assert (hang.rank, hang.step, hang.frozen) == (1, 40, True) and "no sign of life" in hang.reason


def test_culprits_are_the_frozen_else_the_laggards_else_everyone() -> None:
    assert hang_culprits([Stalled(0, 40, False), Stalled(1, 40, True), Stalled(2, 40, False)]) == [1]
    assert hang_culprits([Stalled(0, 40, False), Stalled(1, 39, False), Stalled(2, 40, None)]) == [1]
    assert hang_culprits([Stalled(0, 40, True), Stalled(1, 39, True)]) == [1]  # all frozen: the laggard
    assert hang_culprits([Stalled(1, 40, None), Stalled(0, 40, None)]) == [0, 1]
    # the waiting rank crossed the timeout a moment before the stopped one: still the stopped one
    assert hang_culprits([Stalled(0, 40, False, stale=True), Stalled(1, 40, True, stale=False)]) == [1]
    assert hang_culprits([Stalled(0, 40, None, stale=False), Stalled(1, 41, False, stale=False)]) == []


def test_a_stale_rank_whose_process_is_gone_is_no_hang(tmp_path: Path) -> None:
    # A cancelled run: its ranks were killed mid-step, their files stay. The agent shares their
    # PID namespace and sees the processes are gone: no verdict for anyone to read later.
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead = int(done.stdout)
    clock = Clock()
    monitor, _ = _monitor(tmp_path, clock=clock)
    try:
        write_heartbeat(tmp_path / "hb" / "j" / "cancelled" / "0",
                        _beat(0, run="cancelled", time=clock.now - 700, hang_timeout_s=600, pid=dead))
        write_heartbeat(tmp_path / "hb" / "j" / "hung" / "0",
                        _beat(0, run="hung", time=clock.now - 700, hang_timeout_s=600))
        health = monitor.health()
    finally:
        monitor.close()
    gone = {r.run: (r.gone, r.stale) for r in health.ranks}
    assert gone == {"cancelled": (True, False), "hung": (False, True)}
    assert [v.run for v in health.verdicts if v.kind == "hang"] == ["hung"]
    assert health.about("j", "cancelled", 0).verdicts == [v for v in health.verdicts if v.job is None]
    assert [v.run for v in health.about("j", "hung", 0).verdicts if v.kind == "hang"] == ["hung"]


def test_a_plain_script_s_gang_hangs_only_when_every_rank_is_still() -> None:
    # rank 0 evaluates for minutes; rank 1 waits in a barrier, still and "frozen" by its activity
    waiting = [Stalled(0, None, False, False, True), Stalled(1, None, True, True, True)]
    assert hang_culprits(waiting) == []
    stuck = [Stalled(0, None, True, True, True), Stalled(1, None, True, True, True)]
    assert hang_culprits(stuck) == [0, 1]
    # ranks watched by their steps keep blaming the frozen one
    assert hang_culprits([Stalled(0, 5, False, False), Stalled(1, 5, True, True)]) == [1]
