"""`trainyard submit SPEC [--wait] [--param k=v]`: run a job through Airflow, as the UI's trigger
button does.

The spec is checked first (schema, rules, cluster — the offline dry run) and put in the jobs
folder Airflow reads (`TRAINYARD_JOBS_DIR`) when it is not there yet; once the DAG processor
has the job's DAG, one DAG run is triggered through the REST API with the `--param`s as its
conf (the trigger form's fields: `max_steps`, `learning_rate`, `start_from`, `dry_run`,
`fault_*`). `--wait` follows the training run through every attempt the recovery hands it to,
with the step and loss from MLflow, and exits with its outcome.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.plugins.airflow_api import AirflowClient, AttemptRun
    from trainyard.plugins.recovery.outcome import RunOutcome

EXIT_CODES: dict[int, str] = {
    1: "the spec is invalid, or (with --wait) the training run did not complete (failed — a registration "
       "that failed included — or cancelled)",
    3: "Airflow does not answer (start it with `make airflow`)",
}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""
DAG_WAIT_S = 90.0
"""How long to wait for the DAG processor to pick up a spec new to the jobs folder."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="run a job through Airflow (trigger its DAG)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("spec", type=Path, metavar="SPEC", help="TrainingJob spec (YAML)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a trigger-form field, e.g. max_steps=100 or fault_kill_rank=1 (repeatable)")
    p.add_argument("--wait", action="store_true", help="follow the run until it ends; exit with its outcome")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="give up waiting after this long")
    p.set_defaults(func=run)


def parse_params(items: list[str]) -> dict[str, Any]:
    """`key=value` pairs; values are JSON when they parse (numbers, true/false, null), else text."""
    conf: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param {item!r}: write KEY=VALUE")
        try:
            conf[key.strip()] = json.loads(value)
        except ValueError:
            conf[key.strip()] = value
    return conf


def run(args: argparse.Namespace) -> int:
    from trainyard.cli.common import load_checked_job
    from trainyard.cli.output import console, err_console
    from trainyard.config.settings import get_settings
    from trainyard.plugins.airflow_api import (
        AirflowClient,
        AirflowRequestFailed,
        AirflowUnavailable,
        first_attempt,
    )

    settings = get_settings()
    try:
        conf = parse_params(args.param)
        loaded = load_checked_job(args.spec, None, to_run=True)
    except (FileNotFoundError, ValueError) as e:
        err_console.print(f"trainyard submit: error: {e}")
        return 2
    if loaded is None:
        return 1
    job, _ = loaded
    placed, changed = _into_jobs_folder(args.spec, job.name, settings.jobs_dir)
    if changed:
        err_console.print(f"{placed}: written (the job's one spec in Airflow's jobs folder)")
    client = AirflowClient.of(settings)
    try:
        _wait_for_dag(client, job.name, placed, changed=changed)
        conf, first_id = first_attempt(conf)
        dag_run = client.trigger(job.name, conf, run_id=first_id, note=f"trainyard submit {args.spec}")
    except AirflowUnavailable as e:
        err_console.print(f"[red]{e}[/]")
        return 3
    except (AirflowRequestFailed, TimeoutError, ValueError) as e:
        err_console.print(f"[red]cannot trigger {job.name}[/]: {e}")
        return 1
    url = f"{settings.airflow_url.rstrip('/')}/dags/{job.name}/runs/{dag_run['dag_run_id']}"
    console.print(f"submitted {job.name}: DAG run {dag_run['dag_run_id']}\n  {url}")
    if not args.wait:
        return 0
    try:
        attempts = follow_with_progress(client, settings, job.name, dag_run["dag_run_id"], args.timeout_s)
    except AirflowUnavailable as e:
        err_console.print(f"[red]{e}[/]")
        return 3
    except TimeoutError as e:
        err_console.print(f"[yellow]{e}[/]; it goes on in Airflow")
        return 1
    _summary(attempts)
    outcome = run_outcome(settings, job.name, attempts[0].run if attempts else "")
    if outcome is not None:  # the one truth: what `status`, the view, the note and MLflow say
        console.print(f"run {attempts[0].run}: {outcome.line}")
        return outcome.exit_code
    last = attempts[-1] if attempts else None
    return 0 if last is not None and last.state == "success" and last.action in ("register", "finish") else 1


def run_outcome(settings: Settings, job: str, run: str) -> RunOutcome | None:
    """The run's outcome from the job state; None when the state cannot be read from here."""
    from trainyard.plugins.recovery.outcome import RunOutcome
    from trainyard.plugins.state.jobs import open_job_state

    if not run:
        return None
    try:
        info = open_job_state(settings.state_db).get_run(job, run)
    except Exception:  # noqa: BLE001 - a state this host cannot read: the DAG runs' states decide
        return None
    return RunOutcome.of_run(info.state, info.final_reason)


