"""Keep the MLflow run's description true: its outcome line and its links back to Airflow (every
attempt's DAG run) and to the Trainyard view, rewritten at each turn of the run (opened, an
attempt concluded, closed) by the attempt listener. Best effort: a description that cannot be
written is said in the log and never fails the task that tracks the run."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.plugins.tracking.description import RunLinks

log = logging.getLogger(__name__)


def run_links(job: str, run: str, settings: Settings) -> RunLinks:
    """The run's Trainyard view and each attempt's DAG run (from the job state), as Airflow's
    UI at `TRAINYARD_AIRFLOW_URL` serves them."""
    from trainyard.plugins.state.jobs import airflow_dag_run_id, open_job_state
    from trainyard.plugins.tracking.description import RunLinks
    from trainyard.plugins.tracking.ui_links import airflow_dag_run_url, view_url

    dag_runs = []
    for a in open_job_state(settings.state_db).attempts(job, run):
        dag_run = airflow_dag_run_id(job, a.dag_run_id)
        if dag_run:
            dag_runs.append((f"attempt {a.attempt}: DAG run {dag_run}",
                             airflow_dag_run_url(settings.airflow_url, job, dag_run)))
    return RunLinks(dag_runs=dag_runs, view_url=view_url(settings.airflow_url, job, run) if run else "")


def describe_run(job: str, run: str, mlflow_run_id: str, settings: Settings, *, reason: str = "") -> None:
    """Write the run's description: the run's one outcome line (`RunOutcome`, read from the job
    state as every other surface reads it) once it is over; while it goes on, its lifecycle state
    and `reason` (why an attempt just ended)."""
    from trainyard.plugins.recovery.outcome import RunOutcome
    from trainyard.plugins.state.jobs import open_job_state
    from trainyard.plugins.tracking.description import (
        live_line,
        run_description,
        set_run_description,
    )

    try:
        info = open_job_state(settings.state_db).get_run(job, run)
        outcome = RunOutcome.of_run(info.state, info.final_reason)
        line = outcome.line if outcome.over else live_line(info.state, reason)
        text = run_description(job=job, run=run or "-", outcome=line, links=run_links(job, run, settings))
        set_run_description(mlflow_run_id, text, tracking_uri=settings.mlflow_tracking_uri)
    except Exception as e:  # noqa: BLE001 - the description is a convenience; tracking goes on
        log.warning("description of MLflow run %s not written: %s: %s", mlflow_run_id, type(e).__name__, e)
