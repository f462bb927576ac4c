"""`Stack.stop` ends a part's whole process group — what the part started included, even after
the part itself crashed — touches nothing of another home, and does not wait on a part that
has exited."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.support.waiting import wait_for
from trainyard.cli.stack import Stack, _alive
from trainyard.plugins.run import processes


def _state(pid: int) -> str:
    fields = processes.stat_fields(pid)
    assert fields is not None
    return fields[0]


def _part(stack: Stack, part: str, script: str, home: Path | None = None) -> subprocess.Popen[bytes]:
    """A stand-in for a part of the stack, in its own session, started in its home as the stack
    starts its parts, and recorded as the stack records it."""
    folder = home or stack.home
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True, cwd=folder)
    stack._pid_file(part).parent.mkdir(parents=True, exist_ok=True)
    stack._pid_file(part).write_text(str(proc.pid))
    return proc




def test_an_exited_unreaped_leader_is_not_alive() -> None:
    proc = subprocess.Popen(["sh", "-c", "exit 0"], start_new_session=True)
    wait_for(lambda: _state(proc.pid) == "Z", "the leader to exit", 30, poll_s=0.02)
    assert _state(proc.pid) == "Z"  # exited, not reaped: it still answers signals
    assert _alive([proc.pid]) == []


def test_stop_all_ends_every_named_part_and_forgets_its_pid(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    # a part that ignores SIGTERM is killed after the grace; one that obeys ends at once
    procs = {"scheduler": _part(stack, "scheduler", "trap '' TERM; sleep 300"),
             "triggerer": _part(stack, "triggerer", "sleep 300")}
    wait_for(lambda: all(stack.group(p) for p in procs), "the parts' groups", 30, poll_s=0.02)
    members = {part: stack.group(part) for part in procs}  # the shell, and what it started
    assert stack.stop_all(list(procs), grace_s=1) == {part: len(pids) for part, pids in members.items()}
    for part, proc in procs.items():
        assert _alive([proc.pid, *members[part]]) == []
        assert stack.pid(part) is None and not stack._pid_file(part).exists()


def test_a_crashed_part_leaves_no_orphans_and_starting_it_again_ends_them_first(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    # the "scheduler" starts a worker that ignores SIGTERM (as LocalExecutor's workers do), in its group
    record = tmp_path / "worker.pid"
    leader = _part(stack, "scheduler", f"(trap '' TERM; exec sleep 300) & echo $! > {record}; wait")
    wait_for(lambda: record.exists() and record.read_text().strip(), "the record", 30, poll_s=0.02)
    worker = int(record.read_text())
    os.kill(leader.pid, signal.SIGKILL)  # the part crashes; its worker lives on
    leader.wait()
    assert stack.pid("scheduler") is None and stack.group("scheduler") == [worker]
    assert stack.stop_all(["scheduler"], grace_s=0.5) == {"scheduler": 1}  # `make down` ends it
    assert _alive([worker]) == []


def test_another_homes_processes_in_the_group_are_left_alone(tmp_path: Path) -> None:
    stack = Stack(tmp_path / "mine")
    other = _part(stack, "triggerer", "sleep 300", home=tmp_path / "theirs")
    try:
        assert stack.group("triggerer") == [] and stack.stop_all(["triggerer"], grace_s=0.5) == {"triggerer": 0}
        assert _alive([other.pid]) == [other.pid]
    finally:
        other.kill()
        other.wait()
