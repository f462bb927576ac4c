"""The heartbeat writer thread: the newest beat lands on disk, atomically, without the training
thread waiting; `flush` waits for it; a bad directory never raises into training."""

from __future__ import annotations

import time
from pathlib import Path

from trainyard.plugins.run.heartbeat import Heartbeat, heartbeat_path
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
