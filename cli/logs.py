"""`trainyard logs JOB [--run R] [--attempt N] [--rank R] [--follow]`: a training run's output.

The attempt's processes are found through the launcher handle the job state keeps (the latest
run and its newest attempt by default); `--rank` shows that rank's own log, otherwise every
torchrun agent's. `--follow` keeps printing new lines until the attempt's processes end.
"""

from __future__ import annotations

import argparse
import time

EXIT_CODES: dict[int, str] = {1: "no such job, run or attempt, or the attempt was never launched"}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="a training run's logs (one rank, or every torchrun agent)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("job", metavar="JOB", help="job name (metadata.name of its spec)")
    p.add_argument("--run", default="", help="run id (default: the job's newest run)")
    p.add_argument("--attempt", type=int, default=None, help="attempt (default: the newest)")
    p.add_argument("--rank", type=int, default=None, help="one rank's log (default: the agents' output)")
    p.add_argument("--tail", type=int, default=200, help="lines to show first (default 200)")
    p.add_argument("--follow", action="store_true", help="keep printing new lines until the attempt ends")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainyard.cli.output import err_console
    from trainyard.config.settings import get_settings
    from trainyard.plugins.attempt.launchers import Runtime, launcher_for
    from trainyard.plugins.state.jobs import RunNotFound, open_job_state

    state = open_job_state(get_settings().state_db)
    try:
        info = state.get_run(args.job, args.run)
    except RunNotFound as e:
        err_console.print(f"trainyard logs: {e}")
        return 1
    attempts = [a for a in state.attempts(args.job, info.run) if args.attempt in (None, a.attempt)]
    handle = attempts[-1].run_handle if attempts else None
    if handle is None:
        what = f"attempt {args.attempt}" if args.attempt is not None else "any attempt"
        err_console.print(f"trainyard logs: run {info.run} of {args.job} has no launched {what}")
        return 1
    launcher = launcher_for(handle, Runtime(get_settings()))
    try:
        text = launcher.logs(handle, rank=args.rank, tail=args.tail)
    except ValueError as e:
        err_console.print(f"trainyard logs: {e}")
        return 2
    print(text, flush=True)
    while args.follow:
        time.sleep(1.0)
        newer = launcher.logs(handle, rank=args.rank, tail=args.tail)
        fresh = _after(text, newer)
        if fresh:
            print(fresh, flush=True)
            text = newer
        if launcher.poll(handle).finished:
            return 0
    return 0


def _after(old: str, new: str) -> str:
    """The lines of `new` past the end of `old` (both are tails of the same growing file)."""
    if not old:
        return new
    last = old.splitlines()[-1]
    lines = new.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i] == last:
            return "\n".join(lines[i + 1:])
    return new
