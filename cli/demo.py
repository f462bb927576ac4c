"""`make demo` (`python -m cli.demo`): the main job, end to end, on the embedded default.

What a team sees when Trainyard runs their job, on this machine, with real parts only:
prepare the dataset → validate the spec (schema, rules, memory, quota, data quality) → plan
the parallelism → open the job's MLflow run → place and launch it with torchrun (2 CPU
processes, gloo) → **kill one rank mid-run** (a worker crash) → resume from the latest
verified checkpoint as attempt 1, in the same MLflow run → register the best checkpoint as a
model version with lineage → show the loss curve, the recovery timeline and the cost.

This is the control plane's sequence without Airflow (the Airflow DAG runs the same engines).
`--no-crash` skips the injected failure. Exit 0 when the job completed and was registered.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from config.cluster import Cluster
    from config.settings import Settings
    from config.spec import TrainingJob
    from plugins.advisor.plan import Plan
    from plugins.launch.model import RunHandle, RunStatus
    from plugins.recovery.model import AttemptConf
    from plugins.recovery.state import JobStateStore

DEMO_SPEC = Path(__file__).resolve().parents[1] / "config" / "jobs" / "demo-tiny-lm.yaml"


@dataclass
class Timeline:
    """What happened when, for the recovery timeline at the end."""

    start: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)
    attempts: list[tuple[float, float]] = field(default_factory=list)
    """(launched, ended) of each attempt, seconds since start: device time by phase for cost."""

    def add(self, what: str) -> None:
        self.events.append((time.monotonic() - self.start, what))


class DemoFailed(RuntimeError):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", type=Path, default=DEMO_SPEC, help="the job to run (default: the demo)")
    p.add_argument("--no-crash", action="store_true", help="do not inject the mid-run worker crash")
    p.add_argument("--crash-at-step", type=int, default=120, help="kill rank 1 once training passes this step")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from cli.output import console

    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        run_demo(args)
    except DemoFailed as e:
        console.print(f"[bold red]demo failed:[/] {e}")
        return 1
    return 0


def run_demo(args: argparse.Namespace) -> None:
    from config.cluster import load_cluster
    from config.loader import load_spec_file
    from config.settings import get_settings
    from plugins.tracking.runs import set_run_status

    settings = get_settings()
    cluster = load_cluster(settings.cluster)
    from config.runs import new_run_id

    job = load_spec_file(args.spec)
    run = new_run_id()
    timeline = Timeline()

    _step("1/7 dataset", f"object store {settings.object_store}")
    _prepare_data(settings)
    _step("2/7 validate", "schema, rules, memory fit, quota, dataset, data quality (Great Expectations)")
    _validate(job, cluster, settings)
    _step("3/7 plan", f"the advisor, for {job.spec.hardware.gpu_count} × {job.spec.hardware.gpu_type}")
    plan = _plan(job, cluster, settings)
    _step("4/7 track", f"MLflow {settings.mlflow_tracking_uri}; this is run {run} of job {job.name}")
    run_id = _open_run(job, plan, settings, run)
    _log_start_artifacts(job, plan, cluster, settings, run_id)
    timeline.add("submitted")

    _step("5/7 train", "torchrun, detached; progress from the ranks' heartbeats")
    crash_at = None if args.no_crash else args.crash_at_step
    with _system_metrics(run_id, settings):
        status, attempt = _train(job, plan, cluster, settings, run, run_id, crash_at, timeline)
    if not status.succeeded:
        set_run_status(run_id, "failed", tracking_uri=settings.mlflow_tracking_uri)
        raise DemoFailed(f"attempt {attempt} ended {status.state}: {status.message}")
    set_run_status(run_id, "completed", tracking_uri=settings.mlflow_tracking_uri)

    _step("6/7 register", "best checkpoint → safetensors → MLflow model version (alias 'candidate')")
    version = _register(job, settings, run_id, model_name=job.name)
    timeline.add(f"registered {version.name} v{version.version}")
    _step("7/7 results", "")
    _results(job, plan, cluster, settings, run, run_id, timeline, version)


def _step(title: str, detail: str) -> None:
    from cli.output import console

    console.rule(f"[bold]{title}[/]  [dim]{detail}[/]", align="left")


def _prepare_data(settings: Settings) -> None:
    from cli.output import console
    from plugins.storage.store import open_store
    from worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    store = open_store(settings.object_store, endpoint_url=settings.s3_endpoint_url).child(DEMO_PREFIX.rstrip("/"))
    result = prepare_demo_dataset(store)
    console.print(f"{result.rows} rows ({result.bytes / 1e3:.0f} kB) in {len(result.shards)} JSONL shards "
                  f"at {result.uri}")


def _validate(job: TrainingJob, cluster: Cluster, settings: Settings) -> None:
    from rich.markup import escape

    from cli.output import console
    from plugins.validation.dry_run import validate_job

    problems = validate_job(job, cluster=cluster, settings=settings, data_quality=True)
    for p in problems:
        console.print(f"  [{'red' if p.severity == 'error' else 'yellow'}]{p.code.value}[/] {escape(p.render())}")
    if any(p.severity == "error" for p in problems):
        raise DemoFailed("the spec did not validate")
    console.print(f"[green]✓[/] {job.name} is valid on cluster '{cluster.name}'")


def _plan(job: TrainingJob, cluster: Cluster, settings: Settings) -> Plan:
    from cli.output import console
    from plugins.advisor import plan_job

    result = plan_job(job, cluster, memory_fraction=settings.memory_fraction)
    if result.best is None:
        raise DemoFailed("no plan fits: " + "; ".join(result.suggestions))
    best = result.best
    memory = (best.memory_per_gpu_bytes or 0) / 2**20
    console.print(f"[green]✓[/] {best.describe()}  ·  {memory:.0f} MiB per device  ·  "
                  f"{result.plans_evaluated} plans evaluated")
    return best


def _open_run(job: TrainingJob, plan: Plan, settings: Settings, run: str) -> str:
    from cli.output import console
    from plugins.data.datasets import describe_dataset, open_dataset_store
    from plugins.tracking.runs import start_or_resume_run

    dataset = describe_dataset(open_dataset_store(job.spec.dataset.source, settings), job.spec.dataset)
    run_id = start_or_resume_run(job, plan, tracking_uri=settings.mlflow_tracking_uri, attempt=0,
                                 dataset=dataset, trigger_id=run)
    console.print(f"MLflow run {run_id} (experiment {job.metadata.team}/{job.metadata.project}), "
                  f"dataset digest {dataset.digest[:12]}…")
    return run_id


def _log_start_artifacts(job: TrainingJob, plan: Plan, cluster: Cluster, settings: Settings, run_id: str) -> None:
    """The run's spec, plan explanation and data-quality report (`plugins.tracking.artifacts`).
    The quality checks run again here: the dry run keeps only their problems, not the report."""
    from plugins.data.datasets import open_dataset_store
    from plugins.tracking.artifacts import log_start_artifacts
    from plugins.validation.data_quality import check_data_quality

    quality = check_data_quality(job, store=open_dataset_store(job.spec.dataset.source, settings))
    log_start_artifacts(run_id, job, plan, tracking_uri=settings.mlflow_tracking_uri, cluster=cluster,
                        memory_fraction=settings.memory_fraction, plan_source="advisor", quality=quality)


@contextlib.contextmanager
def _system_metrics(run_id: str, settings: Settings) -> Iterator[None]:
    """MLflow's system metrics (CPU, memory, disk, network, GPUs) on the run while it trains."""
    from plugins.tracking.system_metrics import start_system_metrics

    monitor = start_system_metrics(run_id, tracking_uri=settings.mlflow_tracking_uri, sampling_interval_s=5.0)
    try:
        yield
    finally:
        if monitor is not None:
            monitor.finish()


