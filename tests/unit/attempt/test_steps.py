"""The attempt engine's steps without Airflow and without processes: opened on a real spec and
home, concluded on run folders in the launcher's own layout (`tests/unit/recovery/runs.py`),
with the job state checked after each step."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.unit.recovery.runs import Rank, fabricate
from tests.unit.tracking.factories import make_job
from trainyard.config.settings import Settings
from trainyard.plugins.attempt.launchers import Runtime
from trainyard.plugins.attempt.steps import (
    InvalidJob,
    Placed,
    conclude,
    launch,
    open_attempt,
    place,
    plan,
)
from trainyard.plugins.recovery.model import AttemptConf
from trainyard.plugins.state.jobs import JobStateStore

RUN = "20261201t000000-57e950"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[SimpleNamespace]:
    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    settings = Settings(home=tmp_path / "home")
    prepare_demo_dataset(open_store(settings.object_store).child(DEMO_PREFIX.rstrip("/")))
    spec = tmp_path / "steps-job.yaml"
    spec.write_text(yaml.safe_dump(make_job("steps-job").model_dump(mode="json", by_alias=True, exclude_none=True)))
    yield SimpleNamespace(settings=settings, spec=spec, runtime=Runtime(settings),
                          state=JobStateStore(settings.state_db))


def test_open_validates_opens_the_run_and_starts_the_attempt(world: SimpleNamespace) -> None:
    opened = open_attempt(world.spec, AttemptConf(run=RUN, max_steps=12), trigger_key="t/1", runtime=world.runtime)
    assert opened.job.spec.training.max_steps == 12  # the trigger's override applied
    assert world.state.get_run("steps-job", RUN).state == "starting"
    assert [a.attempt for a in world.state.attempts("steps-job", RUN)] == [0]
    assert open_attempt(world.spec, AttemptConf(run=RUN, max_steps=12), trigger_key="t/1",
                        runtime=world.runtime).conf == opened.conf  # a retried task: the same attempt


def test_an_invalid_spec_is_one_report_and_opens_nothing(world: SimpleNamespace) -> None:
    doc = yaml.safe_load(world.spec.read_text())
    doc["spec"]["hardware"]["gpuType"] = "H100"
    world.spec.write_text(yaml.safe_dump(doc))
    with pytest.raises(InvalidJob, match=r"LAUNCHER_UNAVAILABLE spec.hardware.gpuType: H100 devices are not on "
                                         r"cluster 'local'.*TRAINYARD_CLUSTER=h100-fleet"):
        open_attempt(world.spec, AttemptConf(run=RUN), trigger_key="t/1", runtime=world.runtime)
    assert world.state.list_runs("steps-job") == []


def test_conclude_reads_the_run_folder_and_records_the_decision(world: SimpleNamespace, tmp_path: Path) -> None:
    opened = open_attempt(world.spec, AttemptConf(run=RUN), trigger_key="t/1",
                          runtime=world.runtime)
    planned = plan(opened, world.runtime)
    handle = fabricate(tmp_path / "runs", [Rank(exit_code=0, step=9), Rank(exit_code=-9, step=9)], job="steps-job")
    concluded = conclude(opened, handle, world.runtime, status=None, plan_used=planned.plan, mlflow_run_id="",
                         by="test")
    assert concluded is not None
    assert (concluded.report.outcome, concluded.action.kind) == ("worker_crash", "restart")
    assert concluded.report.rank == 1 and "killed by SIGKILL" in concluded.report.reason
    assert concluded.next_conf is not None and concluded.next_conf.attempt == 1
    assert world.state.get_run("steps-job", RUN).state == "recovering"
    (attempt,) = world.state.attempts("steps-job", RUN)
    assert (attempt.outcome, attempt.action) == ("worker_crash", "restart")


def test_a_recovery_attempt_skips_the_data_checks_its_run_passed_until_the_data_changes(
        world: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.plugins.attempt.steps import check_data
    from trainyard.plugins.storage.store import open_store
    from trainyard.plugins.validation import data_quality
    from trainyard.worker.demo_data import DEMO_PREFIX

    opened = open_attempt(world.spec, AttemptConf(run=RUN), trigger_key="t/1", runtime=world.runtime)
    first = check_data(opened, world.runtime)
    assert first.report is not None and first.report.success and first.fingerprint and not first.unchanged
    handle = fabricate(tmp_path / "runs", [Rank(exit_code=0, step=9), Rank(exit_code=-9, step=9)], job="steps-job")
    concluded = conclude(opened, handle, world.runtime, status=None, plan_used=plan(opened, world.runtime).plan,
                         mlflow_run_id="", by="test", checked=first)
    assert concluded is not None and concluded.next_conf is not None
    assert concluded.next_conf.data_checked == first.fingerprint  # the hand-over carries it
    recovery = open_attempt(world.spec, concluded.next_conf, trigger_key="t/2", runtime=world.runtime)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("Great Expectations ran again on unchanged data")

    with monkeypatch.context() as m:
        m.setattr(data_quality, "run_data_quality", refuse)
        again = check_data(recovery, world.runtime)
    assert again.checked and again.unchanged and again.report is None and again.fingerprint == first.fingerprint
    # a shard more (the same rows again, so the checks' duplicate rate fails): checked, and refused
    store = open_store(world.settings.object_store).child(DEMO_PREFIX.rstrip("/"))
    store.put_bytes("shard-99999.jsonl", store.get_bytes("shard-00000.jsonl"))
    with pytest.raises(InvalidJob, match="fails its quality checks"):
        check_data(recovery, world.runtime)


def test_data_checks_asked_for_without_great_expectations_end_the_run_saying_which_extra(
        world: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Airflow with `trainyard[airflow]` but not `[validation]`: a spec that asks for the
    checks is refused with the fix, never run unchecked."""
    import importlib.util

    from trainyard.plugins.attempt.steps import check_data

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "great_expectations" else real(name, *a))
    opened = open_attempt(world.spec, AttemptConf(run=RUN), trigger_key="t/1", runtime=world.runtime)
    with pytest.raises(InvalidJob, match=re.escape("install trainyard[validation]")):
        check_data(opened, world.runtime)
    info = world.state.get_run("steps-job", RUN)
    assert info.state == "failed" and "Great Expectations is not installed" in info.final_reason


