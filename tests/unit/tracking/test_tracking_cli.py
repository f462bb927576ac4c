"""`trainyard models` and `trainyard cost report`, run in-process against a real SQLite store."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.tracking.factories import export_marking_the_step, make_job, make_plan, trained_run
from tests.unit.tracking.factories import registry_dataset as dataset
from tests.unit.tracking.test_cost_model import fleet
from trainyard.cli.cost import parse_period
from trainyard.cli.main import main
from trainyard.cli.models import split_dataset_arg
from trainyard.config.settings import get_settings
from trainyard.plugins.data.datasets import DatasetRef
from trainyard.plugins.tracking import cost, registry, runs


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Process settings rooted in tmp_path (the CLI reads get_settings())."""
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / ".trainyard"))
    get_settings.cache_clear()
    yield tmp_path / ".trainyard"
    get_settings.cache_clear()


@pytest.mark.parametrize(("arg", "expected"), [
    ("s3://datasets/wiki@v3", ("s3://datasets/wiki", "v3")),
    ("datasets/wiki/@v3", ("datasets/wiki/", "v3")),
    ("s3://datasets/wiki/", ("s3://datasets/wiki/", None)),
    ("s3://user@bucket/wiki/", ("s3://user@bucket/wiki/", None)),
])
def test_dataset_argument_splits_off_the_version(arg: str, expected: tuple[str, str | None]) -> None:
    assert split_dataset_arg(arg) == expected


