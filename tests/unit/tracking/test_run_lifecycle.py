"""Run lifecycle against a real SQLite-backed MLflow store: create, resume, lineage, events."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.procs import REPO_ROOT
from tests.unit.tracking.factories import make_job, make_plan, write_jsonl
from trainyard.config.settings import Settings
from trainyard.plugins.data.datasets import describe_dataset, open_dataset_store
from trainyard.plugins.tracking import runs
from trainyard.plugins.tracking.metrics import MetricsStreamer
from trainyard.plugins.tracking.params import REDACTED

if TYPE_CHECKING:
    from mlflow import MlflowClient

SHA = "ab" * 32


def client(uri: str) -> MlflowClient:
    from mlflow import MlflowClient

    return MlflowClient(uri)


def unique(request: pytest.FixtureRequest) -> str:
    return "j-" + str(abs(hash(request.node.nodeid)) % 10**10)


def test_new_run_records_spec_and_plan_params_and_identity_tags(
    sqlite_tracking_uri: str, request: pytest.FixtureRequest
) -> None:
    job = make_job(unique(request), team="nlp", project="sft", git_commit="a1b2c3d4")
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=sqlite_tracking_uri, attempt=0)
    run = client(sqlite_tracking_uri).get_run(rid)
    exp = client(sqlite_tracking_uri).get_experiment(run.info.experiment_id)
    assert exp.name == "nlp/sft"
    p = run.data.params
    assert p["spec.hardware.gpuCount"] == "2"
    assert p["spec.hardware.gpuType"] == "cpu"
    assert p["spec.parallelism.hints.hiddenSize"] == "128"
    assert p["metadata.team"] == "nlp"
    assert p["plan.tp"] == "1" and p["plan.dp"] == "2" and p["plan.micro_batch_size"] == "4"
    assert p["spec.dataset.quality.requiredFields"] == '["text"]'
    t = run.data.tags
    assert t["trainyard.job"] == job.name and t["mlflow.runName"] == job.name
    assert t["mlflow.source.git.commit"] == "a1b2c3d4" and "trainyard.git.commit" not in t  # one tag per fact
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert t["trainyard.platform.commit"] == head
    assert (t["trainyard.attempt"], t["trainyard.attempts"]) == ("0", "0")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow opens it on runs, not traces
    assert all(len(k) <= 40 for k in t if k.startswith("trainyard.")), sorted(t)  # short: the UI shows them whole
    assert t["trainyard.status"] == "running" and run.info.status == "RUNNING"
    # Artifacts of a directly-used SQLite store live beside the database, not in ./mlruns.
    db_dir = Path(sqlite_tracking_uri.removeprefix("sqlite:///")).parent
    assert exp.artifact_location.startswith((db_dir / "mlartifacts").as_uri())


def test_a_resumed_job_is_one_run_holding_both_attempts_metrics(
    sqlite_tracking_uri: str, request: pytest.FixtureRequest
) -> None:
    uri = sqlite_tracking_uri
    job = make_job(unique(request))
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0)
    with MetricsStreamer(uri, rid, flush_every_s=0.2) as s:  # attempt 0 trains steps 0..9
        for step in range(10):
            s.log(step, {"loss": 5.0 - step * 0.1})
    runs.log_checkpoint(rid, "file:///ckpt/step-00000005/MANIFEST.json", SHA, 5, {"loss": 4.5}, tracking_uri=uri)
    runs.log_recovery_event(rid, "worker_crash", 0, 9, "rank 1 exited with 1", tracking_uri=uri, duration_s=42.0)
    runs.set_run_status(rid, "failed", tracking_uri=uri)  # attempt 0 ended badly
    assert client(uri).get_run(rid).info.status == "FAILED"

    # Attempt 1: the advisor re-planned with a smaller micro-batch; it resumes from step 5.
    again = runs.start_or_resume_run(job, make_plan(micro_batch_size=2, num_micro_batches=4),
                                     tracking_uri=uri, run_id=rid, attempt=1)
    assert again == rid
    with MetricsStreamer(uri, rid, flush_every_s=0.2) as s:
        for step in range(5, 15):
            s.log(step, {"loss": 4.6 - (step - 5) * 0.1})
    runs.log_recovery_event(rid, "hang", 1, 12, "no step for 10m", tracking_uri=uri)
    runs.set_run_status(rid, "completed", tracking_uri=uri)

    run = client(uri).get_run(rid)
    assert run.info.status == "FINISHED"
    history = client(uri).get_metric_history(rid, "loss")
    assert sorted(m.step for m in history) == list(range(15))  # one value per step
    replay = client(uri).get_metric_history(rid, "loss.replay")  # attempt 1's replay of 5..9
    assert sorted(m.step for m in replay) == [5, 6, 7, 8, 9]
    t = run.data.tags
    assert (t["trainyard.attempts"], t["trainyard.attempt"]) == ("0,1", "1")
    assert t["trainyard.failure_causes"] == "worker_crash,hang"
    assert t["trainyard.status"] == "completed"
    # Params are immutable: the first plan stays, the changed value is a per-attempt tag.
    assert run.data.params["plan.micro_batch_size"] == "4"
    assert t["trainyard.attempt.1.plan.micro_batch_size"] == "2"
    assert t["trainyard.attempt.1"].startswith("TP1·PP1·DP2") and "mbs2×4 · started " in t["trainyard.attempt.1"]
    events = runs.recovery_events(rid, tracking_uri=uri)
    assert [(e.kind, e.attempt, e.step) for e in events] == [("worker_crash", 0, 9), ("hang", 1, 12)]
    assert events[0].detail == "rank 1 exited with 1" and events[0].detect_s == 42.0  # the detection, by name
    assert "trainyard.recovery_seconds" not in t  # it was the detection alone, under a name that said more
    marks = client(uri).get_metric_history(rid, "system/recovery.worker_crash")
    assert [(m.step, m.value) for m in marks] == [(9, 1.0)]
    assert sorted(m.step for m in client(uri).get_metric_history(rid, "system/trainyard.attempt")) == [0, 1]


def test_a_later_attempt_without_a_run_id_finds_the_jobs_run(
    sqlite_tracking_uri: str, request: pytest.FixtureRequest
) -> None:
    job = make_job(unique(request))
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=sqlite_tracking_uri, attempt=0)
    assert runs.start_or_resume_run(job, make_plan(), tracking_uri=sqlite_tracking_uri, attempt=1) == rid
    # …while attempt 0 of a fresh trigger starts a new run.
    assert runs.start_or_resume_run(job, make_plan(), tracking_uri=sqlite_tracking_uri, attempt=0) != rid


def test_resuming_another_jobs_run_is_refused(sqlite_tracking_uri: str, request: pytest.FixtureRequest) -> None:
    rid = runs.start_or_resume_run(make_job(unique(request)), make_plan(), tracking_uri=sqlite_tracking_uri, attempt=0)
    with pytest.raises(ValueError, match="belongs to job"):
        runs.start_or_resume_run(make_job("someone-else"), make_plan(), tracking_uri=sqlite_tracking_uri,
                                 run_id=rid, attempt=1)


def test_checkpoints_are_recorded_by_uri_and_hash(sqlite_tracking_uri: str, request: pytest.FixtureRequest) -> None:
    uri = sqlite_tracking_uri
    rid = runs.start_or_resume_run(make_job(unique(request)), make_plan(), tracking_uri=uri, attempt=0)
    for step, loss in [(100, 3.0), (50, 3.5), (150, 3.2)]:
        runs.log_checkpoint(rid, f"s3://ckpt/jobs/x/checkpoints/step-{step:08d}/MANIFEST.json",
                            SHA, step, {"loss": loss}, tracking_uri=uri)
    records = runs.checkpoints(rid, tracking_uri=uri)
    assert [(r.step, r.metrics["loss"]) for r in records] == [(50, 3.5), (100, 3.0), (150, 3.2)]
    run = client(uri).get_run(rid)
    assert not [k for k in run.data.tags if k.startswith("trainyard.checkpoint")]  # LoggedModels, not tags
    models = client(uri).search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{rid}'")
    assert sorted((m.name, m.model_type) for m in models) == [
        ("step-00000050", "checkpoint"), ("step-00000100", "checkpoint"), ("step-00000150", "checkpoint")]
    assert {o.step for o in run.outputs.model_outputs} == {50, 100, 150}  # each an output at its step
    assert [m.step for m in client(uri).get_metric_history(rid, "system/checkpoint.loss")] == [100, 50, 150]
    with pytest.raises(ValueError, match="64 lowercase hex"):
        runs.log_checkpoint(rid, "s3://x/MANIFEST.json", "not-a-hash", 1, tracking_uri=uri)
    with pytest.raises(ValueError, match="step must be >= 0"):
        runs.log_checkpoint(rid, "s3://x/MANIFEST.json", SHA, -1, tracking_uri=uri)


def test_the_dataset_is_the_runs_input_with_its_digest(
    sqlite_tracking_uri: str, request: pytest.FixtureRequest, settings: Settings
) -> None:
    objects = Path(settings.object_store.removeprefix("file://"))
    write_jsonl(objects / "datasets/wiki/part-000.jsonl", [{"text": "a"}, {"text": "b"}])
    job = make_job(unique(request), source="datasets/wiki/", version="v3")
    ref = describe_dataset(open_dataset_store(job.spec.dataset.source, settings), job.spec.dataset)
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=sqlite_tracking_uri, attempt=0, dataset=ref)
    runs.start_or_resume_run(job, make_plan(), tracking_uri=sqlite_tracking_uri, run_id=rid, attempt=1, dataset=ref)
    run = client(sqlite_tracking_uri).get_run(rid)
    (inp,) = run.inputs.dataset_inputs  # logged twice, recorded once
    assert inp.dataset.name == "wiki@v3" and inp.dataset.digest == ref.digest[:32]
    assert (objects / "datasets/wiki").as_uri() in inp.dataset.source
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "training"
    t = run.data.tags
    assert t["trainyard.dataset.uri"] == (objects / "datasets/wiki").as_uri()
    assert (t["trainyard.dataset.version"], t["trainyard.dataset.digest"]) == ("v3", ref.digest)


def test_secret_looking_env_values_never_reach_params(sqlite_tracking_uri: str, request: pytest.FixtureRequest) -> None:
    job = make_job(unique(request), env={"HF_TOKEN": "hf_secret", "NCCL_DEBUG": "WARN", "MY_API_KEY": "k"})
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=sqlite_tracking_uri, attempt=0)
    p = client(sqlite_tracking_uri).get_run(rid).data.params
    assert p["spec.training.env.HF_TOKEN"] == REDACTED == p["spec.training.env.MY_API_KEY"]
    assert p["spec.training.env.NCCL_DEBUG"] == "WARN"
    assert "hf_secret" not in str(p)


def test_system_metrics_are_sampled_into_the_run(sqlite_tracking_uri: str, request: pytest.FixtureRequest) -> None:
    from trainyard.plugins.tracking.system_metrics import start_system_metrics

    rid = runs.start_or_resume_run(make_job(unique(request)), make_plan(), tracking_uri=sqlite_tracking_uri, attempt=0)
    monitor = start_system_metrics(rid, tracking_uri=sqlite_tracking_uri, node_id="local-0",
                                   sampling_interval_s=0.2)
    assert monitor is not None
    deadline = time.monotonic() + 120
    key = "system/local-0/cpu_utilization_percentage"
    while time.monotonic() < deadline and len(client(sqlite_tracking_uri).get_metric_history(rid, key)) < 2:
        time.sleep(0.2)
    monitor.finish()
    assert len(client(sqlite_tracking_uri).get_metric_history(rid, key)) >= 2


def test_bad_status_and_kind_are_refused(sqlite_tracking_uri: str) -> None:
    with pytest.raises(ValueError, match="status must be one of"):
        runs.set_run_status("r", "exploded", tracking_uri=sqlite_tracking_uri)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind must be a word"):
        runs.log_recovery_event("r", "two words", 0, 1, tracking_uri=sqlite_tracking_uri)


def test_retried_control_plane_tasks_record_things_once(sqlite_tracking_uri: str, request: pytest.FixtureRequest) -> None:
    uri = sqlite_tracking_uri
    job = make_job(unique(request))
    trigger = "manual__2026-11-29T14:00:00+00:00"
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0, trigger_id=trigger)
    # The task that created the run crashed before handing the id on and is retried:
    assert runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0, trigger_id=trigger) == rid
    assert runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0, trigger_id="other") != rid

    key = f"{trigger}:0:worker_crash"
    first = runs.log_recovery_event(rid, "worker_crash", 0, 5, "exit 1", tracking_uri=uri, key=key)
    again = runs.log_recovery_event(rid, "worker_crash", 0, 5, "exit 1", tracking_uri=uri, key=key)
    assert again == first
    assert [e.key for e in runs.recovery_events(rid, tracking_uri=uri)] == [key]
    assert client(uri).get_run(rid).data.tags["trainyard.failure_causes"] == "worker_crash"

    manifest = "file:///c/step-00000010/MANIFEST.json"
    runs.log_checkpoint(rid, manifest, SHA, 10, {"loss": 1.0}, tracking_uri=uri)
    runs.log_checkpoint(rid, manifest, SHA, 10, {"loss": 1.0}, tracking_uri=uri)  # the watcher retried
    assert len(client(uri).get_metric_history(rid, "system/checkpoint.step")) == 1
    # After a rollback the same step is saved again with other bytes: the record is replaced.
    runs.log_checkpoint(rid, manifest, "cd" * 32, 10, {"loss": 0.9}, tracking_uri=uri)
    (record,) = runs.checkpoints(rid, tracking_uri=uri)
    assert (record.sha256, record.metrics) == ("cd" * 32, {"loss": 0.9})
    exp = client(uri).get_run(rid).info.experiment_id
    assert len(client(uri).search_logged_models([exp], filter_string=f"source_run_id = '{rid}'")) == 1
