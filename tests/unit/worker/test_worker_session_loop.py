"""The session's decisions, in this process (a one-rank gloo group, a real checkpoint manager on
a local store): clock-based saves, restore, the divergence stop, the SIGTERM stop, the ranks'
flags taken from the step's own all-reduce, the metrics it streams. The
multi-process versions of the stops run in tests/integration/worker."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.support.procs import REPO_ROOT
from trainyard.config.loader import load_spec_file
from trainyard.plugins.checkpoint import list_checkpoints
from trainyard.plugins.run import exit_codes
from trainyard.plugins.run.heartbeat import Heartbeat, heartbeat_path
from trainyard.plugins.storage.store import open_store
from trainyard.worker.session import SessionConfig, StopTraining, TrainingSession
from trainyard.worker.step import global_mean_loss

SPEC = load_spec_file(REPO_ROOT / "config/jobs/demo-tiny-lm.yaml")


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SessionConfig:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    for name in ("RANK", "WORLD_SIZE", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    return dataclasses.replace(SessionConfig.from_env({}, spec=SPEC, world_size=1),
                               checkpoint_interval_steps=None, checkpoint_interval_s=None)


@pytest.fixture
def session_for(config: SessionConfig) -> Iterator:
    opened: list[TrainingSession] = []

    def make(**changes: object) -> TrainingSession:
        session = TrainingSession(dataclasses.replace(config, **changes))
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        session.attach(model=model, optimizer=torch.optim.AdamW(model.parameters()), extra={})
        opened.append(session)
        return session

    yield make
    for session in opened:
        session.close()


def steps(config: SessionConfig) -> list[int]:
    return [r.manifest.step for r in list_checkpoints(open_store(config.checkpoint_uri))]


def beat(config: SessionConfig) -> Heartbeat:
    return Heartbeat.model_validate_json(heartbeat_path(config.heartbeat_dir, 0).read_text())


def test_clock_based_checkpoint_and_restore(session_for, config: SessionConfig) -> None:
    session = session_for(checkpoint_interval_s=0.2)
    assert session.restore() == 1
    session.step_end(1, loss=2.0)
    time.sleep(0.3)
    session.step_end(2, loss=1.9)  # 0.3 s since the start: due
    session.finish(3)
    session.close()
    assert steps(config) == [2, 3]
    again = session_for()
    assert again.restore() == 4
    assert again.divergence.baseline is not None  # the detector's state came back too


def test_nan_stops_with_the_diverged_code(session_for, config: SessionConfig) -> None:
    session = session_for(checkpoint_interval_steps=2)
    session.restore()
    for step in (1, 2):
        session.step_end(step, loss=3.0)
    with pytest.raises(StopTraining) as stop:
        session.step_end(3, loss=float("inf"))
    assert stop.value.code == exit_codes.DIVERGED
    assert (beat(config).phase, beat(config).nan, beat(config).step) == ("diverged", True, 3)
    report = json.loads((config.run_dir / "diverged.json").read_text())
    assert (report["onset_step"], report["last_checkpoint_step"]) == (3, 2)


def test_sigterm_checkpoints_then_stops_with_the_preempted_code(session_for, config: SessionConfig) -> None:
    session = session_for()
    session.restore()
    session.step_end(1, loss=3.0)
    os.kill(os.getpid(), signal.SIGTERM)  # handled: the step in progress finishes
    with pytest.raises(StopTraining) as stop:
        session.step_end(2, loss=2.9)
    assert stop.value.code == exit_codes.PREEMPTED
    assert steps(config) == [2]
    assert (beat(config).phase, beat(config).step) == ("checkpoint", 2)


def test_restore_needs_attach(config: SessionConfig) -> None:
    session = TrainingSession(config)
    try:
        with pytest.raises(RuntimeError, match="attach"):
            session.restore()
    finally:
        session.close()


def test_a_corrupt_resume_point_stops_with_the_checkpoint_corrupt_code(session_for, config: SessionConfig) -> None:
    first = session_for()
    first.restore()
    first.step_end(1, loss=3.0)
    first.finish(2)
    first.close()
    store = open_store(config.checkpoint_uri)
    shard = next(o.key for o in store.list("step-00000002/") if o.key.endswith(".distcp"))
    store.put_bytes(shard, b"flipped bits")  # same name, wrong bytes: the file hash fails
    manifest = f"{config.checkpoint_uri}/step-00000002/MANIFEST.json"
    session = session_for(resume_from=manifest)
    with pytest.raises(StopTraining) as stop:
        session.restore()
    assert stop.value.code == exit_codes.CHECKPOINT_CORRUPT
    record = json.loads((config.run_dir / "checkpoint_corrupt.json").read_text())
    assert record["resume_from"] == manifest and "does not verify" in record["reason"]


def test_out_of_memory_in_the_loop_stops_with_the_oom_code(session_for, config: SessionConfig,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    session = session_for()
    session.restore()
    session.before_step(5)
    with pytest.raises(StopTraining) as stop, session.stop_on_oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert stop.value.code == exit_codes.OOM and "after step 5" in stop.value.reason
    assert "torch.OutOfMemoryError after step 5: CUDA out of memory" in caplog.text
    with session.stop_on_oom():  # anything else passes through untouched
        pass


def test_data_figures_go_into_the_heartbeat(session_for, config: SessionConfig) -> None:
    """`step_end(data_metrics=...)` (the streaming reader's figures) beside `data_stall_s`."""
    session = session_for()
    session.restore()
    session.step_end(1, loss=3.0, data_stall_s=0.5,
                     data_metrics={"prefetch_depth": 2.0, "cache_hit_rate": 0.5, "cache_misses": 4.0,
                                   "not_a_heartbeat_field": 1.0})
    session._heartbeats.flush()
    b = beat(config)
    assert (b.data_stall_s, b.prefetch_depth, b.cache_hit_rate, b.cache_misses) == (0.5, 2.0, 0.5, 4.0)
    session.step_end(2, loss=2.9)  # a loop that reports none of them
    session._heartbeats.flush()
    assert beat(config).data_stall_s is None and beat(config).step == 2


def test_an_in_place_restart_restores_the_runs_newest_checkpoint_not_the_named_one(
        session_for, config: SessionConfig) -> None:
    first = session_for(checkpoint_interval_steps=2)
    first.restore()
    for step in (1, 2, 3, 4):
        first.step_end(step, loss=3.0)
    first.close()
    assert steps(config) == [2, 4]
    named = f"{config.checkpoint_uri}/step-00000002/MANIFEST.json"
    assert session_for(resume_from=named).restore() == 3  # the attempt's first incarnation
    assert session_for(resume_from=named, restart=1).restore() == 5  # torchrun restarted it
    # a node whose torchrun restarted its workers for the peer's new round counts no restart;
    # its ranks follow the gang's count (`restart`, the all-reduced maximum), not their own
    healthy_node = session_for(resume_from=named, restart=0)
    healthy_node.restart = 1  # what the peer's rank brought to the all-reduce
    assert healthy_node.restore() == 5
    healthy_node._heartbeats.flush()
    assert beat(config).restart == 1  # the control plane counts it from the heartbeats


def test_an_in_place_restart_keeps_the_named_checkpoint_while_the_run_has_none(
        session_for, config: SessionConfig, tmp_path: Path) -> None:
    other = dataclasses.replace(config, checkpoint_uri=f"{config.checkpoint_uri}-other")
    donor = TrainingSession(other)
    model = torch.nn.Linear(4, 4)
    donor.attach(model=model, optimizer=torch.optim.AdamW(model.parameters()), extra={})
    donor.restore()
    donor.finish(7)
    donor.close()
    named = f"{other.checkpoint_uri}/step-00000007/MANIFEST.json"
    session = session_for(resume_from=named, restart=1)
    assert session.resume_target() == named  # a crash before the attempt's first save


def _with_checkpoint(config: SessionConfig, **fields: object) -> SessionConfig:
    spec = SPEC.model_copy(update={"spec": SPEC.spec.model_copy(update={
        "checkpoint": SPEC.spec.checkpoint.model_copy(update=fields)})})
    return dataclasses.replace(config, spec=spec)


def test_the_specs_staging_and_async_reach_the_saves(session_for, config: SessionConfig) -> None:
    deferred = session_for()
    assert deferred.checkpoints.staging == "deferred"  # the spec's default
    assert deferred.save(1).status == "pending"
    deferred.close()
    blocking = session_for(spec=_with_checkpoint(config, staging="blocking").spec)
    assert blocking.checkpoints.staging == "blocking"
    blocking.close()
    synchronous = session_for(spec=_with_checkpoint(config, async_save=False).spec)
    assert synchronous.save(2).status == "committed"  # `async: false`: committed before it returns
    assert steps(config) == [1, 2]


def test_the_sums_of_the_ranks_flags_decide_without_an_all_reduce_of_the_sessions_own(
        session_for, config: SessionConfig) -> None:
    """`train_step(flags=session.flags())` sums every rank's flags with the loss; `step_end` takes
    the sums: another rank's clock-based save or SIGTERM counts here as if it were this rank's."""
    session = session_for()
    session.restore()
    assert session.flags() == (0, 0)
    session.step_end(1, loss=3.0, flags=(0, 1))  # a rank whose clock said a checkpoint is due
    session.checkpoints.wait()
    assert steps(config) == [1]
    with pytest.raises(ValueError, match="2 values"):
        session.step_end(2, loss=2.9, flags=(1,))
    with pytest.raises(StopTraining) as stop:
        session.step_end(2, loss=2.9, flags=(1, 0))  # a rank that got the SIGTERM
    assert stop.value.code == exit_codes.PREEMPTED
    assert steps(config) == [1, 2]


def test_a_sigterm_raises_this_ranks_flag(session_for) -> None:
    session = session_for(checkpoint_interval_s=3600.0)
    session.restore()
    os.kill(os.getpid(), signal.SIGTERM)
    assert session.flags() == (1, 0)


def test_the_loss_and_the_flags_share_one_sum() -> None:
    loss, sums = global_mean_loss(torch.tensor(2.5), True, (1, 0))  # one process: the sums are its own
    assert (float(loss), sums) == (2.5, (1, 0))
    assert global_mean_loss(torch.tensor(2.5), True)[1] == ()


def test_mlflow_gets_the_loss_of_every_step_and_the_other_figures_once_per_window(
        session_for, sqlite_tracking_uri: str, mlflow_run: str) -> None:
    from mlflow import MlflowClient

    session = session_for(mlflow_tracking_uri=sqlite_tracking_uri, mlflow_run_id=mlflow_run,
                          metrics_every_s=3600.0)
    session.restore()
    for step in (1, 2, 3, 4):
        session.step_end(step, loss=3.0 - 0.1 * step, grad_norm=1.0, lr=0.01, tokens=1000, data_stall_s=0.0)
    session.close()  # closes the open window: its last steps are not lost
    client = MlflowClient(sqlite_tracking_uri)
    assert [m.step for m in client.get_metric_history(mlflow_run, "loss")] == [1, 2, 3, 4]
    for key in ("tokens_per_s", "step_time_s", "total_grad_norm", "lr", "system/data_stall_s"):
        assert [m.step for m in client.get_metric_history(mlflow_run, key)] == [4], key
