"""`trainyard launch SPEC`: run a job on this machine without Airflow (for debugging).

Validates the spec, plans it (the advisor when available), places it on the local cluster and
reserves the devices in the platform state, starts one detached torchrun agent per node, then
shows progress until the job ends, releases the reservation and exits with the job's status
(0 completed; the failing rank's exit code otherwise, 128+N for a rank killed by signal N),
with the recovery engine's verdict on a failure and what the control plane would do about it.
`--detach` prints the RunHandle JSON and returns at once; the job keeps running, and a follower
process (this command with `--attach`, its output in `<run folder>/follower.log`) renews the
reservation, and when the job ends releases it and closes the MLflow run, as an attached launch
does. Ctrl-C stops the job (SIGTERM, then
SIGKILL after `--grace-s`). A rank that hangs (no step progress for `hangTimeout`) makes it
stop the gang the control plane's way and exit 124. Exit 1 also for an invalid spec or an
unschedulable job.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from plugins.launch.model import RunStatus

EXIT_HANG = 124
"""A rank hung and the gang was stopped (as `timeout(1)` says "timed out")."""
RENEW_EVERY_S = 30.0
ATTACHED_LEASE_S = 300.0
DETACHED_LEASE_S = 24 * 3600.0


EXIT_CODES: dict[int, str] = {
    0: "the job completed",
    1: "the spec has errors, no plan fits, the gang cannot be placed or reserved, or the launch failed",
    42: "a rank stopped because the loss diverged (the failing rank's own code, as for any code)",
    43: "a rank took an emergency checkpoint after SIGTERM and stopped (e.g. after --timeout-s)",
    44: "a rank stopped after SIGTERM without a checkpoint",
    124: "a rank hung (no step progress for the spec's hangTimeout): the gang was stopped",
    137: "a rank was killed by signal N gives 128+N: 137 SIGKILL (e.g. the kernel's OOM killer), "
         "143 SIGTERM",
}
"""This command's exit codes beyond the common ones (`cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("launch", help="run a job with torchrun on this machine (no Airflow)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--local", action="store_true",
                   help="launch on this host: the only mode without Airflow, so the default; "
                        "accepted for scripts that pass it")
    p.add_argument("spec", type=Path, metavar="SPEC", help="TrainingJob spec (YAML)")
    p.add_argument("--run", default="", metavar="RUN",
                   help="the training run to launch an attempt of (default: a new run)")
    p.add_argument("--attempt", type=int, default=0, help="attempt number (default 0)")
    p.add_argument("--resume-from", default="", metavar="URI", help="checkpoint manifest to restore")
    p.add_argument("--detach", action="store_true",
                   help="print the RunHandle JSON and return; a follower process finishes the launch")
    p.add_argument("--attach", type=Path, default=None, metavar="HANDLE", help=argparse.SUPPRESS)
    p.add_argument("--lease-s", type=float, default=None,
                   help=f"reservation lease (default {ATTACHED_LEASE_S:g}s renewed while attached, "
                        f"{DETACHED_LEASE_S:g}s with --detach)")
    p.add_argument("--grace-s", type=float, default=30.0, help="SIGTERM → SIGKILL grace on Ctrl-C")
    p.add_argument("--max-restarts", type=int, default=0, help="torchrun's in-place restarts (default 0)")
    p.add_argument("--timeout-s", type=float, default=None, help="stop the job after this long")
    p.add_argument("--mlflow-run-id", default=None, metavar="ID",
                   help="continue this MLflow run (default: a new run for attempt 0, the job's newest "
                        "run for a later attempt)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from cli.common import load_checked_job
    from cli.output import err_console, print_json
    from config.settings import get_settings
    from plugins.launch.base import LaunchError
    from plugins.launch.environment import build_worker_env
    from plugins.launch.local import LocalLauncher
    from plugins.placement.model import Unschedulable
    from plugins.placement.plans import plan_for_job
    from plugins.placement.service import place_and_reserve
    from plugins.placement.state import ReservationConflict, open_state

    settings = get_settings()
    try:
        loaded = load_checked_job(args.spec, settings.cluster)
    except (FileNotFoundError, ValueError) as e:
        err_console.print(f"trainyard launch: error: {e}")
        return 2
    if loaded is None:
        return 1
    job, cluster = loaded
    from plugins.recovery.model import MAX_ATTEMPTS
    from plugins.recovery.steps import InvalidConf, check_resume_point

    if not 0 <= args.attempt <= MAX_ATTEMPTS:
        err_console.print(f"trainyard launch: error: --attempt {args.attempt}: give 0 to {MAX_ATTEMPTS}")
        return 2

    try:  # another job's checkpoint is refused here, before anything is placed or started
        check_resume_point(args.resume_from, job, settings.object_store)
    except InvalidConf as e:
        err_console.print(f"trainyard launch: error: --resume-from: {escape(str(e))}")
        return 2
    if cluster.spec.mode != "local":
        err_console.print(f"trainyard launch: error: cluster '{cluster.name}' is a {cluster.spec.mode} cluster; "
                          "--local launches need a local one (TRAINYARD_CLUSTER=local)")
        return 2
    try:
        plan, source = plan_for_job(job, cluster, memory_fraction=settings.memory_fraction)
    except ValueError as e:
        err_console.print(f"[red]no plan[/]: {e}")
        return 1
    err_console.print(f"plan: {plan.describe()} ({source})")

    if args.attach is not None:  # the follower of a detached launch
        return _attach(args, job, plan, cluster, settings)

    from config.runs import check_run_id, new_run_id

    try:
        training_run = check_run_id(args.run) if args.run else new_run_id()
    except ValueError as e:
        err_console.print(f"trainyard launch: error: {e}")
        return 2
    store = open_state(settings.state_db)
    lease = args.lease_s or (DETACHED_LEASE_S if args.detach else ATTACHED_LEASE_S)
    try:
        placement = place_and_reserve(job, plan, cluster, store, run=training_run, attempt=args.attempt,
                                      lease_s=lease)
    except Unschedulable as e:
        err_console.print(f"[red]unschedulable[/]: {e.reason.message}")
        return 1
    except ReservationConflict as e:
        err_console.print(f"[red]cannot reserve[/]: {e}")
        return 1
    err_console.print(f"run {training_run} placed: " + ", ".join(f"{n.name}×{n.slots}" for n in placement.nodes))

    launcher = LocalLauncher(settings.runs_dir, source_dir=Path.cwd(), max_restarts=args.max_restarts)
    run_id = _open_tracking(job, plan, cluster, settings, args, source, training_run)
    worker_env = build_worker_env(job, plan, settings, run=training_run, attempt=args.attempt,
                                  resume_from=args.resume_from, mlflow_run_id=run_id or "")
    handle = None
    status = None
    keep_reservation = False
    try:
        handle = launcher.submit(job, plan, placement, worker_env, attempt=args.attempt)
        if args.detach:
            keep_reservation = True  # it belongs to the running job, and its follower, now
            follower = _start_follower(args, handle, run_id, lease)
            print_json(handle.model_dump(mode="json"))
            err_console.print(f"detached; logs under {handle.run_dir}; follower pid {follower} "
                              f"({handle.run_dir}/follower.log) releases the reservation and closes "
                              "the MLflow run when the job ends")
            return 0
        with _system_metrics(run_id, settings):
            status = _follow(launcher, handle, store, lease, args)
    except (LaunchError, ValueError) as e:
        err_console.print(f"[red]launch failed[/]: {e}")
        return 1
    except KeyboardInterrupt:
        err_console.print(f"interrupted: stopping (grace {args.grace_s:g}s)…")
        if handle is not None:
            _stop(handle, "requested", "Ctrl-C in trainyard launch", args.grace_s)
        _close_tracking(run_id, "cancelled", settings, job.name)
        return 130
    finally:
        if not keep_reservation:
            store.release(job.metadata.name, args.attempt, run=training_run)
    return _finish(job, plan, cluster, settings, launcher, handle, status, run_id)


def _start_follower(args: argparse.Namespace, handle: Any, run_id: str | None, lease: float) -> int:
    """This command again, with `--attach`, in its own session: it outlives the caller."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "cli.main", "launch", str(args.spec.resolve()),
            "--attach", str(Path(handle.run_dir) / "handle.json"), "--lease-s", str(lease),
            "--grace-s", str(args.grace_s), "--max-restarts", str(args.max_restarts)]
    if run_id:
        argv += ["--mlflow-run-id", run_id]
    if args.timeout_s is not None:
        argv += ["--timeout-s", str(args.timeout_s)]
    with open(Path(handle.run_dir) / "follower.log", "ab") as log:  # same cwd and environment: same home
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc.pid


def _attach(args: argparse.Namespace, job: Any, plan: Any, cluster: Any, settings: Any) -> int:
    """Follow a detached launch to its end: renew, then release the reservation, show the
    verdict and close the MLflow run — what an attached launch does after its submit."""
    from plugins.launch.local import LocalLauncher
    from plugins.launch.model import RunHandle
    from plugins.placement.state import open_state

    handle = RunHandle.model_validate_json(args.attach.read_text())
    launcher = LocalLauncher(settings.runs_dir, source_dir=Path.cwd(), max_restarts=args.max_restarts)
    store = open_state(settings.state_db)
    # If this process dies first, the job runs on: its reservation then ends with its lease.
    status = _follow(launcher, handle, store, args.lease_s or DETACHED_LEASE_S, args)
    store.release(job.metadata.name, handle.attempt, run=handle.run)
    return _finish(job, plan, cluster, settings, launcher, handle, status, args.mlflow_run_id)


def _finish(job: Any, plan: Any, cluster: Any, settings: Any, launcher: Any, handle: Any,
            status: RunStatus | None, run_id: str | None) -> int:
    """After the job ended (attached, or in the follower): its summary, the recovery engine's
    verdict, the MLflow run closed, and the exit status."""
    _summary(status, launcher, handle)
    _verdict(job, plan, cluster, settings, handle, status)
    _close_tracking(run_id, status, settings, job.name)
    return EXIT_HANG if _stopped_for_hang(handle) else exit_status(status)


def _stopped_for_hang(handle: Any) -> bool:
    """The gang was stopped because a rank hung (the stop reason recorded beside the run)."""
    from plugins.recovery.watch import read_stop_reason

    stop = read_stop_reason(handle.run_dir) if handle is not None else None
    return stop is not None and stop.reason == "hang"


def _open_tracking(job: Any, plan: Any, cluster: Any, settings: Any, args: argparse.Namespace,
                   source: str, training_run: str) -> str | None:
    """The job's MLflow run (new for attempt 0, `--mlflow-run-id` or the job's newest run
    otherwise) with its start artifacts; None, said once, when the tracking store is down."""
    from cli.output import err_console
    from plugins.tracking.lifecycle import open_tracked_run

    try:
        run_id = open_tracked_run(job, plan, settings, attempt=args.attempt, run_id=args.mlflow_run_id,
                                  run=training_run, cluster=cluster, plan_source=source)
    except Exception as e:  # noqa: BLE001 - a debugging launch runs without tracking rather than not at all
        err_console.print(f"[yellow]no MLflow run[/] ({settings.mlflow_tracking_uri}): {type(e).__name__}: {e}")
        return None
    err_console.print(f"MLflow run {run_id} ({settings.mlflow_tracking_uri})")
    return run_id


@contextlib.contextmanager
def _system_metrics(run_id: str | None, settings: Any) -> Iterator[None]:
    from plugins.tracking.system_metrics import start_system_metrics

    monitor = start_system_metrics(run_id, tracking_uri=settings.mlflow_tracking_uri) if run_id else None
    try:
        yield
    finally:
        if monitor is not None:
            monitor.finish()


def _close_tracking(run_id: str | None, status: RunStatus | str | None, settings: Any, title: str) -> None:
    """End the MLflow run: completed or failed by the job's status, `cancelled` on Ctrl-C."""
    from plugins.tracking.lifecycle import close_tracked_run

    if run_id is None or status is None:
        return
    outcome = status if isinstance(status, str) else ("completed" if status.succeeded else "failed")
    close_tracked_run(run_id, outcome, tracking_uri=settings.mlflow_tracking_uri, title=title)  # type: ignore[arg-type]


