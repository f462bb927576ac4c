"""The product as users meet it: a job's DAG in a real Airflow (scheduler, dag-processor,
triggerer, api-server), triggered through the REST API, training the tiny 2-rank CPU job.

The folder's shared stack (`conftest.py`); each test triggers training runs of its own, and
the resumed run is compared with an uninterrupted one of the first test (one fixture trains
them; a third run of the same spec would only repeat it).
What is checked is what the run left behind — the platform state, the object store, MLflow —
not what was printed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.airflow_stack import DAG_ID, RunningStack
from trainyard.plugins.airflow_api import AttemptRun

pytestmark = pytest.mark.slow

STEPS = 60
"""Checkpoints every 50 steps (the demo spec): a crash after step 50 resumes from step 50."""


@pytest.fixture(scope="module")
def stack(shared: RunningStack) -> RunningStack:
    return shared  # the demo job's DAG is in every stack's jobs folder


@pytest.fixture(scope="module")
def uninterrupted(stack: RunningStack) -> list[list[AttemptRun]]:
    """Two triggers of the same spec at once, nothing injected: the first test's subject, and
    the weights an uninterrupted run ends with, which the resumed run of the next must match."""
    from trainyard.plugins.airflow_api import follow_training_run

    first = stack.client.trigger(DAG_ID, {"max_steps": STEPS})["dag_run_id"]
    second = stack.client.trigger(DAG_ID, {"max_steps": STEPS})["dag_run_id"]
    return [follow_training_run(stack.client, DAG_ID, r, timeout_s=600) for r in (first, second)]


def _mlflow_run(s: RunningStack, run: str):
    from trainyard.plugins.tracking.runs import client_for

    client = client_for(s.settings.mlflow_tracking_uri)
    exp = client.get_experiment_by_name("demo/tiny-lm")
    (found,) = client.search_runs([exp.experiment_id], filter_string=f"tags.`trainyard.run` = '{run}'")
    return found


def _final_weights(s: RunningStack, run: str, dest: Path) -> dict[str, object]:
    """The model tensors of the run's final checkpoint (exported; the exported file's digest would
    differ between runs: its header names the manifest it came from)."""
    from safetensors.torch import load_file

    from tests.e2e.airflow_stack import DEMO
    from trainyard.config.loader import load_spec_file
    from trainyard.plugins.checkpoint.catalog import list_checkpoints
    from trainyard.plugins.checkpoint.export import export_safetensors
    from trainyard.plugins.launch.environment import checkpoint_uri

    final = list_checkpoints(checkpoint_uri(load_spec_file(DEMO), s.settings.object_store, run))[-1]
    export_safetensors(final.manifest_uri, dest)
    return {"step": final.step, **load_file(str(dest))}


def client_for_versions(s: RunningStack, mlflow_run_id: str) -> list[object]:
    from trainyard.plugins.tracking.runs import client_for

    return client_for(s.settings.mlflow_tracking_uri).search_model_versions(f"run_id = '{mlflow_run_id}'")


def _same(a: dict[str, object], b: dict[str, object]) -> bool:
    import torch

    same = a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)
    if not same:  # say how far apart, for the failure message
        print("steps", a.get("step"), b.get("step"), {k: float((a[k] - b[k]).abs().max()) for k in a
                                                       if isinstance(a[k], torch.Tensor) and k in b})
    return same


def test_two_triggers_are_two_independent_runs_that_complete_and_register(
        stack: RunningStack, uninterrupted: list[list[AttemptRun]], tmp_path: Path) -> None:
    from trainyard.plugins.checkpoint.catalog import list_checkpoints
    from trainyard.plugins.launch.environment import checkpoint_uri
    from trainyard.plugins.state.jobs import JobStateStore
    from trainyard.plugins.state.reservations import usage_by_team

    for attempts in uninterrupted:
        assert [(a.state, a.outcome, a.action) for a in attempts] == [("success", "completed", "register")], \
            f"{attempts}\n{stack.logs()}"
    ids = [attempts[0].run for attempts in uninterrupted]
    assert len(set(ids)) == 2  # two training runs, not one re-attached to the other

    state = JobStateStore(stack.settings.state_db)
    from tests.e2e.airflow_stack import DEMO
    from trainyard.config.loader import load_spec_file

    job = load_spec_file(DEMO)
    weights = []
    for run in ids:
        info = state.get_run(DAG_ID, run)
        assert info.state == "completed"
        steps = [r.step for r in list_checkpoints(checkpoint_uri(job, stack.settings.object_store, run))]
        assert steps[-1] == STEPS  # each run trained from scratch into its own folder
        mlflow_run = _mlflow_run(stack, run)
        assert mlflow_run.data.tags["trainyard.status"] == "completed"
        assert client_for_versions(stack, mlflow_run.info.run_id)  # a version was registered
        weights.append(_final_weights(stack, run, tmp_path / f"{run}.safetensors"))
    assert _same(*weights)  # same spec, same seed, no failure: the same model, bit for bit
    assert usage_by_team(stack.settings.state_db) == {}  # every device released


def test_a_killed_worker_resumes_in_place_from_the_newest_checkpoint_in_the_same_mlflow_run(
        stack: RunningStack, uninterrupted: list[list[AttemptRun]], tmp_path: Path) -> None:
    """The fast path (DESIGN §5): torchrun's own restart, counted against the budget."""
    from trainyard.plugins.state.jobs import JobStateStore

    attempts = stack.train({"max_steps": STEPS, "fault_kill_rank": 1, "fault_kill_at_step": 55})
    assert [(a.outcome, a.action) for a in attempts] == [("completed", "register")], f"{attempts}\n{stack.logs()}"
    run = attempts[0].run
    (attempt,) = JobStateStore(stack.settings.state_db).attempts(DAG_ID, run)
    assert attempt.restarts_in_place == 1  # reported to the control plane, counted

    mlflow_run = _mlflow_run(stack, run)
    tags = mlflow_run.data.tags
    assert tags["trainyard.attempts"] == "0" and tags["trainyard.failure_causes"] == "worker_crash"
    from trainyard.plugins.tracking.runs import client_for, recovery_events

    (event,) = recovery_events(mlflow_run.info.run_id, tracking_uri=stack.settings.mlflow_tracking_uri)
    assert "in place 1 time(s)" in event.detail
    history = client_for(stack.settings.mlflow_tracking_uri).get_metric_history(mlflow_run.info.run_id, "loss")
    assert {m.step for m in history} == set(range(1, STEPS + 1))
    from trainyard.plugins.run.model import RunHandle

    handle = RunHandle.model_validate(stack.client.xcom(DAG_ID, attempts[0].dag_run_id, "launch_training"))
    log = Path(handle.run_dir, "ranks", "rank-00000.log").read_text()
    # rank 0 started again in place and took the newest checkpoint. Its header may say restart 0
    # twice: rank 0 and rank 1 run under two agents (local-0, local-1), and torchrun counts the
    # restart only on the agent whose worker failed, unless rank 0's collective failed first
    assert log.count("=== rank 0 restart ") == 2 and "restored checkpoint step 50" in log, log[-3000:]

    # An uninterrupted run of the same spec (the first test's) registered the same weights.
    straight = uninterrupted[0]
    assert [(a.outcome, a.action) for a in straight] == [("completed", "register")], f"{straight}\n{stack.logs()}"
    assert _same(_final_weights(stack, run, tmp_path / "resumed.safetensors"),
                 _final_weights(stack, straight[0].run, tmp_path / "straight.safetensors"))