def _train(job: TrainingJob, plan: Plan, cluster: Cluster, settings: Settings, run: str, run_id: str,
           crash_at: int | None, timeline: Timeline) -> tuple[RunStatus, int]:
    """Attempts until the job completes or the recovery engine gives up: each attempt's
    outcome is classified and the next step decided by `plugins.recovery` (the same calls the
    DAG makes), and the run's lifecycle is recorded in the platform state (`trainyard status`)."""
    from cli.output import console
    from plugins.advisor.plan import Plan
    from plugins.checkpoint.catalog import latest_valid
    from plugins.checkpoint.uris import split_manifest_uri
    from plugins.launch.environment import checkpoint_uri
    from plugins.recovery.decide import DecisionContext
    from plugins.recovery.engine import after_attempt, begin_attempt
    from plugins.recovery.evidence import gather
    from plugins.recovery.model import AttemptConf
    from plugins.recovery.state import open_job_state
    from plugins.tracking.runs import log_recovery_event

    jobs = open_job_state(settings.state_db)
    jobs.open_run(job.name, trigger_key=f"demo/{run}", run=run, team=job.metadata.team,
                  project=job.metadata.project, mlflow_run_id=run_id)
    root = checkpoint_uri(job, settings.object_store, run)
    ctx = DecisionContext(checkpoint_uri=root, endpoint_url=settings.s3_endpoint_url, cluster=cluster, plan=plan)
    conf = AttemptConf(run=run, mlflow_run_id=run_id)
    while True:
        if conf.plan:  # an OOM re-plan hands the next attempt a plan that needs less memory
            plan = Plan.model_validate_json(conf.plan)
            ctx = replace(ctx, plan=plan)
        begin_attempt(jobs, job.name, run, conf.attempt)
        status, handle = _run_attempt(job, plan, cluster, settings, run, run_id, conf, crash_at, timeline, jobs)
        _log_checkpoints(job, settings, run, run_id)
        result = after_attempt(gather(handle, status, run=run, resume_from=conf.resume_from), job, conf, ctx,
                               state=jobs, by="make demo")
        report, action = result.report, result.action
        if result.next_conf is None:
            if action.kind == "give_up":
                console.print(f"[red]{report.outcome}[/]: {report.reason}; giving up: {action.reason}")
            return status, conf.attempt
        if action.resume_from:
            restored = f"step {split_manifest_uri(action.resume_from)[2]}"
        else:
            record = latest_valid(root, endpoint_url=settings.s3_endpoint_url)
            restored = f"step {record.step}" if record is not None else "scratch"
        console.print(f"[yellow]{report.outcome}[/]: rank {status.failed_rank} exited {status.exit_code} "
                      f"({status.message}); restarting from {restored}")
        log_recovery_event(run_id, report.outcome, attempt=conf.attempt, step=status.step or 0,
                           detail=f"rank {status.failed_rank} exit {status.exit_code}; resume from {restored}",
                           tracking_uri=settings.mlflow_tracking_uri)
        timeline.add(f"attempt {conf.attempt} failed ({report.outcome}); resume from {restored}")
        conf = result.next_conf


