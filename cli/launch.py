"""`trainyard launch SPEC`: run one attempt of a job without Airflow — the attempt engine's steps
(`plugins/attempt/steps.py`) in this process, exactly as the DAG's tasks run them: validated for
this deployment, planned, placed and reserved (cordoned nodes left out, lower-priority gangs
preempted), launched on the cluster's launcher (`TRAINYARD_CLUSTER`), watched until it ends,
concluded (the recovery engine's verdict, recorded in the job state like the DAG's), released,
and its MLflow run closed. This module only presents: progress, the summary, the verdict.

Exits with the job's status: 0 completed; the failing rank's exit code otherwise (128+N for a
rank killed by signal N); 124 when a rank hung and the gang was stopped. One attempt: what the
control plane would do next is printed (the DAG carries it out; `--run R --attempt N+1` does it
here). `--detach` prints the RunHandle JSON and returns at once; a follower process (this command
with `--attach`, its output in `<run folder>/follower.log`) watches, concludes and releases as an
attached launch does. Ctrl-C stops the job (SIGTERM, then SIGKILL after `--grace-s`).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.plugins.run import exit_codes

if TYPE_CHECKING:
    from collections.abc import Iterator

    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.attempt.steps import Concluded, Started
    from trainyard.plugins.run.model import RunStatus

EXIT_HANG = 124
"""A rank hung and the gang was stopped (as `timeout(1)` says "timed out")."""
STARTED_FILE = "started.json"
"""Beside the run's `handle.json`: what the follower of a detached launch continues from."""

