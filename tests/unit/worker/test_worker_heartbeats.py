"""The heartbeat writer thread: the newest beat lands on disk, atomically, without the training
thread waiting; `flush` waits for it; writes follow the clock (one per interval), not the steps;
a bad directory or a bad beat never raises into training."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from trainyard.plugins.run.heartbeat import (
    WRITE_EVERY_S,
    Heartbeat,
    heartbeat_path,
    pulse_interval_s,
    write_interval_s,
)
from trainyard.worker import heartbeats
from trainyard.worker.heartbeats import HeartbeatWriter


def beat(step: int, phase: str = "train") -> Heartbeat:
    return Heartbeat(job="j", rank=3, pid=1, step=step, time=time.time(), loss=1.0, phase=phase)


def test_newest_beat_is_written(tmp_path: Path) -> None:
    writer = HeartbeatWriter(tmp_path)
    for step in range(1, 200):
        writer.submit(beat(step))
    assert writer.flush(timeout_s=10)
    written = Heartbeat.model_validate_json(heartbeat_path(tmp_path, 3).read_text())
    assert written.step == 199
    writer.submit(beat(200, phase="done"))
    writer.close()
    final = Heartbeat.model_validate_json(heartbeat_path(tmp_path, 3).read_text())
    assert (final.step, final.phase) == (200, "done")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-00003.json"]  # no temp files left


def test_unwritable_directory_is_logged_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    writer = HeartbeatWriter(blocker / "heartbeats")
    writer.submit(beat(1))
    assert writer.flush(timeout_s=10)
    writer.close()


def test_between_steps_the_writer_rewrites_the_beat_as_a_sign_of_life(tmp_path: Path) -> None:
    """A training thread blocked in a collective leaves its step's `time` alone, while the
    writer keeps refreshing `alive_at` (every tenth of the hang timeout here): the rank waits,
    it is not the one that stopped. After `close` nothing beats any more."""
    writer = HeartbeatWriter(tmp_path)
    writer.submit(beat(7).model_copy(update={"hang_timeout_s": 1.0}))
    assert writer.flush(timeout_s=10)
    first = Heartbeat.model_validate_json(heartbeat_path(tmp_path, 3).read_text())
    assert first.alive_at is not None and first.alive_at >= first.time
    deadline = time.monotonic() + 30
    while (seen := Heartbeat.model_validate_json(heartbeat_path(tmp_path, 3).read_text())).alive_at == first.alive_at:
        assert time.monotonic() < deadline, "the writer never rewrote the beat"
        time.sleep(0.05)
    assert (seen.step, seen.time) == (7, first.time) and seen.alive_at > first.alive_at
    writer.close()
    assert not writer._thread.is_alive()  # a closed writer pulses no more


def test_the_writer_writes_at_most_once_per_interval_and_the_newest_beat_lands_unflushed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps far faster than the write interval: the writes follow the clock, not the steps,
    and the newest beat still reaches the file within an interval without a flush."""
    written: list[int] = []
    real = heartbeats.write_heartbeat
    monkeypatch.setattr(heartbeats, "write_heartbeat", lambda d, b: (written.append(b.step), real(d, b))[1])
    writer = HeartbeatWriter(tmp_path)
    writer.submit(beat(1))
    assert writer.flush(timeout_s=10)
    began = time.monotonic()
    for step in range(2, 2002):
        writer.submit(beat(step))
    deadline = time.monotonic() + 30
    while Heartbeat.model_validate_json(heartbeat_path(tmp_path, 3).read_text()).step != 2001:
        assert time.monotonic() < deadline, "the newest beat never reached the file"
        time.sleep(0.02)
    intervals = (time.monotonic() - began) / write_interval_s(beat(1).hang_timeout_s)
    writer.close()
    assert written[0] == 1 and written[-1] == 2001
    assert len(written) <= 2 + math.ceil(intervals), (len(written), intervals)  # not one per step


def test_a_beat_given_as_a_function_is_built_in_the_writer_thread_and_a_bad_one_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    built_in: list[str] = []

    def make() -> Heartbeat:
        built_in.append(threading.current_thread().name)
        return beat(5)

    def broken() -> Heartbeat:
        return beat(-1)  # out of range: pydantic refuses it, in the writer thread

    writer = HeartbeatWriter(tmp_path)
    writer.submit(make)
    assert writer.flush(timeout_s=10)
    assert built_in == ["trainyard-heartbeat"]
    assert Heartbeat.model_validate_json(heartbeat_path(tmp_path, 3).read_text()).step == 5
    writer.submit(broken)
    assert writer.flush(timeout_s=10)  # given up on, not raised into training
    assert "could not write heartbeat" in caplog.text
    writer.submit(beat(6))
    writer.close()
    assert Heartbeat.model_validate_json(heartbeat_path(tmp_path, 3).read_text()).step == 6


@pytest.mark.parametrize("timeout_s", [1.0, 10.0, 120.0, 600.0, 86400.0])
def test_a_beat_waits_for_the_writer_at_most_a_twentieth_of_the_hang_timeout(timeout_s: float) -> None:
    interval = write_interval_s(timeout_s)
    assert 0 < interval <= min(WRITE_EVERY_S, timeout_s / 20, pulse_interval_s(timeout_s) / 2)
    assert interval == min(WRITE_EVERY_S, pulse_interval_s(timeout_s) / 2)