def _run_attempt(job: TrainingJob, plan: Plan, cluster: Cluster, settings: Settings, run: str, run_id: str,
                 conf: AttemptConf, crash_at: int | None, timeline: Timeline,
                 jobs: JobStateStore) -> tuple[RunStatus, RunHandle]:
    """One attempt as `conf` says (resume point, excluded nodes); the crash is injected into
    attempt 0 only."""
    from plugins.launch.environment import build_worker_env
    from plugins.launch.local import LocalLauncher
    from plugins.placement.service import place_and_reserve
    from plugins.placement.state import open_state
    from plugins.tracking.runs import start_or_resume_run

    attempt, resume_from = conf.attempt, conf.resume_from
    crash_at = crash_at if attempt == 0 else None
    if attempt:
        start_or_resume_run(job, plan, tracking_uri=settings.mlflow_tracking_uri, run_id=run_id, attempt=attempt)
    state = open_state(settings.state_db)
    placement = place_and_reserve(job, plan, cluster, state, run=run, attempt=attempt, exclude=conf.exclude_nodes,
                                  lease_s=3600)
    try:
        launcher = LocalLauncher(settings.runs_dir, source_dir=Path.cwd())
        worker_env = build_worker_env(job, plan, settings, run=run, attempt=attempt, resume_from=resume_from,
                                      mlflow_run_id=run_id)
        handle = launcher.submit(job, plan, placement, worker_env, attempt=attempt)
        jobs.set_handle(job.name, run, attempt, handle)
        jobs.transition(job.name, run, "running")
        timeline.add(f"attempt {attempt} launched on {', '.join(n.name for n in placement.nodes)}")
        launched = time.monotonic() - timeline.start
        status = _follow(launcher, handle, job.spec.training.max_steps, crash_at, timeline)
        timeline.attempts.append((launched, time.monotonic() - timeline.start))
        timeline.add(f"attempt {attempt} {status.state}")
        return status, handle
    finally:
        state.release(job.metadata.name, attempt, run=run)


