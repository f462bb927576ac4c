"""The launcher seam (DESIGN §1): a backend registered for a cluster mode of its own is what the
DAG's tasks, the training trigger and `trainyard launch` all get from `launcher_for` — none of
them names a launcher. And a mode nobody wired is refused at validation, never at run time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from tests.support import fake_launcher
from tests.support.fake_launcher import FakeLauncher, fake_cluster
from tests.unit.tracking.factories import make_job
from trainyard.config.cluster import load_cluster
from trainyard.config.settings import Settings, get_settings
from trainyard.plugins.attempt.launchers import (
    LauncherNotWired,
    Runtime,
    launch_problems,
    launcher_for,
)
from trainyard.plugins.run.model import RunHandle


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """A home on the fake cluster, its launcher registered, the demo dataset in its store."""
    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    cluster = fake_cluster(tmp_path / "fake-fleet.yaml")
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINYARD_CLUSTER", str(cluster))
    monkeypatch.setenv("TRAINYARD_LAUNCHERS", json.dumps({fake_launcher.MODE: fake_launcher.BACKEND}))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    get_settings.cache_clear()
    settings = get_settings()
    prepare_demo_dataset(open_store(settings.object_store).child(DEMO_PREFIX.rstrip("/")))
    spec = tmp_path / "seam-job.yaml"
    doc = make_job("seam-job").model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["spec"]["training"]["maxSteps"] = fake_launcher.STEPS
    spec.write_text(yaml.safe_dump(doc))
    yield SimpleNamespace(settings=settings, spec=spec, cluster=load_cluster(cluster))
    get_settings.cache_clear()


def test_launcher_for_picks_the_registered_backend_by_mode_and_by_handle_kind(world: SimpleNamespace) -> None:
    runtime = Runtime(world.settings)
    assert isinstance(launcher_for(world.cluster, runtime), FakeLauncher)
    handle = RunHandle(kind="fake", job="j", run="r", attempt=0, world_size=1)
    assert isinstance(launcher_for(handle, runtime), FakeLauncher)
    assert launch_problems(make_job("seam-job"), world.cluster, world.settings) == []


def test_a_mode_nobody_wired_is_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")  # no extra launchers
    cluster = load_cluster(fake_cluster(tmp_path / "fake-fleet.yaml"))
    (problem,) = launch_problems(make_job("seam-job"), cluster, settings)
    assert problem.code.value == "LAUNCHER_UNAVAILABLE" and "mode 'fake'" in problem.message
    assert "wired: kubernetes, local" in problem.message
    with pytest.raises(LauncherNotWired, match="no launcher is wired for mode 'fake'"):
        launcher_for(cluster, Runtime(settings))


def test_devices_only_another_cluster_has_are_refused_naming_that_cluster(tmp_path: Path) -> None:
    (problem,) = launch_problems(make_job("h100-job", gpu_type="H100", gpu_count=8), load_cluster("local"),
                                 Settings(home=tmp_path / "home"))
    assert problem.code.value == "LAUNCHER_UNAVAILABLE"
    assert "H100 devices are not on cluster 'local'" in problem.message
    assert "TRAINYARD_CLUSTER=h100-fleet" in problem.hint and "--cluster h100-fleet" in problem.hint


def test_a_kubernetes_cluster_refuses_a_spec_without_an_image_before_allocation(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    job = make_job("no-image", gpu_count=2)
    assert job.spec.image is None
    (problem,) = launch_problems(job, load_cluster("kube-sim"), settings)
    assert (problem.code.value, problem.path) == ("LAUNCHER_UNAVAILABLE", "spec.image")
    assert "cluster 'kube-sim' runs jobs as pods" in problem.message and "spec.image" in problem.hint
    with_image = job.model_copy(update={"spec": job.spec.model_copy(update={"image": "registry.example.com/x:1"})})
    assert launch_problems(with_image, load_cluster("kube-sim"), settings) == []
    assert launch_problems(job, load_cluster("local"), settings) == []  # the local launcher ignores it


def test_a_branch_without_a_commit_is_refused_here_and_warned_of_on_a_cluster_of_pods(tmp_path: Path) -> None:
    from trainyard.config.spec import GitSource

    settings = Settings(home=tmp_path / "home")
    job = make_job("from-branch", gpu_count=2)
    source = job.spec.source.model_copy(update={"git": GitSource(repo="https://example.com/team/code.git")})
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"source": source,
                                                                     "image": "registry.example.com/x:1"})})
    (here,) = launch_problems(job, load_cluster("local"), settings)
    assert (here.path, here.severity) == ("spec.source.git.commit", "error")
    (pods,) = launch_problems(job, load_cluster("kube-sim"), settings)
    assert (pods.path, pods.severity) == ("spec.source.git.commit", "warning") and "'main'" in pods.message


class FakeTI:
    """The XCom side of a task instance, for running the DAG's operators in this process."""

    def __init__(self) -> None:
        self.xcoms: dict[tuple[str, str], Any] = {}
        self.task_id = ""

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.task_id, key)] = json.loads(json.dumps(value))

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids, key))


