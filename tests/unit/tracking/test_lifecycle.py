"""Opening and closing a job's run as `trainyard launch` and the DAG do: a real SQLite store,
the demo dataset in a local object store, Great Expectations for real."""

from __future__ import annotations

from pathlib import Path

from tests.unit.tracking.factories import make_job, make_plan
from trainyard.config.cluster import load_cluster
from trainyard.config.settings import Settings
from trainyard.plugins.advisor import plan_job
from trainyard.plugins.storage.store import open_store
from trainyard.plugins.tracking import runs
from trainyard.plugins.tracking.artifacts import artifact_paths
from trainyard.plugins.tracking.lifecycle import close_tracked_run, open_tracked_run
from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset


def test_a_launch_opens_a_run_with_its_dataset_and_quality_and_closes_it(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    prepare_demo_dataset(open_store(settings.object_store).child(DEMO_PREFIX.rstrip("/")), shards=2)
    job = make_job("launched", team="lc", project="open")
    rid = open_tracked_run(job, make_plan(), settings, attempt=0, advice=plan_job(job, load_cluster("local")),
                           plan_source="advisor")
    client = runs.client_for(settings.mlflow_tracking_uri)
    run = client.get_run(rid)
    assert run.data.tags["trainyard.data_quality"] == "passed"
    assert run.data.tags["trainyard.dataset.uri"].endswith("datasets/pydoc-topics")
    assert [d.dataset.digest for d in run.inputs.dataset_inputs]  # the dataset is the run's input
    close_tracked_run(rid, "completed", tracking_uri=settings.mlflow_tracking_uri, timeline=[(0.0, "submitted")])
    assert client.get_run(rid).info.status == "FINISHED"
    assert artifact_paths(client, rid) == sorted([
        "spec/launched.yaml", "plan/explanation.txt", "plan/explanation.json", "data_quality/report.json",
        "data_quality/report.html", "recovery/timeline.json", "recovery/timeline.txt"])


def test_a_missing_dataset_is_said_and_the_run_still_opens(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    rid = open_tracked_run(make_job("no-data", team="lc", project="open"), make_plan(), settings, attempt=0)
    tags = runs.client_for(settings.mlflow_tracking_uri).get_run(rid).data.tags
    assert "trainyard.dataset.uri" not in tags and tags["trainyard.status"] == "running"


def test_a_report_validate_data_made_is_logged_without_checking_again(tmp_path: Path, monkeypatch) -> None:
    """The DAG's `validate_data` ran Great Expectations already: its report is the one logged."""
    from trainyard.plugins.validation import data_quality
    from trainyard.plugins.validation.data_quality import DataQualityReport

    settings = Settings(home=tmp_path / "home")
    prepare_demo_dataset(open_store(settings.object_store).child(DEMO_PREFIX.rstrip("/")), shards=2)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the data-quality checks ran a second time")

    monkeypatch.setattr(data_quality, "check_data_quality", refuse)
    given = DataQualityReport(dataset_uri="file:///given", success=False, rows_checked=7, checked_at="then")
    rid = open_tracked_run(make_job("handed-on", team="lc", project="open"), make_plan(), settings, attempt=0,
                           quality=given)
    client = runs.client_for(settings.mlflow_tracking_uri)
    assert client.get_run(rid).data.tags["trainyard.data_quality"] == "failed"
    logged = DataQualityReport.model_validate_json(
        (Path(client.download_artifacts(rid, "data_quality/report.json", str(tmp_path)))).read_text())
    assert logged == given


def test_closing_attaches_each_attempt_s_rank_logs_the_long_one_cut_to_its_tail(tmp_path: Path, monkeypatch) -> None:
    from trainyard.plugins.tracking import artifacts

    monkeypatch.setattr(artifacts, "MAX_LOG_BYTES", 64)
    settings = Settings(home=tmp_path / "home")
    rid = open_tracked_run(make_job("logged", team="lc", project="open"), make_plan(), settings, attempt=0)
    first, second = tmp_path / "0" / "ranks", tmp_path / "1" / "ranks"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    (first / "rank-00000.log").write_text("epoch 0\nTraceback…\nRuntimeError: boom\n")
    (second / "rank-00001.log").write_text("x" * 100 + "\nthe end\n")
    close_tracked_run(rid, "failed", tracking_uri=settings.mlflow_tracking_uri,
                      rank_logs=[(0, first), (1, second), (2, tmp_path / "gone")])
    client = runs.client_for(settings.mlflow_tracking_uri)
    assert client.get_run(rid).info.status == "FAILED"
    paths = artifact_paths(client, rid)
    assert "logs/attempt-0/rank-00000.log" in paths and "logs/attempt-1/rank-00001.log" in paths, paths
    whole = Path(client.download_artifacts(rid, "logs/attempt-0/rank-00000.log", str(tmp_path / "a"))).read_text()
    assert whole.endswith("RuntimeError: boom\n")
    cut = Path(client.download_artifacts(rid, "logs/attempt-1/rank-00001.log", str(tmp_path / "b"))).read_text()
    assert cut.startswith("[the first 45 bytes of rank-00001.log are left out") and cut.endswith("the end\n"), cut
