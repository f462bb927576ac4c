"""Process facts from `/proc` (Linux): liveness that survives pid reuse and zombies, process
groups, and the processes that carry a run's marker variable.

The launcher may be a different process from the one that started the job, so it cannot
`wait()` for it. `os.kill(pid, 0)` is not enough: it succeeds for zombies (an exited child
whose parent has not reaped it) and for an unrelated process that got a recycled pid. So a
process counts as alive when `/proc/<pid>/stat` exists, its state is not Z/X, and its start
time (field 22) matches the one recorded at launch.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path

PROC = Path("/proc")


def stat_fields(pid: int) -> list[str] | None:
    """Fields 3… of /proc/<pid>/stat (after the parenthesised command name)."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    end = raw.rfind(b")")
    return raw[end + 2:].decode("ascii", "replace").split()


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) the process has used so far, or None when it is gone."""
    fields = stat_fields(pid)
    if not fields or len(fields) <= 12:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_ticks(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def is_alive(pid: int | None, ticks: int | None = None) -> bool:
    if not pid:
        return False
    fields = stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


def zombie_exit_code(pid: int, ticks: int | None) -> int | None:
    """How a process that has ended but is not yet reaped ended (`/proc/<pid>/stat` field 52,
    a wait status; negative = killed by that signal), or None when it is running or gone."""
    fields = stat_fields(pid)
    if not fields or fields[0] != "Z" or len(fields) <= 49 or (ticks is not None and int(fields[19]) != ticks):
        return None
    return os.waitstatus_to_exitcode(int(fields[49]))


def reap(pid: int) -> None:
    """Collect an exited child's status if it is ours, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _all_pids() -> Iterator[int]:
    try:
        entries = os.listdir(PROC)
    except OSError:
        return
    for entry in entries:
        if entry.isdigit():
            yield int(entry)


def cwd(pid: int) -> Path | None:
    """The process's working folder, or None when it is gone (or not ours to read)."""
    try:
        return Path(os.readlink(PROC / str(pid) / "cwd"))
    except OSError:
        return None


def of_home(home: Path) -> list[int]:
    """Live processes of a Trainyard home: started in it (the stack's parts and their children)
    or carrying it in their environment (the ranks, the node agents)."""
    home = home.resolve()
    marked = set(marked_processes("TRAINYARD_HOME", str(home)))
    return sorted(pid for pid in _all_pids() if pid != os.getpid() and is_alive(pid)
                  and (pid in marked or cwd(pid) == home))


def group_members(pgids: Iterable[int]) -> list[int]:
    """Live (non-zombie) processes whose process group is one of `pgids`."""
    wanted = {g for g in pgids if g > 0}
    if not wanted:
        return []
    members = []
    for pid in _all_pids():
        fields = stat_fields(pid)
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) in wanted:
            members.append(pid)
    return members


def environ_entries(pid: int) -> list[bytes] | None:
    """The `NAME=value` entries of the process's environment as `/proc` shows it (what it was
    started with, or what it wrote over that block), or None when it is gone or not ours."""
    try:
        return (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None


def marked_processes(name: str, value: str) -> list[int]:
    """Live processes whose environment holds `name=value` (this user's only)."""
    needle = f"{name}={value}".encode()
    me = os.getpid()
    return [pid for pid in _all_pids()
            if pid != me and needle in (environ_entries(pid) or []) and is_alive(pid)]


def started_as(argv: list[str]) -> list[int]:
    """This user's live processes whose command line begins with `argv`."""
    prefix, me, uid = [a.encode() for a in argv], os.getpid(), os.getuid()
    found = []
    for pid in _all_pids():
        try:
            if pid == me or (PROC / str(pid)).stat().st_uid != uid:
                continue
            command = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if command[:len(prefix)] == prefix and is_alive(pid):
            found.append(pid)
    return found


def signal_groups(pgids: Iterable[int], sig: signal.Signals) -> None:
    for pgid in {g for g in pgids if g > 1}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def signal_pids(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in set(pids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
