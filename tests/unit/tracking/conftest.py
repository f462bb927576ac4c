"""A real SQLite-backed MLflow store, created once per session (its migrations take seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def sqlite_tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`sqlite:///…/mlflow.db`; tests isolate themselves by experiment name or run."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()  # run the migrations now, not inside a test
    return uri


@pytest.fixture
def mlflow_run(sqlite_tracking_uri: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh run in an experiment of its own, artifacts under tmp_path."""
    from mlflow import MlflowClient

    client = MlflowClient(sqlite_tracking_uri)
    exp = client.create_experiment(request.node.nodeid, artifact_location=(tmp_path / "art").as_uri())
    return client.create_run(exp).info.run_id
