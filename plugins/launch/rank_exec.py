"""Per-rank wrapper: torchrun starts this instead of the user's script (stdlib and the
stdlib-only `processes.py` and `plugins/files.py`: it runs once per rank and must start fast,
so it writes plain JSON that the launcher validates with `trainyard.plugins.run.records.RankRecord`).

It runs the entrypoint as a child, with stdout/stderr in `<run_dir>/ranks/rank-NNNNN.log`,
and records in `<run_dir>/ranks/rank-NNNNN.json` the pids, the process group and — when the
child ends — its exit code (negative = killed by that signal), so any process can later tell
which rank failed and how, even after torchrun and the launcher are gone. It finally exits the
way the child did, so torchrun sees the real outcome.

The fast path is for crashes only (DESIGN §5). torchrun restarts the group after *any* non-zero
exit, but a diverged, corrupt-checkpoint, OOM or preempted exit needs the control plane
(a rollback, a fall-back, a re-plan, a requeue), and a blind restart would hide it: rerun from
the newest checkpoint, a NaN or an OOM may not come back. So after an in-place restart the
wrapper looks at how the previous incarnation ended (`exits.jsonl`): when its first failure was
one of the worker's own exit codes, it does not start the script and exits with that code again
(recorded with `"replayed": true`, which the control plane does not count as a restart).

While the child runs, the wrapper also stands in for the heartbeats a plain script never
writes (`activity`: the rank's CPU time and I/O date its heartbeat until the script writes one
of its own), so a plain script's hang is seen like a managed one's.

Signals: torchrun and the launcher signal the rank's whole process group, which holds this
wrapper and the child, so the child already gets every SIGTERM; the wrapper only survives them
(to record the exit code) and never forwards — a duplicate SIGTERM can kill a Python process
that is already exiting (CPython resets handlers to SIG_DFL during finalisation), turning a
clean emergency-checkpoint exit into "killed by SIGTERM". The exception is a child forked by
the attempt's warm rank starter (`rank_zygote`, named by `TRAINYARD_RANK_ZYGOTE`): it lives in
a session of its own, so the wrapper passes each of those signals on to it, once.

Usage (by the launcher): `torchrun … -m trainyard.plugins.launch.rank_exec --run-dir DIR [--stdout] -- script.py args…`.
`--stdout` (the Kubernetes pods): the child writes to this process's stdout/stderr, i.e. the
container's log, instead of `ranks/rank-NNNNN.log`; the records are written the same way, and
the pod hands `exits.jsonl` to the control plane as its termination message.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainyard.plugins.files import write_atomic
from trainyard.plugins.launch import activity, rank_zygote
from trainyard.plugins.run.processes import start_ticks, zombie_exit_code

CONTROL_PLANE_CODES = frozenset({42, 43, 44, 45, 46})
"""`trainyard.plugins.run.exit_codes`' DIVERGED, PREEMPTED, PREEMPTED_NO_CHECKPOINT, CHECKPOINT_CORRUPT, OOM
(copied: this wrapper imports nothing heavy; a unit test holds the two in step)."""

SURVIVED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def rank_exec_args(run_dir: str | os.PathLike[str], entry: str, args: Sequence[str] = (), *,
                   stdout: bool = False) -> list[str]:
    """What follows torchrun's own options so that every rank runs `entry args` under this
    wrapper (see Usage): for the local launcher's agents, the Volcano pods (`stdout`) and the
    tests' torchrun jobs alike."""
    return ["-m", "trainyard.plugins.launch.rank_exec", "--run-dir", os.fspath(run_dir),
            *(["--stdout"] if stdout else []), "--", entry, *args]


def record_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "ranks" / f"rank-{rank:05d}.json"


def log_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "ranks" / f"rank-{rank:05d}.log"


def _entry(argv: list[str]) -> tuple[str, bool, list[str]]:
    """The entrypoint, whether it is a module (`python -m`), and its arguments."""
    if not argv:
        raise SystemExit("rank_exec: no entrypoint given after '--'")
    entry, *args = argv
    return entry, rank_zygote.is_module(entry), args


def _command(entry: str, module: bool, args: list[str]) -> list[str]:
    """`python -u [-m] entry args…`, run by `loopback.main`: a store it hosts for peers told a
    loopback address listens there only."""
    return [sys.executable, "-u", "-m", "trainyard.plugins.launch.loopback", *(["-m"] if module else []), entry, *args]


