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
    from trainyard.plugins.control_room.locate import airflow_dag_run_id
    from trainyard.plugins.control_room.urls import view_url
    from trainyard.plugins.state.jobs import open_job_state
    from trainyard.plugins.tracking.description import RunLinks
    from trainyard.plugins.tracking.ui_links import airflow_dag_run_url

    dag_runs = []
    for a in open_job_state(settings.state_db).attempts(job, run):
        dag_run = airflow_dag_run_id(job, a.dag_run_id)
        if dag_run:
            dag_runs.append((f"attempt {a.attempt}: DAG run {dag_run}",
                             airflow_dag_run_url(settings.airflow_url, job, dag_run)))
    return RunLinks(dag_runs=dag_runs, view_url=view_url(settings.airflow_url, job, run) if run else "")


def describe_run(job: str, run: str, mlflow_run_id: str, settings: Settings, *, reason: str = "") -> None:
    """Write the run's description from its recorded status (`trainyard.status`) and `reason`."""
    from trainyard.plugins.tracking.description import (
        outcome_line,
        run_description,
        set_run_description,
    )
    from trainyard.plugins.tracking.runs import TAG, client_for

    uri = settings.mlflow_tracking_uri
    try:
        status = client_for(uri).get_run(mlflow_run_id).data.tags.get(TAG + "status", "running")
        text = run_description(job=job, run=run or "-", outcome=outcome_line(status, reason),
                               links=run_links(job, run, settings))
        set_run_description(mlflow_run_id, text, tracking_uri=uri)
    except Exception as e:  # noqa: BLE001 - the description is a convenience; tracking goes on
        log.warning("description of MLflow run %s not written: %s: %s", mlflow_run_id, type(e).__name__, e)