def test_models_lists_versions_trained_on_a_dataset_version(
    sqlite_tracking_uri: str, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard.cli import output

    monkeypatch.setattr(output, "console", output.Console(width=80, highlight=False))
    rid = trained_run(sqlite_tracking_uri, "cli-models", dataset("v3", "e" * 64), {10: 1.0})
    registry.register_checkpoint(rid, tracking_uri=sqlite_tracking_uri, export=export_marking_the_step)
    assert main(["models", "--dataset", "s3://datasets/wiki/@v3", "--tracking-uri", sqlite_tracking_uri,
                 "--digest", "e" * 64, "--json"]) == 0
    (found,) = json.loads(capsys.readouterr().out)
    assert (found["name"], found["run_id"], found["dataset_version"], found["aliases"]) == (
        "cli-models", rid, "v3", ["candidate"])
    assert main(["models", "--dataset", "s3://datasets/wiki@v3", "--tracking-uri", sqlite_tracking_uri]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("cli-models")]
    assert line.split()[:5] == ["cli-models", "1", "candidate", rid[:8], "10"], out
    assert max(map(len, out.splitlines())) <= 80, out
    assert main(["models", "--dataset", "s3://datasets/wiki@v99", "--tracking-uri", sqlite_tracking_uri]) == 0
    out = capsys.readouterr().out
    assert "no registered model version was trained on s3://datasets/wiki@v99" in out
    # what to ask instead (the tracking store is the session's: other tests' versions show too)
    assert any(line.startswith("  s3://datasets/wiki  (versions: ") and "v3" in line for line in out.splitlines()), out


def test_models_resolves_an_object_store_prefix_like_the_spec_does(
    sqlite_tracking_uri: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = home / "objects"
    ds = DatasetRef(uri=(objects / "datasets/local").as_uri(), version="v1", digest="f" * 64,
                    digest_method="content", num_shards=1, total_bytes=10)
    rid = trained_run(sqlite_tracking_uri, "cli-local", ds, {5: 1.0})
    registry.register_checkpoint(rid, tracking_uri=sqlite_tracking_uri, export=export_marking_the_step)
    assert main(["models", "--dataset", "datasets/local/@v1", "--tracking-uri", sqlite_tracking_uri, "--json"]) == 0
    assert [m["name"] for m in json.loads(capsys.readouterr().out)] == ["cli-local"]


def test_cost_report_from_json_writes_csv_and_html_and_logs_to_mlflow(
    sqlite_tracking_uri: str, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient

    records = tmp_path / "acct.json"
    records.write_text(json.dumps([a.model_dump(mode="json") for a in fleet()]))
    out_csv, out_html = tmp_path / "r.csv", tmp_path / "r.html"
    assert main(["cost", "report", "--from-json", str(records), "--month", "2026-11", "--csv", str(out_csv),
                 "--html", str(out_html), "--log-mlflow", "--tracking-uri", sqlite_tracking_uri, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["period"] == "2026-11"
    assert [r["team"] for r in result["rows"]] == ["nlp", "vision", "demo"]
    assert [r["team"] for r in csv.DictReader(io.StringIO(out_csv.read_text()))] == ["nlp", "vision", "demo"]
    assert "<table>" in out_html.read_text()
    client = MlflowClient(sqlite_tracking_uri)
    run = client.get_run(result["mlflow_run_id"])
    assert client.get_experiment(run.info.experiment_id).name == "trainyard/chargeback"
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["chargeback.csv", "chargeback.html"]
    assert run.data.metrics["system/total_cost_usd"] == pytest.approx(sum(r["total_cost_usd"] for r in result["rows"]))
    # A month with no job
    assert main(["cost", "report", "--from-json", str(records), "--month", "2026-10"]) == 0
    assert "no jobs in 2026-10" in capsys.readouterr().out


def test_cost_report_reads_runs_from_mlflow(tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path / 'own.db'}"  # a store of its own: the report covers every run in it
    job = make_job("costed", team="acct", project="p1", gpu_type="H100", gpu_count=8)
    rid = runs.start_or_resume_run(job, make_plan(dp=8, micro_batch_size=1, num_micro_batches=2),
                                   tracking_uri=uri, attempt=0)
    (a,) = [x for x in fleet() if x.job == "a2"]
    acct = a.model_copy(update={"job": "costed", "team": "acct", "project": "p1", "run_id": rid})
    cost.log_job_cost(rid, acct, cost.job_cost(acct), tracking_uri=uri)
    # A second run without recorded accounting: derived from the run's own times and tags.
    other = runs.start_or_resume_run(make_job("derived", team="acct", project="p2", gpu_type="H100"), make_plan(),
                                     tracking_uri=uri, attempt=0)
    runs.log_recovery_event(other, "hang", 0, 3, tracking_uri=uri, duration_s=0.0)
    runs.set_run_status(other, "completed", tracking_uri=uri)
    accounts = {x.job: x for x in cost.accounting_from_mlflow(uri)}
    assert accounts["costed"] == acct
    assert (accounts["derived"].gpu_type, accounts["derived"].gpu_count, accounts["derived"].run_id) == ("H100", 2, other)
    assert main(["cost", "report", "--tracking-uri", uri, "--json"]) == 0
    rows = {(r["team"], r["project"]): r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows[("acct", "p1")]["total_gpu_hours"] == pytest.approx(160)
    assert rows[("acct", "p2")]["num_jobs"] == 1
    assert cost.accounting_from_mlflow(uri, experiments=["no/such"]) == []


@pytest.mark.parametrize(("args", "message"), [
    (["--month", "11-2026"], "--month must look like 2026-11"),
    (["--since", "2026-11-10", "--until", "2026-11-01"], "must be after --since"),
    (["--since", "yesterday"], "--since must be an ISO 8601 date"),
])
def test_bad_periods_are_usage_errors(args: list[str], message: str, home: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "report", *args]) == 2
    assert message in capsys.readouterr().err


def test_parse_period_month_bounds() -> None:
    since, until, label = parse_period("2026-12", None, None)
    assert (since.isoformat(), until.isoformat(), label) == (  # type: ignore[union-attr]
        "2026-12-01T00:00:00+00:00", "2027-01-01T00:00:00+00:00", "2026-12")


def test_cost_report_takes_mfu_and_throughput_from_the_run_and_prints_small_values(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime as dt

    from trainyard.plugins.tracking.metrics import MetricsStreamer

    uri = f"sqlite:///{tmp_path / 'own.db'}"
    job = make_job("tiny-costed", team="demo", project="tiny", gpu_type="cpu", gpu_count=2)
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0)
    with MetricsStreamer(uri, rid, flush_every_s=60) as s:  # what the demo's rank 0 streams
        s.log(1, {"mfu": 0.17, "tokens_per_s": 15000.0})
        s.log(2, {"mfu": 0.185, "tokens_per_s": 16000.0})
    t0 = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
    # What the demo records: times only; it never knew MFU or throughput.
    acct = cost.RunAccounting(job=job.name, team="demo", project="tiny", gpu_type="cpu", gpu_count=2,
                              submitted_at=t0, started_at=t0, ended_at=t0 + dt.timedelta(seconds=75),
                              training_s=60, recovery_s=15, run_id=rid)
    cost.log_job_cost(rid, acct, cost.job_cost(acct), tracking_uri=uri)
    recorded = cost.RunAccounting.model_validate_json(
        runs.client_for(uri).get_run(rid).data.tags[cost.ACCOUNTING_TAG])
    assert (recorded.mfu, recorded.tokens_per_s) == (0.185, 16000.0)  # the tag now records them
    assert [m.step for m in runs.client_for(uri).get_metric_history(rid, "mfu")] == [1, 2]  # no step-0 point

    assert main(["cost", "report", "--tracking-uri", uri, "--json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)["rows"]
    assert r["avg_mfu_pct"] == pytest.approx(18.5) and r["avg_tokens_per_s"] == pytest.approx(16000)

    monkeypatch.setenv("COLUMNS", "80")
    from trainyard.cli import output

    monkeypatch.setattr(output, "console", output.Console(width=80, highlight=False))
    assert main(["cost", "report", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80, out
    (line,) = [x for x in lines if x.lstrip().startswith("demo")]
    # 2 devices × 75 s = 0.042 GPU-hours (15 s of it recovery) at $0.05 an hour: none prints as 0
    assert line.split()[:9] == ["demo", "tiny", "1", "0.042", "0.0083", "0.0021", "20.0", "18.5", "16,000"], out


def test_one_name_per_quantity_across_params_metrics_and_reports(tmp_path: Path) -> None:
    """The plan's estimate is the param `plan.<name>`, the measurement the metric `<name>`, and
    the reports' columns the same words."""
    import datetime as dt

    from trainyard.plugins.tracking.params import plan_params

    plan = make_plan(tokens_per_s=15000.0, mfu=0.4, step_time_s=0.1)
    assert {"plan.tokens_per_s", "plan.mfu", "plan.step_time_s"} <= set(plan_params(plan))
    worker = Path(__file__).resolve().parents[3] / "worker"
    logged = (worker / "step_metrics.py").read_text()  # what the session logs each window
    assert '"tokens_per_s"' in logged
    assert not any("tokens_per_second" in f.read_text() for f in worker.glob("*.py"))
    uri = f"sqlite:///{tmp_path / 'names.db'}"
    rid = runs.start_or_resume_run(make_job("names"), plan, tracking_uri=uri, attempt=0)
    t0 = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
    acct = cost.RunAccounting(job="names", team="demo", gpu_type="cpu", gpu_count=2, submitted_at=t0,
                              training_s=10, run_id=rid)
    cost.log_job_cost(rid, acct, cost.job_cost(acct), tracking_uri=uri)
    logged = set(runs.client_for(uri).get_run(rid).data.metrics)
    # the same names, on the System metrics tab (`metrics.series_key`)
    assert {f"system/{n}" for n in cost.RUN_COST_METRICS} <= logged and set(cost.RUN_COST_METRICS) <= set(cost.CSV_COLUMNS)
