"""The files a run's processes write for one another: one atomic writer, pydantic models on the
reader side, and the real per-rank wrapper's output parsed by its model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.support.procs import REPO_ROOT
from trainyard.plugins.files import write_atomic
from trainyard.plugins.run.records import (
    AgentExit,
    DivergenceRecord,
    RankRecord,
    read_exits,
    read_model,
    read_rank_records,
)


def test_write_atomic_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "f.json"
    write_atomic(path, "one")
    write_atomic(path, b"two", fsync=True)
    assert path.read_text() == "two" and os.listdir(path.parent) == ["f.json"]
    with pytest.raises(TypeError):  # fails while writing: the old content stays, no temp is left
        write_atomic(path, 3)  # type: ignore[arg-type]
    assert path.read_text() == "two" and os.listdir(path.parent) == ["f.json"]


def test_the_real_rank_wrapper_writes_what_the_model_reads(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys; print('hello'); sys.exit(3)\n")
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "0", "TRAINYARD_NODE": "local-0",
           "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "trainyard.plugins.launch.rank_exec", "--run-dir", str(tmp_path),
                           "--", str(script)], env=env, cwd=REPO_ROOT, timeout=60, check=False)
    assert done.returncode == 3
    record = read_rank_records(tmp_path)[1]  # extra fields are forbidden: no drift goes unseen
    assert (record.rank, record.node, record.exit_code, record.restart) == (1, "local-0", 3, 0)
    assert record.child_pid and record.pgid and record.ended_at and record.ended_at >= record.started_at
    assert list(read_exits(tmp_path)) == [record]


def test_readers_fail_loudly_on_a_changed_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.exit.json"
    assert read_model(path, AgentExit) is None  # not written yet
    AgentExit(exit_code=1, failures={"3": -9}, error="ChildFailedError: x", ended_at=1.0, pid=7).write(path)
    assert read_model(path, AgentExit) == AgentExit(exit_code=1, failures={"3": -9}, error="ChildFailedError: x",
                                                    ended_at=1.0, pid=7)
    path.write_text('{"exit_code": 1, "ended_at": 1.0, "pid": 7, "exitcode": 2}')
    with pytest.raises(ValidationError, match="exitcode"):
        read_model(path, AgentExit)
    with pytest.raises(ValidationError, match="pgid"):
        RankRecord.model_validate_json('{"rank": 0, "pid": 1, "started_at": 0}')


def test_the_divergence_record_keeps_non_finite_losses(tmp_path: Path) -> None:
    record = DivergenceRecord(job="j", attempt=2, step=9, onset_step=6, reason="non_finite", loss=repr(float("nan")),
                              baseline=None, last_checkpoint_step=4, message="loss is nan at step 9")
    record.write(tmp_path / "diverged.json")
    assert read_model(tmp_path / "diverged.json", DivergenceRecord) == record


def _rank(tmp_path: Path, script: Path, restart: int) -> int:
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "TORCHELASTIC_RESTART_COUNT": str(restart),
           "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "trainyard.plugins.launch.rank_exec", "--run-dir", str(tmp_path),
                           "--", str(script)], env=env, cwd=REPO_ROOT, timeout=60, check=False).returncode


def test_an_in_place_restart_after_a_control_plane_exit_replays_it_without_running_the_script(
        tmp_path: Path) -> None:
    from trainyard.plugins.launch.rank_exec import CONTROL_PLANE_CODES
    from trainyard.plugins.run import exit_codes

    assert {exit_codes.DIVERGED, exit_codes.PREEMPTED, exit_codes.OOM,
                                   exit_codes.PREEMPTED_NO_CHECKPOINT, exit_codes.CHECKPOINT_CORRUPT} == CONTROL_PLANE_CODES
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"import pathlib, sys; pathlib.Path({str(marker)!r}).touch(); sys.exit(42)\n")
    assert _rank(tmp_path, script, 0) == 42 and marker.exists()
    marker.unlink()
    assert _rank(tmp_path, script, 1) == 42 and not marker.exists()  # diverged: not run again
    replayed = list(read_exits(tmp_path))[-1]
    assert (replayed.restart, replayed.exit_code, replayed.replayed) == (1, 42, True)


def test_an_in_place_restart_after_a_crash_runs_the_script_again(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"import pathlib, sys; pathlib.Path({str(marker)!r}).touch(); sys.exit(1)\n")
    assert _rank(tmp_path, script, 0) == 1
    marker.unlink()
    assert _rank(tmp_path, script, 1) == 1 and marker.exists()
    assert [e.replayed for e in read_exits(tmp_path)] == [False, False]
