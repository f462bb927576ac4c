"""The buttons a Trainyard task shows in Airflow's task page ("extra links"): the training run's
MLflow run, its Trainyard view, the model version it registered.

Airflow 3 computes a link once, when the task ends on its worker (`get_link` receives the running
task instance as `ti_key`), and stores it in XCom under the link's key; the UI only reads that
XCom. So a link may look things up here — the MLflow run's experiment, the registered version —
and one that cannot be made is empty (Airflow logs the error; the task's own state is untouched).
The provider lists these classes (`trainyard.provider`). Imports nothing heavy: the DAG file
imports the operators that carry them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

VIEW_ROUTE = "trainyard-run"
"""The `url_route` of the DAG-run external view (`plugins.trainyard_plugin.TrainyardPlugin`)."""


def _airflow_base() -> str:
    """The UI's base URL (`[api] base_url`); '' keeps the link relative to the UI's own host."""
    from airflow.configuration import conf

    return (conf.get("api", "base_url", fallback="") or "").rstrip("/")


class TrainyardViewLink(BaseOperatorLink):
    """The Trainyard tab of this DAG run: plan, placement map, progress, checkpoints, recovery."""

    name = "Trainyard view"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from trainyard.plugins.tracking.ui_links import airflow_dag_run_url

        return f"{airflow_dag_run_url(_airflow_base(), ti_key.dag_id, ti_key.run_id)}/plugin/{VIEW_ROUTE}"


class MlflowRunLink(BaseOperatorLink):
    """The training run's MLflow run (every attempt continues the same one)."""

    name = "MLflow run"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from trainyard.operators.launch import LAUNCH  # here: that module imports this one

        ti: Any = ti_key  # at the task's end: the running task instance, which can pull XCom
        run_id = ti.xcom_pull(task_ids=LAUNCH, key="mlflow_run_id")
        if not run_id:
            return ""
        from trainyard.operators.common import settings
        from trainyard.plugins.tracking.runs import client_for
        from trainyard.plugins.tracking.ui_links import mlflow_run_url

        s = settings()
        experiment_id = client_for(s.mlflow_tracking_uri).get_run(run_id).info.experiment_id
        return mlflow_run_url(s.mlflow_ui_url, experiment_id, run_id)


class ModelVersionLink(BaseOperatorLink):
    """The model version `register_model` created (its return value names it)."""

    name = "Model version"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        ti: Any = ti_key
        registered = ti.xcom_pull(task_ids=ti.task_id) or {}
        if not registered.get("model") or not registered.get("version"):
            return ""
        from trainyard.operators.common import settings
        from trainyard.plugins.tracking.ui_links import model_version_url

        return model_version_url(settings().mlflow_ui_url, registered["model"], registered["version"])
