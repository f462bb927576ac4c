"""One recorded training run (`recorded.py`) per module: a real job-state database (SQLite),
a real MLflow store (SQLite) and a real object store (a folder), all under a temporary home."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.control_room.recorded import Recorded, record_run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("control-room")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()  # migrations once, outside the tests' own time
    rec = record_run(root / "home", uri)
    yield rec
    rec.store.close()
