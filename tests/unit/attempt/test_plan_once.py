"""An attempt asks the advisor once and checks its data once: the validation's search is the one
the plan step plans with and the MLflow run explains; `validate_data`'s report is the one the
launch logs. Counted through both ways an attempt runs — the DAG's tasks in this process, and
`trainyard launch` — on the fake cluster of the launcher-seam tests, with the search
(`planner.plan_job`, every path into the advisor's search goes through it) and the checks
(`data_quality.check_data_quality`) wrapped by counters. Before this was built the search ran
three times per attempt (validation, plan, MLflow's explanation)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.attempt.test_launcher_seam import FakeTI, _run
from tests.unit.attempt.test_launcher_seam import (
    world as world,  # the fixture: the fake cluster's home
)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of the advisor's search and of the data-quality checks, by name."""
    import trainyard.plugins.advisor as advisor
    from trainyard.plugins.advisor import planner
    from trainyard.plugins.validation import data_quality

    calls: Counter[str] = Counter()

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    search = counting("search", planner.plan_job)
    monkeypatch.setattr(planner, "plan_job", search)
    monkeypatch.setattr(advisor, "plan_job", search)  # `from trainyard.plugins.advisor import plan_job`
    monkeypatch.setattr(data_quality, "check_data_quality",
                        counting("data_quality", data_quality.check_data_quality))
    return calls


def test_the_dags_tasks_search_once_and_check_the_data_once(world: SimpleNamespace, counted: Counter[str]) -> None:
    from trainyard.operators.launch import LaunchTrainingOperator
    from trainyard.operators.placement import PlaceGangOperator, PlanParallelismOperator
    from trainyard.operators.validate import ValidateDataOperator, ValidateSpecOperator
    from trainyard.plugins.tracking.runs import client_for

    dag_run = SimpleNamespace(dag_id="seam-job", run_id="manual__1", conf={},
                              run_after=datetime(2026, 12, 1, tzinfo=UTC))
    context: dict[str, Any] = {"ti": FakeTI(), "dag_run": dag_run, "params": {}}
    for op in (ValidateSpecOperator(task_id="validate_spec", spec_path=str(world.spec)),
               ValidateDataOperator(task_id="validate_data"), PlanParallelismOperator(task_id="plan_parallelism"),
               PlaceGangOperator(task_id="place_gang"), LaunchTrainingOperator(task_id="launch_training")):
        _run(op, context)

    assert counted == {"search": 1, "data_quality": 1}
    run_id = context["ti"].xcom_pull("launch_training", key="mlflow_run_id")
    explained = client_for(world.settings.mlflow_tracking_uri).download_artifacts(run_id, "plan/explanation.txt")
    with open(explained) as f:
        assert "layouts considered" in f.read()  # the one search's answer, explained in the run


def test_trainyard_launch_searches_once_and_checks_the_data_once(world: SimpleNamespace,
                                                                  counted: Counter[str]) -> None:
    from trainyard.cli.main import main

    assert main(["launch", str(world.spec), "--run", "20261201t000000-0ce0ce"]) == 0
    assert counted == {"search": 1, "data_quality": 1}  # no validate_data here: the MLflow run's opening checks
    counted.clear()
    assert main(["launch", str(world.spec), "--run", "20261201t000000-0ce0cd", "--offline"]) == 0
    assert counted == {"search": 1, "data_quality": 1}  # offline: the plan step asks the advisor, once


def test_a_check_that_could_not_run_is_not_run_again_when_the_mlflow_run_opens(
        world: SimpleNamespace, counted: Counter[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`validate_data` said the checks could not run (a warning): the launch does not try again."""
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.attempt.steps import check_data, launch, open_attempt, place, plan
    from trainyard.plugins.data import datasets
    from trainyard.plugins.recovery.model import AttemptConf

    runtime = Runtime(world.settings)
    opened = open_attempt(world.spec, AttemptConf(run="20261201t000000-0ce0cf"), trigger_key="t/1", runtime=runtime)
    real = datasets.sample_rows
    monkeypatch.setattr(datasets, "sample_rows", lambda *a, **k: (_ for _ in ()).throw(OSError("shard unreadable")))
    checked = check_data(opened, runtime)
    monkeypatch.setattr(datasets, "sample_rows", real)
    assert checked.report is None and "could not run" in checked.warnings[0].message
    planned = plan(opened, runtime)
    assert launch(opened, planned, place(opened, planned, runtime), runtime, checked=checked) is not None
    assert counted == {"search": 1, "data_quality": 1}


def test_a_recovery_attempt_searches_once_and_keeps_the_data_its_run_passed(
        world: SimpleNamespace, counted: Counter[str], tmp_path: Path) -> None:
    """Attempt 0 crashes (its run folder fabricated); attempt 1, opened from the hand-over, asks
    the advisor once and checks no data (the run passed the same data)."""
    from tests.unit.recovery.runs import Rank, fabricate
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.attempt.steps import (
        check_data,
        conclude,
        launch,
        open_attempt,
        place,
        plan,
    )
    from trainyard.plugins.recovery.model import AttemptConf

    runtime, run = Runtime(world.settings), "20261201t000000-0ce0d0"
    first = open_attempt(world.spec, AttemptConf(run=run), trigger_key="t/1", runtime=runtime)
    checked = check_data(first, runtime)
    planned = plan(first, runtime)
    assert counted == {"search": 1, "data_quality": 1}
    handle = fabricate(tmp_path / "runs", [Rank(exit_code=0, step=9), Rank(exit_code=-9, step=9)], job="seam-job")
    concluded = conclude(first, handle, runtime, status=None, plan_used=planned.plan, mlflow_run_id="", by="test",
                         checked=checked)
    assert concluded is not None and concluded.next_conf is not None and concluded.next_conf.attempt == 1
    counted.clear()

    recovery = open_attempt(world.spec, concluded.next_conf, trigger_key="t/2", runtime=runtime)
    again = check_data(recovery, runtime)
    planned = plan(recovery, runtime)
    assert launch(recovery, planned, place(recovery, planned, runtime), runtime, checked=again) is not None
    assert again.unchanged and counted == {"search": 1}
