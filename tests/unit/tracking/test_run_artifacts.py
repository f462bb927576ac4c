"""A run's artifacts against a real SQLite-backed MLflow store: spec, plan, data quality, plot, timeline."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.unit.tracking.factories import make_job, make_plan
from trainyard.config.cluster import load_cluster
from trainyard.plugins.advisor import plan_job
from trainyard.plugins.tracking import artifacts, runs
from trainyard.plugins.tracking.metrics import MetricsStreamer
from trainyard.plugins.validation.data_quality import CheckOutcome, DataQualityReport


def _download(uri: str, run_id: str, path: str, dest: Path) -> Path:
    from mlflow import MlflowClient

    return Path(MlflowClient(uri).download_artifacts(run_id, path, str(dest)))


def test_a_run_keeps_its_spec_plan_quality_plot_and_timeline(sqlite_tracking_uri: str, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = sqlite_tracking_uri
    job = make_job("art-job", team="art", project="files", env={"HF_TOKEN": "hf_secret", "MODE": "fast"})
    plan = make_plan()
    rid = runs.start_or_resume_run(job, plan, tracking_uri=uri, attempt=0)
    quality = DataQualityReport(
        dataset_uri="file:///data/wiki", success=False, rows_checked=10, shards_read=1, shards_total=1,
        outcomes=[CheckOutcome(check="field 'text' is not blank", expectation="expect_column_values_to_not_match_regex",
                               setting="spec.dataset.quality.textField", success=False, rows_checked=10,
                               failing_rows=2, examples=["part-0.jsonl:3: {\"text\": \" \"}"])])
    started = artifacts.log_start_artifacts(rid, job, plan, tracking_uri=uri, advice=plan_job(job, load_cluster("local")),
                                            plan_source="advisor", quality=quality)

    # attempt 0 logs steps 1..12, a crash, attempt 1 resumes from 8 and replays 9..12.
    with MetricsStreamer(uri, rid, flush_every_s=60) as s:
        for step in range(1, 13):
            s.log(step, {"loss": 5.0 - step * 0.1})
    runs.log_recovery_event(rid, "worker_crash", attempt=0, step=12, detail="rank 1 exit -9", tracking_uri=uri)
    with MetricsStreamer(uri, rid, flush_every_s=60) as s:
        for step in range(9, 21):
            s.log(step, {"loss": 5.0 - step * 0.1})
    ended = artifacts.log_end_artifacts(rid, tracking_uri=uri, timeline=[(0.0, "submitted"), (3.5, "attempt 0 failed")])

    assert artifacts.artifact_paths(MlflowClient(uri), rid) == sorted([
        "spec/art-job.yaml", "plan/explanation.txt", "plan/explanation.json", "data_quality/report.json",
        "data_quality/report.html", "plots/loss.png", "recovery/timeline.json", "recovery/timeline.txt"])
    assert sorted(started + ended) == artifacts.artifact_paths(MlflowClient(uri), rid)

    spec = yaml.safe_load(_download(uri, rid, "spec/art-job.yaml", tmp_path).read_text())
    assert spec["metadata"]["name"] == "art-job"
    assert spec["spec"]["training"]["env"] == {"HF_TOKEN": "<redacted>", "MODE": "fast"}

    text = _download(uri, rid, "plan/explanation.txt", tmp_path).read_text()
    assert text.startswith(f"plan {plan.describe()} (advisor)")
    assert "layouts considered" in text  # the advisor's own search, handed in by the attempt that planned
    explained = json.loads(_download(uri, rid, "plan/explanation.json", tmp_path).read_text())
    assert explained["plan"]["layout"]["dp"] == plan.layout.dp and explained["advisor"]["strategy"] == "auto"

    page = _download(uri, rid, "data_quality/report.html", tmp_path).read_text()
    assert "Data quality FAILED" in page and "2 / 10" in page and "part-0.jsonl:3" in page
    assert MlflowClient(uri).get_run(rid).data.tags["trainyard.data_quality"] == "failed"

    timeline = json.loads(_download(uri, rid, "recovery/timeline.json", tmp_path).read_text())
    assert [(e["kind"], e["step"]) for e in timeline["recovery_events"]] == [("worker_crash", 12)]
    assert [e["event"] for e in timeline["timeline"]] == ["submitted", "attempt 0 failed"]
    assert "worker_crash at step 12" in _download(uri, rid, "recovery/timeline.txt", tmp_path).read_text()

    png = _download(uri, rid, "plots/loss.png", tmp_path).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_logging_again_replaces_and_a_run_without_loss_has_no_plot(sqlite_tracking_uri: str) -> None:
    from mlflow import MlflowClient

    uri = sqlite_tracking_uri
    job = make_job("art-empty", team="art", project="empty")
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0)
    for _ in range(2):  # a retried task
        artifacts.log_start_artifacts(rid, job, make_plan(), tracking_uri=uri)
        paths = artifacts.log_end_artifacts(rid, tracking_uri=uri)
    assert "plots/loss.png" not in paths
    assert artifacts.artifact_paths(MlflowClient(uri), rid) == sorted([
        "spec/art-empty.yaml", "plan/explanation.txt", "plan/explanation.json",
        "recovery/timeline.json", "recovery/timeline.txt"])
