"""The session's ways of ending a run, with the real train.py under torchrun (2 processes):
divergence (exit 42, NaN heartbeat, onset report), preemption (SIGTERM → emergency checkpoint,
exit 43) and its resume on a different world size, and the metrics streamed to MLflow."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.worker.conftest import RUN, committed_steps, fsdp_plan, launch, tiny_job
from trainyard.plugins.checkpoint.uris import checkpoint_root
from trainyard.plugins.run import exit_codes
from trainyard.plugins.run.records import DIVERGED_FILE, DivergenceRecord, read_model

pytestmark = pytest.mark.slow

STREAMED = {"loss", "total_grad_norm", "lr", "tokens_per_s", "step_time_s", "system/data_stall_s", "mfu"}


def test_nan_loss_exits_diverged_with_flagged_heartbeats(s3_object_store: tuple[str, str],
                                                         tmp_path: Path) -> None:
    """On an S3 object store (moto server): dataset and checkpoints go through the S3 API."""
    object_store, endpoint = s3_object_store
    run = launch(tiny_job("nan-run", max_steps=20, interval_steps=4), fsdp_plan(),
                 object_store=object_store, run_dir=tmp_path, faults="nan_loss@6",
                 env={"TRAINYARD_S3_ENDPOINT_URL": endpoint})
    assert run.exit_codes() == [exit_codes.DIVERGED] * 2, run.logs()
    for rank in (0, 1):
        beat = run.heartbeat(rank)
        assert (beat.step, beat.phase, beat.nan, beat.loss) == (6, "diverged", True, None)
    report = read_model(tmp_path / DIVERGED_FILE, DivergenceRecord)
    assert report is not None and report.loss == "nan"
    assert (report.onset_step, report.reason, report.last_checkpoint_step) == (6, "non_finite", 4)
    assert committed_steps(object_store, "nan-run", endpoint) == [4], "nothing after the onset may be saved"


def test_sigterm_checkpoints_exits_preempted_and_resumes_on_one_process(
        object_store: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from mlflow import MlflowClient

    tracking = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    client = MlflowClient(tracking)
    run_id = client.create_run(client.create_experiment("worker-preempt")).info.run_id

    job = tiny_job("preempt", max_steps=30, interval_steps=20)
    # SIGTERM reaches rank 0 only, before step 7: both ranks must stop after step 7 together.
    first = launch(job, fsdp_plan(), object_store=object_store, run_dir=tmp_path / "a0",
                   faults="sigterm@7", mlflow=(tracking, run_id))
    assert first.exit_codes() == [exit_codes.PREEMPTED] * 2, first.logs()
    assert committed_steps(object_store, "preempt") == [7]
    assert all(first.heartbeat(r).step == 7 and first.heartbeat(r).phase == "checkpoint" for r in (0, 1))

    metrics = client.get_run(run_id).data.metrics
    assert set(metrics) >= STREAMED, f"missing metrics: {STREAMED - set(metrics)}"
    losses = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in losses) == list(range(1, 8))
    assert all(m.value > 0 for m in client.get_metric_history(run_id, "tokens_per_s"))

    # The 2-process FSDP checkpoint restores onto one process (DCP reshards, the sampler's global
    # position is world-size free), which runs the remaining steps 8..30 and exits 0. The
    # checkpoint is named explicitly, as the control plane does (TRAINYARD_RESUME_FROM).
    manifest = f"{checkpoint_root(object_store, 'preempt', RUN)}/step-00000007/MANIFEST.json"
    second = launch(job, fsdp_plan(world_size=1), object_store=object_store,
                    run_dir=tmp_path / "a1", attempt=1, resume_from=manifest)
    assert second.exit_codes() == [exit_codes.COMPLETED], second.logs()
    assert f"resumed from step 7 ({manifest})" in second.rank_log(0), second.logs()
    assert sorted(map(int, second.summary()["losses"])) == list(range(8, 31))
    assert committed_steps(object_store, "preempt") == [7, 20, 30]
    assert second.heartbeat(0).phase == "done"
