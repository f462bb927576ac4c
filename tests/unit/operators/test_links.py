"""The extra links of `launch_training` and `register_model` (Airflow 3 `BaseOperatorLink`s):
computed at the task's end from the running task instance's XCom, each resolves to the page it
names — the MLflow run (model-training pages), the Trainyard tab of the DAG run, the model version."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.tracking.factories import make_job, make_plan
from trainyard.operators.launch import LAUNCH
from trainyard.operators.links import MlflowRunLink, ModelVersionLink, TrainyardViewLink

UI = "http://mlflow.example:5000"


class _TaskInstance(SimpleNamespace):
    """What a link's `get_link` receives at the task's end: a task instance that pulls XCom."""

    def xcom_pull(self, *, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids, key))


@pytest.fixture
def tracking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from trainyard.config.settings import get_settings

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("TRAINYARD_MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("TRAINYARD_MLFLOW_UI_URL", UI)
    get_settings.cache_clear()
    yield uri
    get_settings.cache_clear()


def test_the_mlflow_run_link_opens_the_runs_model_training_page(tracking: str) -> None:
    from trainyard.plugins.tracking.runs import client_for, start_or_resume_run

    rid = start_or_resume_run(make_job("links"), make_plan(), tracking_uri=tracking, attempt=0, trigger_id="r1")
    experiment = client_for(tracking).get_run(rid).info.experiment_id
    ti = _TaskInstance(dag_id="links", run_id="r1__attempt-0", task_id=LAUNCH,
                       xcoms={(LAUNCH, "mlflow_run_id"): rid})
    url = MlflowRunLink().get_link(None, ti_key=ti)  # type: ignore[arg-type]
    assert url == f"{UI}/#/experiments/{experiment}/runs/{rid}?workflowType=machine_learning"
    assert MlflowRunLink().get_link(None, ti_key=_TaskInstance(xcoms={})) == ""  # type: ignore[arg-type]


def test_the_trainyard_link_is_the_dag_runs_tab() -> None:
    ti = _TaskInstance(dag_id="tiny-lm", run_id="manual__2026-05-01T12:00:00+00:00", task_id=LAUNCH, xcoms={})
    url = TrainyardViewLink().get_link(None, ti_key=ti)  # type: ignore[arg-type]
    assert url.endswith("/dags/tiny-lm/runs/manual__2026-05-01T12%3A00%3A00%2B00%3A00/plugin/trainyard-run")


def test_the_model_version_link_names_the_registered_version(tracking: str) -> None:
    ti = _TaskInstance(dag_id="tiny-lm", run_id="r1", task_id="register_model",
                       xcoms={("register_model", "return_value"): {"model": "demo.tiny-lm", "version": 3}})
    assert ModelVersionLink().get_link(None, ti_key=ti) == (  # type: ignore[arg-type]
        f"{UI}/#/models/demo.tiny-lm/versions/3?workflowType=machine_learning")
    nothing = _TaskInstance(task_id="register_model", xcoms={})
    assert ModelVersionLink().get_link(None, ti_key=nothing) == ""  # type: ignore[arg-type]