def test_params_only_a_managed_script_honours_are_refused_for_a_plain_one(world: SimpleNamespace,
                                                                         tmp_path: Path) -> None:
    """Never ignored without a word: `max_steps` and the worker's fault Params need the session."""
    plain = tmp_path / "plain_train.py"
    plain.write_text("import torch\nprint('training my own way')\n")
    doc = yaml.safe_load(world.spec.read_text())
    doc["spec"]["source"]["entrypoint"] = str(plain)
    world.spec.write_text(yaml.safe_dump(doc))
    with pytest.raises(InvalidJob, match=r"max_steps, fault_kill_at_step: only a managed script honours them"):
        open_attempt(world.spec, AttemptConf(run=RUN, max_steps=5, faults={"kill_at_step": 3}),
                     trigger_key="t/1", runtime=world.runtime)
    open_attempt(world.spec, AttemptConf(run=RUN, learning_rate=0.1), trigger_key="t/2", runtime=world.runtime)
    plain.write_text("import trainyard\n" + plain.read_text())  # managed now: the Params reach it
    open_attempt(world.spec, AttemptConf(run="20261201t000000-bbbbbb", max_steps=5), trigger_key="t/3",
                 runtime=world.runtime)


def test_a_launch_that_fails_for_good_ends_the_run_failed_with_the_message(world: SimpleNamespace) -> None:
    opened = open_attempt(world.spec, AttemptConf(run=RUN, start_from="models:/nobody"),
                          trigger_key="t/1", runtime=world.runtime)
    planned = plan(opened, world.runtime)
    placed = place(opened, planned, world.runtime)
    with pytest.raises(Exception, match="models:/<name>@<alias>"):
        launch(opened, planned, Placed(placement=placed.placement), world.runtime)
    info = world.state.get_run("steps-job", RUN)
    assert info.state == "failed" and "the launch failed" in info.final_reason
    concluded = conclude(opened, None, world.runtime, status=None, plan_used=None, mlflow_run_id="", by="test")
    assert concluded is not None and concluded.report.outcome == "launch_failed"
    assert concluded.action.kind == "give_up" and "models:/<name>@<alias>" in concluded.action.reason