def _run(op: Any, context: dict[str, Any]) -> Any:
    """`execute` as the task runner calls it: the return value is the task's XCom."""
    from airflow.sdk.exceptions import TaskDeferred

    context["ti"].task_id = op.task_id
    try:
        result = op.execute(context)
    except TaskDeferred as deferred:  # the triggerer's part, then the task resumes
        trigger, method = deferred.trigger, deferred.method_name

        async def first() -> Any:
            return (await trigger.run().asend(None)).payload

        event = asyncio.run(asyncio.wait_for(first(), timeout=60))
        result = getattr(op, method)(context, event)
    context["ti"].xcom_push("return_value", result)
    return result


def test_the_dags_tasks_and_the_trigger_launch_and_watch_through_the_registered_backend(
        world: SimpleNamespace) -> None:
    from trainyard.operators.launch import LaunchTrainingOperator
    from trainyard.operators.outcome import ClassifyOutcomeOperator
    from trainyard.operators.placement import (
        PlaceGangOperator,
        PlanParallelismOperator,
        ReleaseGangOperator,
    )
    from trainyard.operators.validate import ValidateSpecOperator
    from trainyard.plugins.state.jobs import JobStateStore
    from trainyard.sensors.watch import WatchTrainingSensor

    dag_run = SimpleNamespace(dag_id="seam-job", run_id="manual__1", conf={"fault_kill_rank": 1,
                                                                              "fault_kill_at_step": 3},
                              run_after=datetime(2026, 12, 1, tzinfo=UTC))
    context: dict[str, Any] = {"ti": FakeTI(), "dag_run": dag_run, "params": {}}
    opened = _run(ValidateSpecOperator(task_id="validate_spec", spec_path=str(world.spec)), context)
    for op in (PlanParallelismOperator(task_id="plan_parallelism"), PlaceGangOperator(task_id="place_gang"),
               LaunchTrainingOperator(task_id="launch_training")):
        _run(op, context)
    handle = RunHandle.model_validate(context["ti"].xcom_pull("launch_training"))
    assert handle.kind == "fake"
    final = _run(WatchTrainingSensor(task_id="watch_training", poll_interval_s=0.01), context)
    assert final["state"] == "succeeded"  # through the trigger: the first look saw it running
    verdict = _run(ClassifyOutcomeOperator(task_id="classify_outcome"), context)
    _run(ReleaseGangOperator(task_id="release_gang"), context)
    assert verdict == {"outcome": "completed", "action": "finish"}  # the fake ranks write no checkpoint
    seen = fake_launcher.calls(handle.run_dir)
    assert seen[0]["call"] == "submit" and seen[0]["faults"] == "sigkill@3:1"  # the form's fault, to the worker
    assert {c["call"] for c in seen} >= {"submit", "poll", "settle"}
    state = JobStateStore(world.settings.state_db)
    (attempt,) = state.attempts("seam-job", opened["run"])
    assert attempt.run_handle == handle and attempt.outcome == "completed"


def test_trainyard_launch_runs_on_the_registered_backend_and_records_the_job_state(world: SimpleNamespace) -> None:
    import os

    from trainyard.cli.main import main
    from trainyard.plugins.state.jobs import JobStateStore

    assert main(["launch", str(world.spec), "--run", "20261201t000000-5ea111"]) == 0
    state = JobStateStore(world.settings.state_db)
    info = state.get_run("seam-job", "20261201t000000-5ea111")
    (attempt,) = state.attempts("seam-job", info.run)
    assert (info.state, attempt.outcome, attempt.action) == ("completed", "completed", "finish")
    seen = fake_launcher.calls(attempt.run_handle.run_dir)
    assert {c["pid"] for c in seen} == {os.getpid()} and seen[0]["call"] == "submit"
