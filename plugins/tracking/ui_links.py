"""Where a person opens a run or a model version in the MLflow UI, or a DAG run in Airflow's: one
home for the UIs' routes (the Trainyard view, the DAG's extra links, the MLflow run's description
and `make demo`'s summary all link here).

MLflow 3.17's UI no longer reads the experiment's `mlflow.experimentKind` tag to choose between its
GenAI and model-training pages: a global "workflow type" switch decides (its JS: the URL's
`workflowType` query parameter, else the browser's `mlflow.workflowType` local storage, else
`genai`). So a fresh browser opened our experiment on Traces and "Detect issues" (issue 57). Every
link we hand out carries `workflowType=machine_learning`; the UI keeps the parameter while a person
moves between the experiment's tabs and a run's pages.
"""

from __future__ import annotations

from urllib.parse import quote

WORKFLOW_QUERY = "workflowType=machine_learning"
"""The query (inside the hash route) that opens MLflow's model-training pages."""


def mlflow_run_url(ui_base: str, experiment_id: str, run_id: str, *, tab: str = "") -> str:
    """`<ui>/#/experiments/<experiment>/runs/<run>[/<tab>]?workflowType=machine_learning`: the run
    page (its description, metrics, params, artifacts); `tab="model-metrics"` opens its charts."""
    path = f"/{tab}" if tab else ""
    return f"{ui_base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}{path}?{WORKFLOW_QUERY}"


def experiment_url(ui_base: str, experiment_id: str) -> str:
    """`<ui>/#/experiments/<experiment>?workflowType=machine_learning`: the runs table and charts."""
    return f"{ui_base.rstrip('/')}/#/experiments/{experiment_id}?{WORKFLOW_QUERY}"


def model_version_url(ui_base: str, model: str, version: str | int) -> str:
    """`<ui>/#/models/<name>/versions/<version>`: the registered version and its lineage."""
    return f"{ui_base.rstrip('/')}/#/models/{quote(model, safe='')}/versions/{version}?{WORKFLOW_QUERY}"


def airflow_dag_run_url(airflow_base: str, dag_id: str, dag_run_id: str) -> str:
    """`<airflow>/dags/<dag>/runs/<dag run>`: one attempt of a training run in Airflow's UI
    (`airflow_base` '' keeps it relative to the UI's own host)."""
    return f"{airflow_base.rstrip('/')}/dags/{quote(dag_id, safe='')}/runs/{quote(dag_run_id, safe='')}"


# -- the Trainyard view (the app `plugins/control_room` serves inside Airflow) --------------------

URL_PREFIX = "/trainyard"
"""Where the plugin mounts the view's app in Airflow's api-server."""


def view_path(job: str, run: str) -> str:
    """The path of a training run's page, from Airflow's root."""
    return f"{URL_PREFIX}/jobs/{quote(job, safe='')}/runs/{quote(run, safe='')}"


def view_url(airflow_url: str, job: str, run: str) -> str:
    """The page of a training run on the Airflow at `airflow_url` (`TRAINYARD_AIRFLOW_URL`)."""
    return airflow_url.rstrip("/") + view_path(job, run)