EXIT_CODES: dict[int, str] = {
    0: "the job completed",
    1: "the spec has errors, no plan fits, the gang cannot be placed or reserved, or the launch failed",
    **{code: f"{meaning} (the failing rank's own code)" for code, meaning in exit_codes.MEANINGS.items() if code},
    EXIT_HANG: "a rank hung (no step progress for the spec's hangTimeout): the gang was stopped",
    137: "a rank was killed by signal N gives 128+N: 137 SIGKILL (e.g. the kernel's OOM killer), 143 SIGTERM",
}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help:
the worker's own codes come from `plugins/run/exit_codes.py`, their one home."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("launch", help="run one attempt of a job on the configured cluster (no Airflow)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--local", action="store_true",
                   help="accepted for scripts that pass it: the cluster is TRAINYARD_CLUSTER's (local by default)")
    p.add_argument("spec", type=Path, metavar="SPEC", help="TrainingJob spec (YAML)")
    p.add_argument("--run", default="", metavar="RUN",
                   help="the training run to launch an attempt of (default: a new run)")
    p.add_argument("--attempt", type=int, default=0, help="attempt number (default 0)")
    p.add_argument("--resume-from", default="", metavar="URI", help="checkpoint manifest to restore")
    p.add_argument("--detach", action="store_true",
                   help="print the RunHandle JSON and return; a follower process finishes the launch")
    p.add_argument("--attach", type=Path, default=None, metavar="STARTED", help=argparse.SUPPRESS)
    p.add_argument("--offline", action="store_true",
                   help="skip the checks that need the world (memory fit, dataset in the store, quota): "
                        "for a script that reads no platform dataset")
    p.add_argument("--grace-s", type=float, default=30.0, help="SIGTERM → SIGKILL grace on Ctrl-C or a stop")
    p.add_argument("--max-restarts", type=int, default=0, help="torchrun's in-place restarts (default 0)")
    p.add_argument("--timeout-s", type=float, default=None, help="stop the job after this long")
    p.add_argument("--mlflow-run-id", default="", metavar="ID",
                   help="continue this MLflow run (default: a new run for attempt 0, the run's own after)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from trainyard.cli.output import err_console, print_json
    from trainyard.config.runs import check_run_id, new_run_id
    from trainyard.plugins.attempt.conf import InvalidConf, check_resume_point
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.attempt.steps import InvalidJob, start_attempt
    from trainyard.plugins.errors import FatalError
    from trainyard.plugins.recovery.model import MAX_ATTEMPTS, AttemptConf

    runtime = Runtime(_settings())
    if args.attach is not None:  # the follower of a detached launch
        return _attach(args, runtime)
    if not 0 <= args.attempt <= MAX_ATTEMPTS:
        err_console.print(f"trainyard launch: error: --attempt {args.attempt}: give 0 to {MAX_ATTEMPTS}")
        return 2
    try:
        conf = AttemptConf(run=check_run_id(args.run) if args.run else new_run_id(), attempt=args.attempt,
                           resume_from=args.resume_from, mlflow_run_id=args.mlflow_run_id)
    except ValueError as e:
        err_console.print(f"trainyard launch: error: {escape(str(e))}")
        return 2
    if args.resume_from:  # another job's checkpoint is refused before anything is placed or started
        from trainyard.config.loader import load_spec_file

        try:
            check_resume_point(args.resume_from, load_spec_file(args.spec), runtime.settings.object_store)
        except (ValueError, FileNotFoundError, InvalidConf) as e:
            err_console.print(f"trainyard launch: error: --resume-from: {escape(str(e))}")
            return 2
    try:
        started = start_attempt(args.spec, conf, runtime, max_restarts=args.max_restarts, offline=args.offline)
    except FileNotFoundError as e:
        err_console.print(f"trainyard launch: error: {escape(str(e))}")
        return 2
    except InvalidJob as e:
        err_console.print(f"[red]invalid[/]: {escape(str(e))}")
        return 1
    except FatalError as e:  # nothing fits, nowhere to place it, the launcher refused
        err_console.print(f"[red]not launched[/]: {escape(str(e))}")
        return 1
    _started(started)
    if args.detach:
        follower = _start_follower(args, started)
        print_json(started.launched.handle.model_dump(mode="json"))
        err_console.print(f"detached; logs under {started.launched.handle.run_dir}; follower pid {follower} "
                          f"({started.launched.handle.run_dir}/follower.log) concludes the attempt, releases "
                          "the reservation and closes the MLflow run when the job ends")
        return 0
    return _follow(args, started, runtime)


def _settings() -> Any:
    from trainyard.config.settings import get_settings

    return get_settings()


def _started(started: Started) -> None:
    from trainyard.cli.output import err_console

    err_console.print(f"plan: {started.planned.plan.describe()} ({started.planned.source})")
    err_console.print(f"run {started.opened.conf.run} placed: "
                      + ", ".join(f"{n.name}×{n.slots}" for n in started.placed.placement.nodes)
                      + (f"; excluded {', '.join(started.placed.excluded)}" if started.placed.excluded else ""))
    err_console.print(f"MLflow run {started.launched.mlflow_run_id}")


def _start_follower(args: argparse.Namespace, started: Started) -> int:
    """This command again, with `--attach`, in its own session: it outlives the caller."""
    import subprocess
    import sys

    run_dir = Path(started.launched.handle.run_dir)
    (run_dir / STARTED_FILE).write_text(started.to_json())
    argv = [sys.executable, "-m", "trainyard.cli.main", "launch", str(args.spec.resolve()), "--attach",
            str(run_dir / STARTED_FILE), "--grace-s", str(args.grace_s)]
    if args.timeout_s is not None:
        argv += ["--timeout-s", str(args.timeout_s)]
    with open(run_dir / "follower.log", "ab") as log:  # same cwd and environment: same home
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc.pid


def _attach(args: argparse.Namespace, runtime: Runtime) -> int:
    from trainyard.plugins.attempt.steps import Started

    return _follow(args, Started.from_json(args.attach.read_text()), runtime)


def _follow(args: argparse.Namespace, started: Started, runtime: Runtime) -> int:
    """Until the attempt is over; then the summary, the verdict and the exit status."""
    from rich.live import Live

    from trainyard.cli.output import err_console
    from trainyard.plugins.attempt.steps import follow_attempt

    handle, began = started.launched.handle, time.monotonic()
    try:
        with _system_metrics(started.launched.mlflow_run_id, runtime), \
                Live(console=err_console, refresh_per_second=2, transient=True) as live:
            step, concluded = follow_attempt(
                started, runtime, timeout_s=args.timeout_s, grace_s=args.grace_s,
                on_status=lambda s: live.update(_progress(s, handle, time.monotonic() - began)))
    except KeyboardInterrupt:
        return _interrupted(args, started, runtime)
    if step.stop is not None and step.stop.reason == "timeout":
        err_console.print(f"[yellow]timeout after {args.timeout_s:g}s; stopping[/]")
    elif step.stop is not None and step.stop.reason == "hang":
        err_console.print(f"[red]hang[/]: {step.stop.detail}; the gang was stopped")
    _summary(step.status, handle, runtime)
    _verdict(concluded, started)
    return EXIT_HANG if step.stop is not None and step.stop.reason == "hang" else exit_status(step.status)


def _interrupted(args: argparse.Namespace, started: Started, runtime: Runtime) -> int:
    from trainyard.cli.output import err_console
    from trainyard.plugins.attempt.steps import close
    from trainyard.plugins.attempt.stop import stop_run
    from trainyard.plugins.state.jobs import open_job_state

    err_console.print(f"interrupted: stopping (grace {args.grace_s:g}s)…")
    stop_run(open_job_state(runtime.settings.state_db), started.opened.job.name, runtime,
             started.opened.conf.run, grace_s=args.grace_s, detail="Ctrl-C in trainyard launch")
    close(started.opened, started.launched.mlflow_run_id, runtime, status="cancelled")
    return 130


@contextlib.contextmanager
def _system_metrics(run_id: str, runtime: Runtime) -> Iterator[None]:
    from trainyard.plugins.tracking.system_metrics import start_system_metrics

    monitor = start_system_metrics(run_id, tracking_uri=runtime.settings.mlflow_tracking_uri) if run_id else None
    try:
        yield
    finally:
        if monitor is not None:
            monitor.finish()


def _verdict(concluded: Concluded | None, started: Started) -> None:
    """How the recovery engine read the attempt, and what the control plane does next."""
    from rich.markup import escape

    from trainyard.cli.output import console

    if concluded is None or concluded.report.outcome == "completed":
        return
    console.print(f"verdict: [bold]{concluded.report.outcome}[/] — {escape(concluded.report.reason)}")
    console.print(f"the control plane would {concluded.action.kind}: {escape(concluded.action.reason)}")
    if concluded.next_conf is not None:
        console.print(f"(trainyard launch runs one attempt: `trainyard launch {started.opened.job.name}.yaml "
                      f"--run {started.opened.conf.run} --attempt {concluded.next_conf.attempt}` carries it out)")


def _progress(status: RunStatus, handle: Any, elapsed: float) -> Any:
    from rich.table import Table

    from trainyard.cli.output import format_age

    table = Table(title=f"{handle.job} attempt {handle.attempt} — {status.state} ({elapsed:.0f}s): "
                        f"{status.message}", title_justify="left")
    for column in ("rank", "node", "step", "heartbeat age", "exit"):
        table.add_column(column)
    for r in status.ranks:
        age = format_age(r.heartbeat_age_s)
        table.add_row(str(r.rank), r.node or "-", "-" if r.step is None else str(r.step),
                      age + (" (hung)" if r.hung else ""), r.outcome or "")
    return table


def _summary(status: RunStatus, handle: Any, runtime: Runtime) -> None:
    from rich.markup import escape

    from trainyard.cli.output import console
    from trainyard.plugins.attempt.launchers import launcher_for

    style = "green" if status.succeeded else "red"
    console.print(f"[{style}]{status.state}[/]: {escape(status.message)}")
    console.print(f"logs: {handle.run_dir}/ranks/rank-NNNNN.log")
    if status.failed_rank is not None:
        console.print(f"--- last lines of rank {status.failed_rank} ---")
        console.print(escape(launcher_for(handle, runtime).logs(handle, rank=status.failed_rank, tail=20)))


def exit_status(status: RunStatus | None) -> int:
    """0 on success; the failing rank's exit code (128+N for signal N) otherwise."""
    if status is None:
        return 1
    if status.succeeded:
        return 0
    code = status.exit_code
    if code is None or code == 0:
        return 1
    return 128 - code if code < 0 else min(code, 255)