def _follow(launcher: Any, handle: Any, store: Any, lease: float, args: argparse.Namespace) -> RunStatus:
    """Show progress until the job ends; renew the reservation's lease meanwhile."""
    from rich.live import Live

    from cli.output import err_console
    from plugins.recovery.watch import hang_stop, stop_gang

    started = last_renew = time.monotonic()
    status = launcher.poll(handle)
    with Live(_progress(status, handle, 0.0), console=err_console, refresh_per_second=2, transient=True) as live:
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            if now - last_renew > RENEW_EVERY_S:
                if store.renew(handle.job, handle.attempt, run=handle.run, lease_s=lease) is None:
                    err_console.print("[red]the reservation's lease was lost; stopping the job[/]")
                    return _stop(handle, "lease_lost", "the reservation's lease could not be renewed",
                                 args.grace_s)
                last_renew = now
            if args.timeout_s is not None and now - started > args.timeout_s:
                err_console.print(f"[yellow]timeout after {args.timeout_s:g}s; stopping[/]")
                return _stop(handle, "timeout", f"--timeout-s {args.timeout_s:g} reached", args.grace_s)
            if status.finished:
                return launcher.settle(handle, status)
            hang = hang_stop(status)
            if hang is not None:
                err_console.print(f"[red]hang[/]: {hang.detail}; stopping the gang")
                return stop_gang(handle, hang, grace_s=args.grace_s)
            status = launcher.poll(handle)
            live.update(_progress(status, handle, now - started))