def test_restarting_the_scheduler_and_triggerer_mid_training_leaves_training_alone(stack: RunningStack) -> None:
    """…even when they crash (SIGKILL of each part's own process): the next start ends what the
    crashed part left (the LocalExecutor's workers ignore SIGTERM), and the trigger re-attaches."""
    from trainyard.plugins.airflow_api import follow_training_run
    from trainyard.plugins.attempt import watching as watch
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.run import processes
    from trainyard.plugins.run.model import RunHandle

    first = stack.client.trigger(DAG_ID, {"max_steps": 200})["dag_run_id"]  # outlives the restart (~0.3 s a step)
    stack.wait_for_task(DAG_ID, first, "watch_training", "deferred")
    handle = RunHandle.model_validate(stack.client.xcom(DAG_ID, first, "launch_training"))
    stack.until("the ranks to step",  # training, not still starting
                lambda: watch.poll(handle, Runtime(stack.settings)).step, timeout_s=240, poll_s=0.5)
    crashed = {part: stack.stack.group(part) for part in ("triggerer", "scheduler")}
    for part in crashed:
        os.kill(stack.stack.pid(part) or 0, signal.SIGKILL)  # the part alone: its children stay
    before = watch.poll(handle, Runtime(stack.settings)).step or 0
    time.sleep(5)
    during = watch.poll(handle, Runtime(stack.settings))
    assert during.state == "running" and (during.step or 0) > before  # training went on alone
    stack.stack.start("scheduler")
    stack.stack.start("triggerer")
    left = {part: [pid for pid in pids if processes.is_alive(pid)] for part, pids in crashed.items()}
    assert left == {"triggerer": [], "scheduler": []}, left  # what the crashed parts left was ended
    attempts = follow_training_run(stack.client, DAG_ID, first, timeout_s=600)
    assert [(a.outcome, a.action) for a in attempts] == [("completed", "register")], f"{attempts}\n{stack.logs()}"
    tasks = stack.client.task_instances(DAG_ID, first)
    assert tasks["launch_training"]["try_number"] == 1  # re-attached, never launched twice
    assert Path(handle.run_dir, "handle.json").exists()
