"""Where a person opens a run or a model version in the MLflow UI: one home for the UI's routes
(the Trainyard view, the DAG's extra links and `make demo`'s summary all link here)."""

from __future__ import annotations

from urllib.parse import quote


def mlflow_run_url(ui_base: str, experiment_id: str, run_id: str) -> str:
    """`<ui>/#/experiments/<experiment>/runs/<run>`: the run page (metrics, params, artifacts)."""
    return f"{ui_base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def model_version_url(ui_base: str, model: str, version: str | int) -> str:
    """`<ui>/#/models/<name>/versions/<version>`: the registered version and its lineage."""
    return f"{ui_base.rstrip('/')}/#/models/{quote(model, safe='')}/versions/{version}"