def test_a_dry_run_launches_nothing_and_ends_the_run(world: SimpleNamespace) -> None:
    opened = open_attempt(world.spec, AttemptConf(run=RUN, dry_run=True), trigger_key="t/1", runtime=world.runtime)
    planned = plan(opened, world.runtime)
    placed = place(opened, planned, world.runtime)
    assert launch(opened, planned, placed, world.runtime) is None
    info = world.state.get_run("steps-job", RUN)
    assert info.state == "cancelled" and "dry run" in info.final_reason
    assert conclude(opened, None, world.runtime, status=None, plan_used=None, mlflow_run_id="", by="t") is None


def test_a_launcher_that_refuses_the_spec_ends_the_run_and_its_mlflow_run_failed(world: SimpleNamespace) -> None:
    from trainyard.plugins.attempt.steps import AttemptNotStarted
    from trainyard.plugins.tracking.runs import client_for

    doc = yaml.safe_load(world.spec.read_text())
    doc["spec"]["source"]["entrypoint"] = "worker/no_such_train.py"
    world.spec.write_text(yaml.safe_dump(doc))
    opened = open_attempt(world.spec, AttemptConf(run=RUN), trigger_key="t/1", runtime=world.runtime)
    planned = plan(opened, world.runtime)
    placed = place(opened, planned, world.runtime)
    with pytest.raises(AttemptNotStarted, match=re.escape("the launch failed: entrypoint 'worker/no_such_train.py' not found")):
        launch(opened, planned, placed, world.runtime)
    info = world.state.get_run("steps-job", RUN)
    assert info.state == "failed" and "no_such_train.py" in info.final_reason
    client = client_for(world.settings.mlflow_tracking_uri)
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("demo/tiny-lm").experiment_id])
    assert mlflow_run.info.status == "FAILED"  # opened for the launch, not left running


def test_the_launch_log_says_fresh_start_or_the_step_it_resumes_from() -> None:
    from trainyard.plugins.attempt.steps import start_point

    root = "s3://store/jobs/j/runs/r/checkpoints"
    assert start_point("", []) == "fresh start (the run has no checkpoint yet)"
    assert start_point("", [(50, f"{root}/step-00000050/MANIFEST.json"), (100, f"{root}/step-00000100/MANIFEST.json")]
                       ).startswith(f"resuming from step 100, the run's newest checkpoint ({root}/step-00000100/")
    assert start_point(f"{root}/step-00000050/MANIFEST.json", []) == \
        f"resuming from step 50 ({root}/step-00000050/MANIFEST.json)"


def test_the_nodes_the_pods_were_bound_to_become_the_attempts_handle(world: SimpleNamespace) -> None:
    """A Kubernetes gang's node ranks follow the scheduler's binding, not the placement's order:
    the first look that sees every pod bound keeps that order as the attempt's handle (what the
    conclusion blames and cordons by, and `trainyard status` shows); once the Job is gone, the
    conclusion still finds it there."""
    from trainyard.plugins.attempt.steps import _bound
    from trainyard.plugins.attempt.watching import record_bound
    from trainyard.plugins.run.model import RunHandle, RunStatus

    open_attempt(world.spec, AttemptConf(run=RUN), trigger_key="t/1", runtime=world.runtime)
    placed = RunHandle(kind="kubernetes", job="steps-job", run=RUN, attempt=0, world_size=3, namespace="ns",
                       name="steps-job-57e950", uid="u1", nodes=["n-a", "n-b", "n-c"])
    world.state.set_handle("steps-job", RUN, 0, placed)
    pending = RunStatus(state="pending")
    assert record_bound(placed, pending, world.runtime) is None
    running = RunStatus(state="running", nodes=["n-c", "n-a", "n-b"])
    bound = record_bound(placed, running, world.runtime)
    assert bound is not None and bound.nodes == bound.gang_nodes == ["n-c", "n-a", "n-b"]
    (attempt,) = world.state.attempts("steps-job", RUN)
    assert attempt.run_handle == bound
    assert record_bound(bound, running, world.runtime) is None  # nothing new: nothing written
    gone = RunStatus(state="stopped", message="the Job is gone")  # its pods with it
    assert _bound(placed, gone, world.state, apply=True).nodes == ["n-c", "n-a", "n-b"]
    other = placed.model_copy(update={"uid": "u2"})  # another Job of the name: not this attempt's binding
    assert _bound(other, gone, world.state, apply=True).nodes == ["n-a", "n-b", "n-c"]
