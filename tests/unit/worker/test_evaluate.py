"""The evaluation gate's engine with real parts: the demo model's checkpoints committed by the
CheckpointManager, registered through the real export, scored on the demo dataset on CPU. A
version trained on the held-out slice must score better than the untrained one it would replace."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.tracking.factories import make_job, register_llama_version
from trainyard.plugins.tracking import registry
from trainyard.worker import evaluate

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def objects(tmp_path: Path) -> str:
    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.demo_data import prepare_demo_dataset

    uri = (tmp_path / "objects").as_uri()
    prepare_demo_dataset(open_store(uri).child("datasets/pydoc-topics"), shards=2)
    return uri


def test_the_candidate_is_scored_against_production_on_the_same_samples(
        sqlite_tracking_uri: str, tmp_path: Path, objects: str) -> None:
    from mlflow import MlflowClient

    job = make_job("eval-gate")
    first = register_llama_version(sqlite_tracking_uri, tmp_path, job, objects, train_steps=0, alias="")
    # no version holds production yet: the candidate is scored alone
    alone = evaluate.compare_with_production(job, first, tracking_uri=sqlite_tracking_uri,
                                             object_store=objects, samples=8)
    assert alone.production is None and alone.improves and "no version holds `production`" in alone.approval_body()
    assert registry.move_alias(job.name, "production", first, tracking_uri=sqlite_tracking_uri, by="alice") is None
    second = register_llama_version(sqlite_tracking_uri, tmp_path, job, objects, train_steps=30, alias="candidate")
    result = evaluate.compare_with_production(job, second, tracking_uri=sqlite_tracking_uri,
                                              object_store=objects, samples=8)
    assert (result.candidate.version, result.production.version) == (second, first)
    assert result.candidate.samples == result.production.samples == 8
    assert result.candidate.tokens == 8 * job.spec.parallelism.hints.sequence_length
    assert result.candidate.loss < result.production.loss and result.improves
    assert result.production.loss == pytest.approx(alone.candidate.loss)  # same weights, same samples
    body = result.approval_body()
    assert f"version **{second}**" in body and f"production (v{first})" in body and "lower" in body
    assert f"{result.candidate.loss:.4f}" in body and f"{result.production.loss:.4f}" in body
    tags = MlflowClient(sqlite_tracking_uri).get_model_version(job.name, second).tags
    assert float(tags["trainyard.eval.loss"]) == result.candidate.loss
    assert registry.move_alias(job.name, "production", second, tracking_uri=sqlite_tracking_uri, by="bob") == first
    assert registry.version_at(job.name, "production", tracking_uri=sqlite_tracking_uri).version == second


def test_weights_that_differ_from_the_registered_ones_are_refused(
        sqlite_tracking_uri: str, tmp_path: Path, objects: str) -> None:
    from mlflow import MlflowClient

    job = make_job("eval-tamper")
    version = register_llama_version(sqlite_tracking_uri, tmp_path, job, objects, train_steps=0, alias="candidate")
    MlflowClient(sqlite_tracking_uri).set_model_version_tag(job.name, version, "trainyard.checkpoint.sha256", "0" * 64)
    with pytest.raises(evaluate.EvaluationError, match="was registered from 000000000000"):
        evaluate.compare_with_production(job, version, tracking_uri=sqlite_tracking_uri, object_store=objects,
                                         samples=4)


def test_a_retraining_run_starts_from_the_alias_once_a_version_holds_it(
        sqlite_tracking_uri: str, tmp_path: Path, objects: str) -> None:
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.attempt.conf import resume_point
    from trainyard.plugins.recovery.model import AttemptConf

    base = make_job("eval-start")
    doc = base.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["spec"]["retrain"] = {"startFromAlias": "production"}
    job = TrainingJob.model_validate(doc)
    first = AttemptConf(run="20260101t000000-abcdef")
    assert resume_point(first, job, tracking_uri=sqlite_tracking_uri, object_store=objects) == ""  # nothing promoted yet
    version = register_llama_version(sqlite_tracking_uri, tmp_path, base, objects, train_steps=0, alias="candidate")
    registry.move_alias(job.name, "production", version, tracking_uri=sqlite_tracking_uri)
    start = resume_point(first, job, tracking_uri=sqlite_tracking_uri, object_store=objects)
    assert start.endswith("/step-00000001/MANIFEST.json") and f"/jobs/{job.name}/" in start
    explicit = first.model_copy(update={
        "start_from": f"{objects}/jobs/eval-start/runs/{first.run}/checkpoints/step-00000009/MANIFEST.json"})
    assert resume_point(explicit, job, tracking_uri=sqlite_tracking_uri, object_store=objects) == explicit.start_from
    assert resume_point(first, base, tracking_uri=sqlite_tracking_uri, object_store=objects) == ""  # no retrain section


def test_the_held_out_samples_are_the_tail_of_the_data_as_the_worker_reads_it(tmp_path: Path) -> None:
    import torch

    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.data import load_bytes
    from trainyard.worker.demo_data import prepare_demo_dataset

    objects = (tmp_path / "objects").as_uri()
    store = open_store(objects).child("datasets/pydoc-topics")
    prepare_demo_dataset(store, shards=8)
    job = make_job("eval-tail")
    seq = job.spec.parallelism.hints.sequence_length
    inputs, targets, uri = evaluate.eval_windows(job, object_store=objects, samples=5)
    assert inputs.shape == targets.shape == (5, seq) and uri == store.uri.rstrip("/")
    everything = load_bytes(store).long()
    tail = everything[-(5 * seq + 1):]
    assert torch.equal(inputs.flatten(), tail[:-1]) and torch.equal(targets[-1], tail[-seq:])
