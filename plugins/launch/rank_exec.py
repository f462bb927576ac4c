"""Per-rank wrapper: torchrun starts this instead of the user's script (stdlib and the
stdlib-only `processes.py` and `plugins/files.py`: it runs once per rank and must start fast,
so it writes plain JSON that the launcher validates with `plugins.launch.files.RankRecord`).

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

Signals: torchrun and the launcher signal the rank's whole process group, which holds this
wrapper and the child, so the child already gets every SIGTERM; the wrapper only survives them
(to record the exit code) and never forwards — a duplicate SIGTERM can kill a Python process
that is already exiting (CPython resets handlers to SIG_DFL during finalisation), turning a
clean emergency-checkpoint exit into "killed by SIGTERM".

Usage (by the launcher): `torchrun … -m plugins.launch.rank_exec --run-dir DIR [--stdout] -- script.py args…`.
`--stdout` (the Kubernetes pods): the child writes to this process's stdout/stderr, i.e. the
container's log, instead of `ranks/rank-NNNNN.log`; the records are written the same way, and
the pod hands `exits.jsonl` to the control plane as its termination message.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from plugins.files import write_atomic
from plugins.launch.processes import start_ticks

CONTROL_PLANE_CODES = frozenset({42, 43, 44, 45, 46})
"""`worker.exit_codes`' DIVERGED, PREEMPTED, PREEMPTED_NO_CHECKPOINT, CHECKPOINT_CORRUPT, OOM
(copied: this wrapper imports nothing heavy; a unit test holds the two in step)."""

SURVIVED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def record_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "ranks" / f"rank-{rank:05d}.json"


def log_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "ranks" / f"rank-{rank:05d}.log"


def _command(argv: list[str]) -> list[str]:
    if not argv:
        raise SystemExit("rank_exec: no entrypoint given after '--'")
    entry, *args = argv
    if entry.endswith(".py") or os.sep in entry:
        return [sys.executable, "-u", entry, *args]
    return [sys.executable, "-u", "-m", entry, *args]


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


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--run-dir" or "--" not in argv or argv[2:argv.index("--")] not in ([], ["--stdout"]):
        raise SystemExit("usage: rank_exec --run-dir DIR [--stdout] -- ENTRYPOINT [ARGS…]")
    run_dir = Path(argv[1])
    to_stdout = "--stdout" in argv[2:argv.index("--")]
    command = _command(argv[argv.index("--") + 1:])
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
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    else:
        with log_path(run_dir, rank).open("ab") as out:
            out.write(banner.encode())
            out.flush()
            child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    record.update(child_pid=child.pid, child_start_ticks=start_ticks(child.pid))
    write_atomic(path, json.dumps(record))

    for sig in SURVIVED:
        signal.signal(sig, lambda *_: None)
    code = child.wait()
    record.update(exit_code=code, ended_at=time.time())
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
