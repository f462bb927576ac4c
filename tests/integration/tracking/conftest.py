"""One real `mlflow server` (SQLite backend, proxied artifacts) per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.tracking.mlflow_servers import MlflowServer, start_mlflow_server


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    root = tmp_path_factory.mktemp("mlflow-server")
    server = start_mlflow_server(f"sqlite:///{root / 'mlflow.db'}", root / "artifacts", root / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sqlite_tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite store used directly (no server), migrated once per session."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("mlflow-sqlite")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()
    return uri
