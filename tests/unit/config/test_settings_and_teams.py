from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from trainyard.config.settings import Settings
from trainyard.config.teams import Teams, load_teams
from trainyard.config.worker_env import WorkerEnv, is_reserved


def test_defaults_are_the_embedded_default(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    assert s.object_store == (tmp_path / "objects").as_uri()
    assert s.state_db == f"sqlite:///{tmp_path / 'state.db'}"
    assert s.mlflow_tracking_uri.startswith("sqlite:///")
    assert s.runs_dir == tmp_path / "runs"


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    monkeypatch.setenv("TRAINYARD_OBJECT_STORE", "s3://bucket/prefix")
    monkeypatch.setenv("TRAINYARD_MEMORY_FRACTION", "0.8")
    s = Settings()
    assert s.home == tmp_path and s.object_store == "s3://bucket/prefix" and s.memory_fraction == 0.8


def test_teams_file_loads_and_shares_fit() -> None:
    teams = load_teams()
    assert teams.get("nlp-research") is not None
    assert sum(t.share for t in teams.teams.values()) <= 1.0
    with pytest.raises(ValidationError, match=r"add up to 1\.20"):
        Teams.model_validate({"teams": {"a": {"share": 0.6}, "b": {"share": 0.6}}})


def test_worker_env_round_trip() -> None:
    env = WorkerEnv(job="j", run="r-test", attempt=2, plan="{}", spec="{}", object_store="file:///o",
                    checkpoint_uri="file:///o/jobs/j/checkpoints", heartbeat_dir="/tmp/hb",
                    mlflow_run_id="abc")
    variables = env.to_env()
    assert variables["TRAINYARD_ATTEMPT"] == "2" and variables["MLFLOW_RUN_ID"] == "abc"
    assert all(is_reserved(k) for k in variables)
    assert WorkerEnv.from_env(variables) == env