def _into_jobs_folder(spec: Path, name: str, jobs_dir: Path) -> tuple[Path, bool]:
    """The spec's place in the folder Airflow's DAG factory reads, and whether its content
    changed there: copied as `<job>.yaml` when the job is not there yet, and over the job's one
    copy when the spec was edited (a resubmit updates the job; attempts already running keep the
    spec they started with). Never a second copy of a job."""
    spec, jobs_dir = spec.resolve(), jobs_dir.resolve()
    if spec.parent == jobs_dir:
        return spec, False
    from trainyard.config.loader import read_spec_file

    for existing in sorted(jobs_dir.glob("*.y*ml")):
        other, _ = read_spec_file(existing)
        if other is not None and other.name == name:
            if existing.read_bytes() == spec.read_bytes():
                return existing, False
            shutil.copyfile(spec, existing)
            return existing, True
    jobs_dir.mkdir(parents=True, exist_ok=True)
    target = jobs_dir / f"{name}.yaml"
    shutil.copyfile(spec, target)
    return target, True


def _wait_for_dag(client: AirflowClient, dag_id: str, spec: Path, *, changed: bool = False) -> None:
    from trainyard.config.airflow import INVALID_SPEC_TAG

    deadline = time.monotonic() + DAG_WAIT_S
    if changed or dag_id not in client.dags():
        client.request_parse()  # a new or edited spec: parsed now, not at the next periodic parse
    while True:
        if dag_id in client.dags():
            details = client.dag_details(dag_id)
            if INVALID_SPEC_TAG not in {tag["name"] for tag in details.get("tags") or []}:
                return
            raise ValueError(f"Airflow's DAG {dag_id!r} says its spec does not validate there (its jobs folder, "
                             f"cluster and settings):\n{details.get('doc_md') or details.get('description')}")
        broken = [e for e in client.import_errors() if spec.name in e.get("stack_trace", "")]
        if broken:
            raise TimeoutError(f"Airflow cannot build the DAG: {broken[0]['stack_trace'][-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"Airflow has no DAG {dag_id!r} after {DAG_WAIT_S:g}s: is its jobs folder "
                               f"{spec.parent}? (TRAINYARD_JOBS_DIR of the Airflow components)")
        time.sleep(2)


def follow_with_progress(client: AirflowClient, settings: Settings, dag_id: str, first: str, timeout_s: float
            ) -> list[AttemptRun]:
    from rich.live import Live

    from trainyard.cli.output import err_console
    from trainyard.plugins.airflow_api import follow_training_run

    progress = _Progress(client, settings, dag_id)
    with Live(progress.table([], {}), console=err_console, refresh_per_second=2, transient=True) as live:
        return follow_training_run(client, dag_id, first, timeout_s=timeout_s,
                                   on_poll=lambda attempts, tasks: live.update(progress.table(attempts, tasks)))


class _Progress:
    """The live table: one row per attempt — its DAG run's state, the running task, and the
    step and loss the workers streamed to MLflow."""

    def __init__(self, client: AirflowClient, settings: Settings, dag_id: str) -> None:
        self.client, self.settings, self.dag_id = client, settings, dag_id
        self.mlflow_run_id = ""
        self.last = 0.0
        self.metrics = ("-", "-")

    def table(self, attempts: list[AttemptRun], tasks: dict[str, dict[str, Any]]) -> Any:
        from rich.table import Table

        if attempts and tasks and time.monotonic() - self.last > 3:
            self.last = time.monotonic()
            self.metrics = self._metrics(attempts[-1].dag_run_id, tasks)
        table = Table(title=f"{self.dag_id} run {attempts[-1].run if attempts else ''}", title_justify="left")
        for column in ("attempt", "state", "now", "step", "loss", "outcome"):
            table.add_column(column)
        for a in attempts:
            current = a is attempts[-1]
            running = [t for t, v in tasks.items() if v.get("state") in ("running", "deferred")] if current else []
            step, loss = self.metrics if current else ("", "")
            table.add_row(str(a.attempt), a.state, ", ".join(running)[:30], step, loss,
                          f"{a.outcome} → {a.action}" if a.outcome else "")
        return table

    def _metrics(self, dag_run_id: str, tasks: dict[str, dict[str, Any]]) -> tuple[str, str]:
        try:
            if not self.mlflow_run_id and tasks.get("launch_training", {}).get("state") == "success":
                self.mlflow_run_id = self.client.xcom(self.dag_id, dag_run_id, "launch_training",
                                                      key="mlflow_run_id") or ""
            if not self.mlflow_run_id:
                return self.metrics
            from trainyard.plugins.tracking.runs import client_for

            history = client_for(self.settings.mlflow_tracking_uri).get_metric_history(self.mlflow_run_id, "loss")
        except Exception:  # noqa: BLE001 - progress is best effort; the run's outcome is not
            return self.metrics
        if not history:
            return self.metrics
        last = max(history, key=lambda m: (m.step, m.timestamp))
        return str(last.step), f"{last.value:.3f}"


def _summary(attempts: list[AttemptRun]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from trainyard.cli.output import console

    table = Table(title="attempts", title_justify="left")
    for column in ("#", "DAG run", "outcome", "action", "why"):
        table.add_column(column, overflow="fold")
    for a in attempts:
        table.add_row(str(a.attempt), a.dag_run_id, a.outcome or a.state, a.action, escape(a.reason))
    console.print(table)
