"""`Stack.stop` ends a part's whole process group and does not wait on a part that has exited."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from cli.stack import Stack, _group_alive
from plugins.launch import processes


def _state(pid: int) -> str:
    fields = processes.stat_fields(pid)
    assert fields is not None
    return fields[0]


def test_an_exited_unreaped_leader_is_not_alive() -> None:
    proc = subprocess.Popen(["sh", "-c", "exit 0"], start_new_session=True)
    deadline = time.monotonic() + 30
    while _state(proc.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state(proc.pid) == "Z"  # exited, not reaped: it still answers signals
    assert not _group_alive(proc.pid)


def test_stop_all_ends_every_named_part_and_forgets_its_pid(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    parts = ["scheduler", "triggerer"]
    procs = {}
    for part in parts:
        # a part that ignores SIGTERM is killed after the grace; one that obeys ends at once
        script = "trap '' TERM; sleep 300" if part == "scheduler" else "sleep 300"
        procs[part] = subprocess.Popen(["sh", "-c", script], start_new_session=True)
        stack._pid_file(part).parent.mkdir(parents=True, exist_ok=True)
        stack._pid_file(part).write_text(str(procs[part].pid))
    stack.stop_all(parts, grace_s=1)
    for part in parts:
        assert not _group_alive(procs[part].pid)
        assert stack.pid(part) is None and not stack._pid_file(part).exists()
