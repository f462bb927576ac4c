"""Verdict rules (seed §5) with a fake clock: fatal Xid, ECC, thermal window, hang, faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.config import AgentConfig
from node_agent.gpu_probe import NvmlProbe
from node_agent.heartbeat import Heartbeat, write_heartbeat
from node_agent.models import FaultRequest
from node_agent.monitor import Monitor
from node_agent.verdicts import FATAL_XIDS, ThermalWatch, xid_verdict
from tests.unit.node_agent.fake_nvml import FakeGpu, FakeNvml


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
          hang_timeout_s: float = 600.0, step: int = 7, run: str = "") -> Heartbeat:
    return Heartbeat(job=job, run=run, attempt=attempt, rank=rank, pid=100 + rank, step=step, time=time, loss=2.5,
                     tokens_per_s=1234.0, phase=phase, hang_timeout_s=hang_timeout_s)


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
    from node_agent.verdicts import rank_status

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
