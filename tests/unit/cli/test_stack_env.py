"""The environment the embedded stack gives its parts (`trainyard.cli.stack.Stack.env`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.cli.stack import Stack


def test_the_mlflow_ui_starts_without_a_job_runner_unless_asked(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Its huey consumer pools serve GenAI jobs nothing of ours submits; a deployment that wants
    them sets the variable."""
    monkeypatch.delenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", raising=False)
    assert Stack(home=tmp_path / "home").env()["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "true")
    assert Stack(home=tmp_path / "home").env()["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "true"
