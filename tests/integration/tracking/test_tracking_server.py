"""The tracking engine through a real `mlflow server` (REST + proxied artifacts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.tracking.mlflow_servers import MlflowServer
from tests.unit.tracking.factories import (
    SHA,
    export_marking_the_step,
    make_job,
    make_plan,
    write_jsonl,
)
from tests.unit.tracking.test_cost_model import fleet
from trainyard.config.settings import Settings
from trainyard.plugins.data.datasets import describe_dataset, open_dataset_store
from trainyard.plugins.tracking import cost, registry, runs
from trainyard.plugins.tracking.metrics import MetricsStreamer
from trainyard.plugins.validation.data_quality import check_data_quality


@pytest.fixture
def dataset_v3(settings: Settings) -> Path:
    """Two shards of distinct documents under the object store's `datasets/web/`."""
    objects = Path(settings.object_store.removeprefix("file://"))
    write_jsonl(objects / "datasets/web/part-000.jsonl", [{"text": f"document {i}"} for i in range(20)])
    write_jsonl(objects / "datasets/web/part-001.jsonl", [{"text": f"document {i}"} for i in range(20, 40)])
    return objects


def test_a_job_resumed_after_a_failure_is_one_run_with_both_attempts(
    mlflow_server: MlflowServer, settings: Settings, dataset_v3: Path
) -> None:
    from mlflow import MlflowClient

    uri = mlflow_server.uri
    job = make_job("srv-resume", team="search", project="ranker", source="datasets/web/", version="v3")
    ref = describe_dataset(open_dataset_store(job.spec.dataset.source, settings), job.spec.dataset)
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0, dataset=ref)
    with MetricsStreamer(uri, rid, flush_every_s=0.2) as s:
        for step in range(20):
            s.log(step, {"loss": 3.0 - step * 0.05, "tokens_per_s": 1000.0})
    runs.log_checkpoint(rid, "file:///c/srv-resume/step-00000010/MANIFEST.json", SHA, 10, {"loss": 2.5},
                        tracking_uri=uri)
    runs.log_recovery_event(rid, "node_lost", 0, 19, "local-1 stopped answering", tracking_uri=uri,
                            duration_s=30.0)
    runs.set_run_status(rid, "recovering", tracking_uri=uri)

    assert runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, run_id=rid, attempt=1, dataset=ref) == rid
    with MetricsStreamer(uri, rid, flush_every_s=0.2) as s:
        for step in range(10, 30):
            s.log(step, {"loss": 2.5 - (step - 10) * 0.05, "tokens_per_s": 1000.0})
    runs.log_checkpoint(rid, "file:///c/srv-resume/step-00000030/MANIFEST.json", SHA, 30, {"loss": 1.6},
                        tracking_uri=uri)
    runs.set_run_status(rid, "completed", tracking_uri=uri)

    client = MlflowClient(uri)
    run = client.get_run(rid)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "search/ranker"
    history = client.get_metric_history(rid, "loss")
    assert len(history) == 30 and {m.step for m in history} == set(range(30))  # one value per step
    replayed = client.get_metric_history(rid, "loss.replay")  # attempt 1 trained steps 10-19 again
    assert sorted(m.step for m in replayed) == list(range(10, 20))
    t = run.data.tags
    assert (t["trainyard.attempts"], t["trainyard.failure_causes"]) == ("0,1", "node_lost")
    assert t["trainyard.dataset.version"] == "v3" and t["trainyard.dataset.digest"] == ref.digest
    assert [r.step for r in runs.checkpoints(rid, tracking_uri=uri)] == [10, 30]
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.digest == ref.digest[:32]


def test_registry_and_lineage_query_through_the_server(
    mlflow_server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    from safetensors.numpy import load_file

    uri = mlflow_server.uri
    from tests.unit.tracking.factories import registry_dataset, trained_run

    on_v3 = trained_run(uri, "srv-model-a", registry_dataset("v3", "1" * 64), {100: 2.0, 200: 1.5, 300: 1.7})
    on_v4 = trained_run(uri, "srv-model-b", registry_dataset("v4", "2" * 64), {100: 2.0})
    best = registry.register_checkpoint(on_v3, tracking_uri=uri, metric="loss", export=export_marking_the_step)
    registry.register_checkpoint(on_v4, tracking_uri=uri, export=export_marking_the_step)

    v3 = registry.models_trained_on("s3://datasets/wiki", "v3", tracking_uri=uri)
    assert [(m.name, m.version, m.aliases, m.checkpoint_step) for m in v3] == [("srv-model-a", "1", ["candidate"], 200)]
    assert {m.name for m in registry.models_trained_on("s3://datasets/wiki", tracking_uri=uri)} >= {
        "srv-model-a", "srv-model-b"}

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri="models:/srv-model-a@candidate",
                                                     dst_path=str(tmp_path / "dl")))
    files = [p for p in local.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in {".pkl", ".pickle", ".pt", ".pth"}]
    (weights,) = [p for p in files if p.suffix == ".safetensors"]
    assert load_file(str(weights))["layer.weight"][0, 0] == 200
    assert best.weights_sha256 is not None


def test_data_quality_report_is_logged_as_an_artifact(mlflow_server: MlflowServer, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from trainyard.plugins.storage.store import open_store
    from trainyard.plugins.tracking.artifacts import log_data_quality

    uri = mlflow_server.uri
    root = tmp_path / "dirty"
    write_jsonl(root / "s.jsonl", [{"text": "ok"}, {"text": None}, {"text": "ok"}])
    job = make_job("srv-dq", source=root.as_uri())
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0)
    report = check_data_quality(job, store=open_store(root.as_uri()))
    log_data_quality(rid, report, tracking_uri=uri)
    assert not report.success
    client = MlflowClient(uri)
    logged = json.loads(Path(client.download_artifacts(rid, "data_quality/report.json", str(tmp_path))).read_text())
    assert logged["success"] is False and logged["rows_checked"] == 3
    run = client.get_run(rid)
    assert run.data.tags["trainyard.data_quality"] == "failed"
    assert "expect_column_values_to_not_be_null" in run.data.tags["trainyard.data_quality.failed"]
    assert run.data.metrics["system/data_quality.failed_checks"] == len(report.failures)


def test_chargeback_is_logged_through_the_server(mlflow_server: MlflowServer, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = mlflow_server.uri
    job = make_job("srv-costed", team="finance", project="q4")
    run_id = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0)
    (a2,) = [a for a in fleet() if a.job == "a2"]
    acct = a2.model_copy(update={"job": "srv-costed", "team": "finance", "project": "q4", "run_id": run_id})
    cost.log_job_cost(run_id, acct, cost.job_cost(acct), tracking_uri=uri)
    assert cost.accounting_from_mlflow(uri, experiments=["finance/q4"]) == [acct]

    rows = cost.chargeback([*fleet(), acct])
    assert ("finance", "q4") in {(r.team, r.project) for r in rows}
    rid = cost.log_chargeback(rows, tracking_uri=uri, period="2026-11")
    client = MlflowClient(mlflow_server.uri)
    html = Path(client.download_artifacts(rid, "chargeback.html", str(tmp_path))).read_text()
    assert "<table>" in html and "nlp" in html
    csv_text = Path(client.download_artifacts(rid, "chargeback.csv", str(tmp_path))).read_text()
    assert csv_text.splitlines()[0].startswith("team,project,num_jobs")
