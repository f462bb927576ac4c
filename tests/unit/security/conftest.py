"""Fixtures of the hostile-input suite: settings rooted in a temporary home holding two jobs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.security.hostile import World, build_world
from trainyard.config.settings import get_settings


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    w = build_world(tmp_path)
    monkeypatch.setenv("TRAINYARD_HOME", str(w.home))
    monkeypatch.setenv("TRAINYARD_JOBS_DIR", str(w.jobs_dir))
    monkeypatch.setenv("TRAINYARD_CLUSTER", "local")
    for var in ("TRAINYARD_OBJECT_STORE", "TRAINYARD_STATE_DB", "TRAINYARD_MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    get_settings.cache_clear()
    yield w
    get_settings.cache_clear()