def _follow(launcher: Any, handle: Any, max_steps: int, crash_at: int | None, timeline: Timeline) -> RunStatus:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cli.output import console

    killed = False
    with Progress(TextColumn("attempt {task.fields[attempt]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("train", total=max_steps, attempt=handle.attempt, note="starting")
        while True:
            status = launcher.poll(handle)
            steps = [r.step for r in status.ranks if r.step is not None]
            if steps:
                bar.update(task, completed=min(steps), note=status.state)
            if status.finished:
                return launcher.settle(handle, status)
            if crash_at is not None and not killed and steps and min(steps) >= crash_at:
                victim = next((r for r in status.ranks if r.rank == 1 and r.pid), None)
                if victim is not None:
                    os.kill(victim.pid, signal.SIGKILL)
                    killed = True
                    timeline.add(f"SIGKILL rank 1 (pid {victim.pid}) at step {min(steps)}")
                    bar.update(task, note="[red]rank 1 killed[/]")
            time.sleep(0.5)


def _log_checkpoints(job: TrainingJob, settings: Settings, run: str, run_id: str) -> None:
    from plugins.checkpoint.catalog import list_checkpoints
    from plugins.launch.environment import checkpoint_uri
    from plugins.tracking.runs import log_committed_checkpoint

    root = checkpoint_uri(job, settings.object_store, run)
    for record in list_checkpoints(root, endpoint_url=settings.s3_endpoint_url):
        log_committed_checkpoint(run_id, record.manifest_uri, tracking_uri=settings.mlflow_tracking_uri,
                                 endpoint_url=settings.s3_endpoint_url)


def _register(job: TrainingJob, settings: Settings, run_id: str, *, model_name: str) -> Any:
    from cli.output import console
    from plugins.tracking.registry import register_checkpoint

    metric = job.spec.checkpoint.keep_best_metric
    version = register_checkpoint(run_id, tracking_uri=settings.mlflow_tracking_uri, metric=metric,
                                  model_name=model_name, endpoint_url=settings.s3_endpoint_url)
    console.print(f"[green]✓[/] model {version.name} version {version.version} (alias 'candidate') "
                  f"from step {version.checkpoint_step}")
    return version


def _results(job: TrainingJob, plan: Plan, cluster: Cluster, settings: Settings, run: str, run_id: str,
             timeline: Timeline, version: Any) -> None:
    from rich.table import Table

    from cli.output import console
    from plugins.tracking.runs import client_for

    history = sorted(client_for(settings.mlflow_tracking_uri).get_metric_history(run_id, "loss"),
                     key=lambda m: (m.step, m.timestamp))
    losses = {m.step: m.value for m in history}  # a replayed step keeps its latest value
    if not losses:
        raise DemoFailed("no loss was recorded in MLflow")
    curve = Table(title="loss (from MLflow)", title_justify="left")
    curve.add_column("step", justify="right")
    curve.add_column("loss", justify="right")
    curve.add_column("")
    steps = sorted(losses)
    top = max(losses.values())
    shown = steps[:: max(1, len(steps) // 10)]
    for s in shown + ([steps[-1]] if shown[-1] != steps[-1] else []):
        curve.add_row(str(s), f"{losses[s]:.3f}", "█" * max(1, round(30 * losses[s] / top)))
    console.print(curve)
    png = _log_end_artifacts(job, settings, run, run_id, timeline)

    events = Table(title="recovery timeline", title_justify="left")
    events.add_column("t", justify="right")
    events.add_column("event")
    for t, what in timeline.events:
        events.add_row(f"{t:6.1f}s", what)
    console.print(events)

    wall_s = time.monotonic() - timeline.start
    cost = _cost(job, cluster, settings, run_id, timeline)
    first, last = losses[steps[0]], losses[steps[-1]]
    console.print(
        f"loss {first:.3f} → {last:.3f} over {steps[-1]} steps · {wall_s:.0f}s wall · "
        f"{cost}\nmodel {version.name} v{version.version} · plot {png}\n"
        f"compare runs: .venv/bin/mlflow ui --backend-store-uri {settings.mlflow_tracking_uri}")
    if not last < first:
        raise DemoFailed(f"the loss did not fall ({first:.3f} → {last:.3f})")


def _log_end_artifacts(job: TrainingJob, settings: Settings, run: str, run_id: str, timeline: Timeline) -> Path:
    """The loss plot and recovery timeline as run artifacts; the plot also under .trainyard/demo/."""
    from plugins.tracking.artifacts import log_end_artifacts, loss_plot
    from plugins.tracking.runs import client_for, recovery_events

    log_end_artifacts(run_id, tracking_uri=settings.mlflow_tracking_uri, timeline=timeline.events, title=job.name)
    path = settings.home / "demo" / f"{job.name}-{run}.png"
    loss_plot(client_for(settings.mlflow_tracking_uri), run_id, path, title=job.name,
              events=recovery_events(run_id, tracking_uri=settings.mlflow_tracking_uri))
    return path


def _cost(job: TrainingJob, cluster: Cluster, settings: Settings, run_id: str, timeline: Timeline) -> str:
    """Device time by phase: attempts are training; the gaps between them are recovery."""
    from datetime import timedelta

    from plugins.tracking.cost import RunAccounting, job_cost, log_job_cost
    from plugins.tracking.rates import load_rates

    training = sum(end - start for start, end in timeline.attempts)
    recovery = sum(nxt[0] - prev[1] for prev, nxt in zip(timeline.attempts, timeline.attempts[1:], strict=False))
    submitted = datetime.now(UTC) - timedelta(seconds=time.monotonic() - timeline.start)
    acct = RunAccounting(job=job.name, team=job.metadata.team, project=job.metadata.project,
                         gpu_type=job.spec.hardware.gpu_type, gpu_count=job.spec.hardware.gpu_count,
                         submitted_at=submitted, started_at=submitted + timedelta(seconds=timeline.attempts[0][0]),
                         ended_at=submitted + timedelta(seconds=timeline.attempts[-1][1]),
                         training_s=training, recovery_s=recovery, run_id=run_id)
    cost = job_cost(acct, load_rates(), cluster=cluster)
    log_job_cost(run_id, acct, cost, tracking_uri=settings.mlflow_tracking_uri)
    return (f"{cost.total_gpu_hours:.4f} device-hours ({cost.recovery_gpu_hours:.4f} in recovery), "
            f"${cost.total_cost_usd:.4f}")


if __name__ == "__main__":
    sys.exit(main())
