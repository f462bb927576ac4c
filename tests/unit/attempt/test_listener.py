"""The steps announce an attempt's events to the listener `listener_for` picks — the MLflow one
here, wrapped to record the calls — and call MLflow no other way: `trainyard launch` on the fake
cluster of the launcher-seam tests, then the run's MLflow record as the hooks left it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.attempt.test_launcher_seam import (
    world as world,  # the fixture: the fake cluster's home
)
from trainyard.plugins.attempt.listener import AttemptListener, MlflowListener


class Recording:
    """The MLflow listener, each hook's name noted before it runs."""

    def __init__(self, inner: AttemptListener) -> None:
        self.inner, self.events = inner, []

    def __getattr__(self, name: str) -> Any:
        hook = getattr(self.inner, name)

        def noted(*args: Any, **kwargs: Any) -> Any:
            self.events.append(name)
            return hook(*args, **kwargs)
        return noted


def test_trainyard_launch_tells_the_listener_each_event_once(world: SimpleNamespace,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.cli.main import main
    from trainyard.plugins.attempt import steps
    from trainyard.plugins.state.jobs import JobStateStore
    from trainyard.plugins.tracking.runs import client_for

    recording = Recording(MlflowListener(world.settings))
    monkeypatch.setattr(steps, "listener_for", lambda runtime: recording)
    assert main(["launch", str(world.spec), "--run", "20261201t000000-11573e"]) == 0
    assert recording.events == ["created", "launched", "concluded", "closed"]
    info = JobStateStore(world.settings.state_db).get_run("seam-job", "20261201t000000-11573e")
    run = client_for(world.settings.mlflow_tracking_uri).get_run(info.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.tags["trainyard.data_quality"] == "passed"
    # the description, rewritten at the close: the outcome, the Trainyard view (no DAG run: `trainyard launch`)
    note = run.data.tags["mlflow.note.content"]
    assert note.startswith("**completed, not registered — "), note  # the run's one outcome line
    assert f"({world.settings.airflow_url}/trainyard/jobs/seam-job/runs/20261201t000000-11573e)" in note
    assert "Airflow:" not in note


def test_a_refused_launch_tells_the_listener_not_launched(world: SimpleNamespace,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.fake_launcher import FakeLauncher
    from trainyard.cli.main import main
    from trainyard.plugins.attempt import steps

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ValueError("the fake launcher refuses")

    monkeypatch.setattr(FakeLauncher, "submit", refuse)
    recording = Recording(MlflowListener(world.settings))
    monkeypatch.setattr(steps, "listener_for", lambda runtime: recording)
    assert main(["launch", str(world.spec), "--run", "20261201t000000-11573f"]) == 1
    assert recording.events == ["created", "not_launched"]
