"""`make demo` (`python -m trainyard.cli.demo`): the product, end to end, on the embedded default.

What a team sees when Trainyard runs their job, on this machine, with real parts only:

1. the demo dataset is written into the object store (`.trainyard/objects`);
2. the embedded stack starts in the background, or is found running: Airflow (api-server,
   scheduler, dag-processor, triggerer; SQLite, LocalExecutor), the MLflow UI, one node agent
   per local node — logs and pids under `.trainyard/`;
3. the demo job's DAG is triggered through Airflow's REST API with a fault Param: rank 1 is
   SIGKILLed at step 120 (a worker crash);
4. Airflow runs the attempt — validate, plan, place, launch torchrun (2 CPU processes, gloo),
   watch it with deferrable sensors — classifies the crash, releases the gang and hands the run
   to attempt 1, which resumes from the newest verified checkpoint in the same MLflow run; the
   completed run is registered as a model version (alias `candidate` when the spec's rule allows:
   the full 200 steps, a loss no worse than the holder's);
5. the summary: the attempts, the loss curve, the recovery timeline, the cost, the registered
   version, the plot, and where to look in both UIs.

The stack stays up for browsing (`make down` stops it; `--stop` or `STOP=1` stops it at the
end). `--no-crash` skips the injected failure; `--max-steps N` trains a shorter run (the DAG's
`max_steps` Param, as a user would shorten it; the end-to-end test does). Exit 0 when the run
completed, recovered from the injected crash and was registered.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.cli.stack import Stack
    from trainyard.config.settings import Settings
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.airflow_api import AirflowClient, AttemptRun

DEMO_SPEC = Path(__file__).resolve().parents[1] / "config" / "jobs" / "demo-tiny-lm.yaml"


class DemoFailed(RuntimeError):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--no-crash", action="store_true", help="do not inject the mid-run worker crash")
    p.add_argument("--crash-at-step", type=int, default=120, help="kill rank 1 before this step")
    p.add_argument("--max-steps", type=int, default=None, metavar="N",
                   help="train N steps instead of the spec's training.maxSteps")
    p.add_argument("--stop", action="store_true", default=os.environ.get("STOP", "") not in ("", "0"),
                   help="stop the stack at the end (default: leave it up for browsing; STOP=1)")
    p.add_argument("--port", type=int, default=int(os.environ.get("TRAINYARD_AIRFLOW_PORT", "8080")),
                   help="Airflow's port (default 8080)")
    p.add_argument("--timeout-s", type=float, default=900.0, help="give up waiting after this long")
    args = p.parse_args(argv)
    if args.max_steps is not None and not args.no_crash and not 1 < args.crash_at_step <= args.max_steps:
        p.error(f"--crash-at-step {args.crash_at_step} must lie in 2..--max-steps ({args.max_steps}) "
                "for the crash to happen; or pass --no-crash")
    return args


def main(argv: list[str] | None = None) -> int:
    from trainyard.cli.output import console

    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        run_demo(args)
    except DemoFailed as e:
        console.print(f"[bold red]demo failed:[/] {e}")
        return 1
    return 0


def run_demo(args: argparse.Namespace) -> None:
    from trainyard.cli.stack import default_stack
    from trainyard.config.loader import load_spec_file
    from trainyard.config.settings import get_settings
    from trainyard.plugins.airflow_api import AirflowClient, first_attempt

    started = time.monotonic()
    settings = get_settings()
    job = load_spec_file(DEMO_SPEC)
    stack = default_stack(settings.home, port=args.port)
    _step("1/5 dataset", f"object store {settings.object_store}")
    _prepare_data(settings)
    _step("2/5 stack", f"Airflow, MLflow UI, node agents; logs in {settings.home / 'logs'}")
    _start(stack)
    settings = get_settings()  # again: the stack made the home's databases (`trainyard.config.databases`)
    client = AirflowClient(stack.url)
    try:
        conf: dict[str, Any] = {} if args.no_crash else {"fault_kill_rank": 1, "fault_kill_at_step": args.crash_at_step}
        if args.max_steps is not None:
            conf["max_steps"] = args.max_steps
        _step("3/5 submit", f"DAG {job.name} through Airflow's REST API"
              + ("" if args.no_crash else f", with rank 1 killed at step {args.crash_at_step}"))
        conf, first_id = first_attempt(conf)
        dag_run = client.trigger(job.name, conf, run_id=first_id, note="make demo")["dag_run_id"]
        _print(f"DAG run {dag_run}: {stack.url}/dags/{job.name}/runs/{dag_run}")
        _step("4/5 train", "attempts, steps and loss as Airflow and MLflow see them")
        from trainyard.cli.submit import follow_with_progress

        attempts = follow_with_progress(client, settings, job.name, dag_run, args.timeout_s)
        _step("5/5 results", "")
        _results(job, settings, stack, client, attempts, crashed=not args.no_crash, started=started)
    finally:
        if args.stop:
            stack.down()
            _print("stack stopped (--stop)")


def _step(title: str, detail: str) -> None:
    from trainyard.cli.output import console

    console.rule(f"[bold]{title}[/]  [dim]{detail}[/]", align="left")


def _print(text: str) -> None:
    from rich.markup import escape

    from trainyard.cli.output import console

    console.print(escape(text))


def _prepare_data(settings: Settings) -> None:
    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    store = open_store(settings.object_store, endpoint_url=settings.s3_endpoint_url).child(DEMO_PREFIX.rstrip("/"))
    result = prepare_demo_dataset(store)
    _print(f"{result.rows} rows ({result.bytes / 1e3:.0f} kB) in {len(result.shards)} JSONL shards at {result.uri}")


def _start(stack: Stack) -> None:
    """Start what is not running yet and wait until every part answers."""
    begun = time.monotonic()
    try:
        stack.up(timeout_s=240)
    except (TimeoutError, OSError) as e:
        raise DemoFailed(f"the stack did not come up: {e}") from e
    _print(f"healthy in {time.monotonic() - begun:.0f}s — Airflow {stack.url} (no login), "
           f"MLflow {stack.mlflow_url}, node agents {', '.join(stack.agents().values())}")


def _results(job: TrainingJob, settings: Settings, stack: Stack, client: AirflowClient,
             attempts: list[AttemptRun], *, crashed: bool, started: float) -> None:
    from rich.table import Table

    from trainyard.cli.output import console
    from trainyard.plugins.attempt.closing import run_timeline
    from trainyard.plugins.tracking.runs import client_for
    from trainyard.plugins.tracking.ui_links import mlflow_run_url

    if not attempts or not attempts[-1].run:
        raise DemoFailed(f"the DAG run ended before opening a training run: {attempts}")
    run = attempts[-1].run
    table = Table(title=f"attempts of run {run}", title_justify="left")
    for column in ("#", "outcome", "action", "why"):
        table.add_column(column, overflow="fold")
    for a in attempts:
        table.add_row(str(a.attempt), a.outcome or a.state, a.action, a.reason)
    console.print(table)
    final = attempts[-1]
    if final.action != "register":
        failed = {t: s for t, s in final.tasks.items() if s in ("failed", "upstream_failed")}
        raise DemoFailed(f"the run ended {final.outcome or final.state} (failed tasks: {failed or 'none'}); "
                         f"see {stack.url}/dags/{job.name}")
    if crashed and not any(a.outcome == "worker_crash" for a in attempts):
        raise DemoFailed("the injected worker crash was not seen as one")

    registered = client.xcom(job.name, final.dag_run_id, "register_model") or {}
    mlflow_run_id = registered.get("mlflow_run_id", "")
    mlflow = client_for(settings.mlflow_tracking_uri)
    history = sorted(mlflow.get_metric_history(mlflow_run_id, "loss"), key=lambda m: (m.step, m.timestamp))
    losses = {m.step: m.value for m in history}
    if not losses:
        raise DemoFailed("no loss was recorded in MLflow")
    steps = sorted(losses)
    curve = Table(title="loss (from MLflow)", title_justify="left")
    for column in ("step", "loss", ""):
        curve.add_column(column, justify="right" if column else "left")
    top = max(losses.values())
    shown = steps[:: max(1, len(steps) // 10)]
    for s in shown + ([steps[-1]] if shown[-1] != steps[-1] else []):
        curve.add_row(str(s), f"{losses[s]:.3f}", "█" * max(1, round(30 * losses[s] / top)))
    console.print(curve)

    events = Table(title="recovery timeline (from the job state)", title_justify="left")
    events.add_column("t", justify="right")
    events.add_column("event", overflow="fold")
    for t, what in run_timeline(job.name, run, settings):
        events.add_row(f"{t:6.1f}s", what)
    console.print(events)

    png = _plot(settings, mlflow_run_id, job.name, run)
    experiment = mlflow.get_run(mlflow_run_id).info.experiment_id
    first, last = losses[steps[0]], losses[steps[-1]]
    cost = (f"{registered['device_hours']:.4f} device-hours "
            f"({registered['recovery_device_hours']:.4f} in recovery), ${registered['cost_usd']:.4f}"
            if "device_hours" in registered else "cost not recorded")
    _print(f"loss {first:.3f} → {last:.3f} over {steps[-1]} steps · {time.monotonic() - started:.0f}s wall · {cost}\n"
           f"model {registered.get('model')} v{registered.get('version')} from step {registered.get('step')}"
           f" · {_candidate(mlflow, registered)} · plot {png}\n\n"
           f"Airflow UI   {stack.url}/dags/{job.name}  (no login needed: local-only auth)\n"
           f"MLflow UI    {mlflow_run_url(stack.mlflow_url, experiment, mlflow_run_id)}\n"
           f"status       .venv/bin/trainyard status {job.name} --run {run}\n"
           f"stop         make down")
    if not last < first:
        raise DemoFailed(f"the loss did not fall ({first:.3f} → {last:.3f})")


def _candidate(client: object, registered: dict) -> str:
    """Whether `candidate` moved to the version, as the registration decided and recorded it (the
    spec's rule: a shortened demo run is registered but leaves the alias where it is)."""
    from trainyard.plugins.tracking.candidate import DECISION_TAG

    try:
        version = client.get_model_version(registered.get("model"), str(registered.get("version")))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - the summary says what it could not read
        return "candidate decision not readable"
    return (version.tags or {}).get(DECISION_TAG, "candidate decision not recorded")


def _plot(settings: Settings, mlflow_run_id: str, job: str, run: str) -> Path | None:
    from trainyard.plugins.tracking.artifacts import loss_plot
    from trainyard.plugins.tracking.runs import client_for, recovery_events

    path = settings.home / "demo" / f"{job}-{run}.png"
    return loss_plot(client_for(settings.mlflow_tracking_uri), mlflow_run_id, path, title=f"{job} run {run}",
                     events=recovery_events(mlflow_run_id, tracking_uri=settings.mlflow_tracking_uri))


if __name__ == "__main__":
    sys.exit(main())
