"""`Stack.stop` ends a part's whole process group — what the part started included, even after
the part itself crashed — touches nothing of another home, and does not wait on a part that
has exited."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


def test_the_home_sweep_waits_for_what_heeds_sigterm_and_kills_what_ignores_it(tmp_path: Path) -> None:
    """`processes.end_all`, which `make down` runs over a crashed run's processes: a rank that
    takes its emergency checkpoint on SIGTERM (and ignores repeats meanwhile) finishes it; a rank
    starter, which ignores SIGTERM, is killed once nothing that heeded it is left."""
    done = tmp_path / "checkpointed"
    heeds = subprocess.Popen([sys.executable, "-c", (
        "import signal, time, pathlib\n"
        "def on_term(*_):\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"    time.sleep(0.5); pathlib.Path({str(done)!r}).write_text('1'); raise SystemExit(43)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n")], stdout=subprocess.PIPE, start_new_session=True)
    ignores = subprocess.Popen(["sh", "-c", "trap '' TERM; echo ready; exec sleep 300"], stdout=subprocess.PIPE,
                               start_new_session=True)
    for proc in (heeds, ignores):
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    pids = [heeds.pid, ignores.pid]
    assert processes.ignores(ignores.pid, signal.SIGTERM) and not processes.ignores(heeds.pid, signal.SIGTERM)
    signalled = processes.end_all(lambda: _alive(pids), grace_s=60)
    assert sorted(signalled) == sorted(pids)
    assert done.read_text() == "1"  # its SIGTERM handler ran to the end, not cut short by SIGKILL
    assert _alive(pids) == []  # the one that ignores SIGTERM too (the sweep reaped them: no exit codes here)


def test_a_run_is_found_by_its_folder_under_the_runs_folder(tmp_path: Path) -> None:
    runs = tmp_path / "home" / "runs"
    inside = subprocess.Popen(["sleep", "60"], env={"TRAINYARD_RUN_DIR": str(runs / "job" / "r1" / "0")})
    beside = subprocess.Popen(["sleep", "60"], env={"TRAINYARD_RUN_DIR": str(runs) + "-old/job/r1/0"})
    try:
        wait_for(lambda: processes.marked_under("TRAINYARD_RUN_DIR", runs) == [inside.pid], "the run's process",
                 30, poll_s=0.02)
        assert processes.marked_under("TRAINYARD_RUN_DIR", runs / "job" / "r1" / "0") == [inside.pid]
    finally:
        for proc in (inside, beside):
            proc.kill()
            proc.wait()