class ForkedChild:
    """A rank the attempt's zygote forked (`rank_zygote`): what this wrapper needs of a `Popen`.

    The zygote reports the exit code, but it may be busy importing when the child ends; so
    the end is seen here, from a pidfd, and the code read from the zombie's `/proc` entry
    while the zygote has not reaped it yet — failures are then timed and told apart (which
    rank failed first) as promptly as for a plain child."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn, self.pid = conn, pid
        self.ticks = start_ticks(pid)
        self.ended_at: float | None = None

    def wait(self) -> int:
        try:
            pidfd: int | None = os.pidfd_open(self.pid)
        except OSError:  # already reaped: the zygote's report is on its way
            pidfd, self.ended_at = None, time.time()
        try:
            while True:
                ready, _, _ = select.select([self.conn, *([pidfd] if pidfd is not None else [])], [], [])
                if pidfd is not None and pidfd in ready:
                    self.ended_at = time.time()
                    code = zombie_exit_code(self.pid, self.ticks)
                    if code is not None:
                        return code
                    os.close(pidfd)
                    pidfd = None
                if self.conn in ready:
                    data = self.conn.recv(4096)
                    if not data:  # the zygote is gone, and PR_SET_PDEATHSIG took the child with it
                        return -signal.SIGKILL
                    message = json.loads(data)
                    if "exit" in message:
                        return int(message["exit"])
        finally:
            if pidfd is not None:
                os.close(pidfd)


def start_forked(entry: str, module: bool, args: list[str], stdio: list[int], *,
                 env: Mapping[str, str] | None = None, cwd: str | None = None) -> ForkedChild | None:
    """Ask the attempt's zygote (the one `env`, by default this process's environment, names)
    for the process, run in `cwd` (default: here); None when there is none or it does not answer
    (the caller then starts a plain child)."""
    env = dict(os.environ if env is None else env)
    name = env.get(rank_zygote.ADDRESS_ENV)
    if not name:
        return None
    request = rank_zygote.Request(entry=entry, module=module, args=args, env=env, cwd=cwd or os.getcwd())
    answer = rank_zygote.ask(name, request, stdio)
    return ForkedChild(*answer) if answer is not None else None


def replayed_exit(run_dir: Path, restart: int) -> int | None:
    """The worker exit code to hand back at once instead of running the script again: the
    first failure of incarnation `restart - 1`, when it is a control-plane code."""
    if restart == 0:
        return None
    previous = []
    try:
        lines = (run_dir / "exits.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:  # a line cut short by a crash mid-write
            continue
        if e.get("restart") == restart - 1 and e.get("exit_code") not in (None, 0):
            previous.append(e)
    if not previous:
        return None
    first = min(previous, key=lambda e: e.get("ended_at") or 0.0)
    code = first.get("exit_code")
    return code if code in CONTROL_PLANE_CODES else None


def _start(entry: str, module: bool, args: list[str], command: list[str],
           out: int | None) -> subprocess.Popen[bytes] | ForkedChild:
    """The rank, forked by the attempt's zygote when there is one, else a plain child; its
    output goes to `out`, or to this process's own stdout/stderr when None."""
    with open(os.devnull, "rb") as devnull:
        forked = start_forked(entry, module, args, [devnull.fileno(), *([out, out] if out is not None else [1, 2])])
    if forked is not None:
        return forked
    if out is None:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL)
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--run-dir" or "--" not in argv or argv[2:argv.index("--")] not in ([], ["--stdout"]):
        raise SystemExit("usage: rank_exec --run-dir DIR [--stdout] -- ENTRYPOINT [ARGS…]")
    run_dir = Path(argv[1])
    to_stdout = "--stdout" in argv[2:argv.index("--")]
    entry, module, args = _entry(argv[argv.index("--") + 1:])
    command = _command(entry, module, args)
    rank = int(os.environ.get("RANK", "0"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    path = record_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "node": os.environ.get("TRAINYARD_NODE", ""), "restart": restart,
        "pid": os.getpid(), "pgid": os.getpgid(0), "started_at": time.time(),
    }
    replay = replayed_exit(run_dir, restart)
    if replay is not None:
        record.update(exit_code=replay, ended_at=time.time(), replayed=True)
        write_atomic(path, json.dumps(record))
        with (run_dir / "exits.jsonl").open("a") as history:
            history.write(json.dumps(record) + "\n")
        with log_path(run_dir, rank).open("ab") as out:
            out.write(f"=== rank {rank} restart {restart}: not started; the previous incarnation "
                      f"exited {replay}, a case for the control plane\n".encode())
        sys.exit(replay)
    banner = f"=== rank {rank} restart {restart} {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(command[2:])}\n"
    if to_stdout:
        print(banner, end="", flush=True)
        child = _start(entry, module, args, command, None)
    else:
        with log_path(run_dir, rank).open("ab") as out:
            out.write(banner.encode())
            out.flush()
            child = _start(entry, module, args, command, out.fileno())
    record.update(child_pid=child.pid, child_start_ticks=start_ticks(child.pid),
                  forked=isinstance(child, ForkedChild))
    write_atomic(path, json.dumps(record))

    forwarded: set[int] = set()

    def forward_once(sig: int, _frame: object) -> None:
        if sig not in forwarded:
            forwarded.add(sig)
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, sig)

    for sig in SURVIVED:  # a forked child is not in this group, so it hears them only from here
        signal.signal(sig, forward_once if isinstance(child, ForkedChild) else lambda *_: None)
    watching = activity.start(child.pid, os.environ, rank, restart)  # a plain script's hang watch
    code = child.wait()
    if watching is not None:
        watching.set()
    record.update(exit_code=code, ended_at=getattr(child, "ended_at", None) or time.time())
    write_atomic(path, json.dumps(record))
    with (run_dir / "exits.jsonl").open("a") as history:
        history.write(json.dumps(record) + "\n")
    if code < 0:  # die of the same signal, so torchrun reports it as such
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
        sys.exit(128 - code)
    sys.exit(code)


if __name__ == "__main__":
    main()
