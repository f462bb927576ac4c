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
import time
from collections.abc import Callable, Iterable, Iterator
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
    or carrying it in their environment (the ranks, the node agents). What the checks count, not
    what to end: a user's shell that exported `TRAINYARD_HOME` is one of them (`make down` ends
    `trainyard.cli.stack.Stack.leftovers` instead)."""
    home = home.resolve()
    marked = set(marked_processes("TRAINYARD_HOME", str(home)))
    return sorted(pid for pid in _all_pids() if pid != os.getpid() and is_alive(pid)
                  and (pid in marked or cwd(pid) == home))


def children(pid: int) -> list[int]:
    """Live processes whose parent is `pid`."""
    return [child for child in _all_pids() if (fields := stat_fields(child))
            and fields[0] not in ("Z", "X") and int(fields[1]) == pid]


def ignores(pid: int, sig: signal.Signals) -> bool:
    """Whether the process ignores `sig` (`SigIgn` in /proc/PID/status); False when it is gone."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def end_all(find: Callable[[], list[int]], *, grace_s: float, kill_wait_s: float = 10.0,
            ask: bool = True) -> list[int]:
    """End every process `find` names, and those it names meanwhile (a rank starter forking, an
    agent restarting its workers): SIGTERM each once, wait up to `grace_s` while one lives that
    heeded SIGTERM when it got it (a rank's emergency checkpoint, during which it may ignore
    repeats; a rank starter ignores SIGTERM from the start, and goes once its ranks have), then
    SIGKILL what is left until `find` names none (up to `kill_wait_s`). Not `ask`: no SIGTERM,
    only the wait, for processes that end by themselves once what they watch has (a follower
    concluding its attempt). Returns every pid found."""
    signalled: set[int] = set()
    heeding: set[int] = set()
    deadline = time.monotonic() + grace_s
    while (left := find()) and time.monotonic() < deadline:
        new = [pid for pid in left if pid not in signalled]
        heeding.update(pid for pid in new if not ask or not ignores(pid, signal.SIGTERM))
        if ask:
            signal_pids(new, signal.SIGTERM)
        signalled.update(new)
        if not heeding.intersection(left):
            break
        time.sleep(0.1)
    deadline = time.monotonic() + kill_wait_s
    while (left := find()) and time.monotonic() < deadline:
        signal_pids(left, signal.SIGKILL)
        signalled.update(left)
        for pid in left:
            reap(pid)
        time.sleep(0.05)
    return sorted(signalled)


def marked_under(name: str, folder: Path) -> list[int]:
    """Live processes whose environment names `folder` or a path below it in `name` (this
    user's only): every process of every run whose run folder is under `folder`."""
    prefix, me = f"{name}=".encode(), os.getpid()
    roots = {str(folder).rstrip("/").encode(), str(folder.resolve()).encode()}  # as written, or resolved
    found = []
    for pid in _all_pids():
        if pid == me:
            continue
        values = [e[len(prefix):] for e in environ_entries(pid) or [] if e.startswith(prefix)]
        if any(v == root or v.startswith(root + b"/") for v in values for root in roots) and is_alive(pid):
            found.append(pid)
    return found


def started_in(folder: Path) -> list[int]:
    """Live processes whose working folder is `folder` (not this one)."""
    folder = folder.resolve()
    return [pid for pid in _all_pids() if pid != os.getpid() and cwd(pid) == folder and is_alive(pid)]


def ancestors() -> set[int]:
    """This process's parent, its parent's parent, … up to init: what a sweep must never end
    (the shell or `make` that asked for it)."""
    found, pid = set(), os.getppid()
    while pid > 1 and pid not in found:
        found.add(pid)
        fields = stat_fields(pid)
        pid = int(fields[1]) if fields else 0
    return found


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


def command_line(pid: int) -> list[str] | None:
    """The process's arguments, or None when it is gone (or not ours to read)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="surrogateescape") for a in raw.split(b"\0")[:-1]]


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