def _stop(handle: Any, reason: str, detail: str, grace_s: float) -> RunStatus:
    """Stop the gang the control plane's way: the reason first (`classify` reads it), then the stop."""
    from plugins.recovery.watch import StopReason, stop_gang

    return stop_gang(handle, StopReason(reason=reason, detail=detail), grace_s=grace_s)  # type: ignore[arg-type]


def _verdict(job: Any, plan: Any, cluster: Any, settings: Any, handle: Any, status: RunStatus | None) -> None:
    """How the recovery engine reads the attempt, and what the control plane would do next
    (`trainyard launch` runs one attempt; the Airflow DAG carries the action out)."""
    from rich.markup import escape

    from cli.output import console
    from plugins.launch.environment import checkpoint_uri
    from plugins.recovery.decide import DecisionContext
    from plugins.recovery.engine import after_attempt
    from plugins.recovery.evidence import gather
    from plugins.recovery.model import AttemptConf

    if status is None or handle is None or not status.finished:
        return
    ctx = DecisionContext(checkpoint_uri=checkpoint_uri(job, settings.object_store, handle.run),
                          endpoint_url=settings.s3_endpoint_url, cluster=cluster, plan=plan)
    conf = AttemptConf(run=handle.run, attempt=handle.attempt)
    result = after_attempt(gather(handle, status, run=handle.run), job, conf, ctx, apply=False)
    if result.report.outcome == "completed":
        return
    console.print(f"verdict: [bold]{result.report.outcome}[/] — {escape(result.report.reason)}")
    console.print(f"the control plane would {result.action.kind}: {escape(result.action.reason)}")


def _progress(status: RunStatus, handle: Any, elapsed: float) -> Any:
    from rich.table import Table

    from cli.output import format_age

    table = Table(title=f"{handle.job} attempt {handle.attempt} — {status.state} ({elapsed:.0f}s): "
                        f"{status.message}", title_justify="left")
    for column in ("rank", "node", "step", "heartbeat age", "exit"):
        table.add_column(column)
    for r in status.ranks:
        age = format_age(r.heartbeat_age_s)
        table.add_row(str(r.rank), r.node or "-", "-" if r.step is None else str(r.step),
                      age + (" (hung)" if r.hung else ""), r.outcome or "")
    return table


def _summary(status: RunStatus | None, launcher: Any, handle: Any) -> None:
    from rich.markup import escape

    from cli.output import console

    if status is None:
        return
    style = "green" if status.succeeded else "red"
    console.print(f"[{style}]{status.state}[/]: {escape(status.message)}")
    console.print(f"logs: {handle.run_dir}/ranks/rank-NNNNN.log")
    if status.failed_rank is not None:
        console.print(f"--- last lines of rank {status.failed_rank} ---")
        console.print(escape(launcher.logs(handle, rank=status.failed_rank, tail=20)))


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
