"""The maintenance DAGs (`dags/maintenance.py`) as Airflow's loader sees them, and each task's
callable run against a real local object store with fabricated checkpoints (and a real SQLite
MLflow store for the chargeback)."""

from __future__ import annotations

import contextlib
import csv
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support.dag_file import dagbag
from tests.unit.checkpoint.fabricate import make_checkpoint
from trainyard.plugins.checkpoint.catalog import list_checkpoints, quarantine
from trainyard.plugins.checkpoint.manifest import step_dir
from trainyard.plugins.checkpoint.uris import checkpoint_root
from trainyard.plugins.errors import FatalError
from trainyard.plugins.storage.store import open_store

REPO = Path(__file__).resolve().parents[3]
OLD = datetime(2026, 1, 1, tzinfo=UTC)
RUN = "20260101t000000-abcdef"


def maintenance(bag: object) -> dict[str, object]:
    """The maintenance DAGs of the DAG file (it builds the jobs' DAGs beside them)."""
    return {k: d for k, d in bag.dags.items() if "trainyard:maintenance" in d.tags}  # type: ignore[attr-defined]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    shutil.copy(REPO / "config" / "jobs" / "demo-tiny-lm.yaml", jobs)
    monkeypatch.setenv("TRAINYARD_JOBS_DIR", str(jobs))
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    from trainyard.config.settings import get_settings

    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


@pytest.mark.parametrize("now", [
    datetime.now(UTC),
    # two minutes past midnight: inside the window where Airflow's `run_immediately=False`
    # would still pick the slot just passed (max(5 min, a tenth of the period) after it)
    datetime.now(UTC).replace(hour=0, minute=2, second=0, microsecond=0),
], ids=["now", "just-after-a-slot"])
def test_three_maintenance_dags_on_presets_with_one_task_each(env: object, now: datetime,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """…each first run at its next scheduled time, as the scheduler computes it from the
    serialised DAG: never at once when a fresh stack first sees it (its first tries used to
    fail there, queued before the API server listened). The chargeback bills a whole day."""
    import pendulum
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.timetables import trigger
    from airflow.timetables.base import TimeRestriction

    monkeypatch.setattr(trigger, "utcnow", lambda: pendulum.instance(now))

    bag = dagbag()
    assert bag.import_errors == {}
    expected = {"trainyard_checkpoint_audit": ("0 0 * * *", "audit_checkpoints", timedelta(0)),
                "trainyard_retention_sweep": ("0 * * * *", "sweep_retention", timedelta(0)),
                "trainyard_chargeback": ("0 0 * * *", "chargeback_report", timedelta(days=1))}
    assert set(maintenance(bag)) == set(expected)
    for dag_id, (cron, task, covers) in expected.items():
        dag = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags[dag_id]))
        assert (dag.timetable.summary, list(dag.task_dict)) == (cron, [task])
        assert dag.task_dict[task].has_retry_policy
        restriction = TimeRestriction(earliest=dag.start_date, latest=dag.end_date, catchup=dag.catchup)
        first = dag.timetable.next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
        assert first is not None and first.run_after > now, (dag_id, first)
        assert first.data_interval.end - first.data_interval.start == covers
    assert bag.dags["trainyard_retention_sweep"].is_paused_upon_creation is True  # it deletes: opt-in


def test_a_tasks_parse_builds_only_its_maintenance_dag(env: object, monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "trainyard_retention_sweep")
    assert set(dagbag().dags) == {"trainyard_retention_sweep"}


def test_a_task_parse_builds_a_platform_dag_by_its_prefix_and_a_job_s_without_them(
        env: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's parse imports the platform's DAG modules only when its DAG id starts with
    `PLATFORM_PREFIX`: every platform DAG must carry it, or its tasks would find no DAG."""
    from trainyard.dags import PLATFORM_PREFIX, dags
    from trainyard.dags.datasets import data_dags
    from trainyard.dags.maintenance import maintenance_dags

    monkeypatch.setenv("TRAINYARD_DEMO_DAGS", "true")
    platform = {**maintenance_dags(), **data_dags()}
    assert len(platform) == 4 and all(dag_id.startswith(PLATFORM_PREFIX) for dag_id in platform)
    for dag_id in [*platform, "demo-tiny-lm"]:
        monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", dag_id)
        assert set(dags()) == {dag_id}


def _fabricate(settings: object, job: str, steps: list[int]) -> str:
    root = checkpoint_root(settings.object_store, job, RUN)  # type: ignore[attr-defined]
    store = open_store(root)
    for step in steps:
        make_checkpoint(store, step, job=job, created_at=OLD + timedelta(minutes=step))
    return root


def test_audit_callable_passes_then_fails_naming_the_corrupt_checkpoint(env: object) -> None:
    from trainyard.operators.maintenance import audit_checkpoints

    root = _fabricate(env, "demo-tiny-lm", [10, 20])
    _fabricate(env, "orphan-job", [7])  # no spec: audited all the same
    assert audit_checkpoints(sample=10, seed=1) == {"runs": 2, "population": 3, "sampled": 3,
                                                    "hashed_bytes": sum(len(f"shard of {s}") * 100 + len(b"meta")
                                                                     for s in (10, 20, 7)),
                                                    "skipped_stores": {}}
    shard = Path(open_store(root).key_uri(f"{step_dir(20)}/__0_0.distcp").removeprefix("file://"))
    shard.write_bytes(b"X" + shard.read_bytes()[1:])
    with pytest.raises(FatalError, match=r"(?s)1 of 3 .*step-00000020/MANIFEST.json: __0_0.distcp: BLAKE3"):
        audit_checkpoints(sample=10)


def test_sweep_callable_applies_the_spec_policy_and_keeps_quarantined(env: object) -> None:
    from trainyard.operators.maintenance import sweep_retention

    steps = list(range(10, 90, 10))  # 8 checkpoints; the demo spec keeps the last maxKeep
    root = _fabricate(env, "demo-tiny-lm", steps)
    quarantine(f"{root}/{step_dir(10)}/MANIFEST.json", "restore failed verification")
    other = _fabricate(env, "orphan-job", [1, 2, 3])
    from trainyard.config.loader import load_spec_file

    keep = load_spec_file(REPO / "config" / "jobs" / "demo-tiny-lm.yaml").spec.checkpoint.max_keep
    result = sweep_retention()
    kept = [r.step for r in list_checkpoints(root)]
    assert kept == steps[-keep:]
    assert result["deleted"] == {root: steps[1:-keep]}
    assert open_store(root).exists(f"{step_dir(10)}/QUARANTINED.json")  # evidence stays
    assert open_store(root).exists(f"{step_dir(10)}/MANIFEST.json")
    assert [r.step for r in list_checkpoints(other)] == [1, 2, 3]  # no spec: no policy, untouched


def test_chargeback_callable_writes_csv_html_and_an_mlflow_run(env: object) -> None:
    from mlflow import MlflowClient

    from tests.unit.tracking.factories import make_job, make_plan
    from trainyard.operators.maintenance import chargeback_report
    from trainyard.plugins.tracking import cost, runs

    uri = env.mlflow_tracking_uri  # type: ignore[attr-defined]
    job = make_job("billed", team="acct", project="p1", gpu_type="H100", gpu_count=8)
    rid = runs.start_or_resume_run(job, make_plan(dp=8, micro_batch_size=1, num_micro_batches=2),
                                   tracking_uri=uri, attempt=0)
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    acct = cost.RunAccounting(job="billed", team="acct", project="p1", gpu_type="H100", gpu_count=8,
                              submitted_at=t0, started_at=t0, ended_at=t0 + timedelta(hours=2),
                              training_s=7200, run_id=rid)
    cost.log_job_cost(rid, acct, cost.job_cost(acct), tracking_uri=uri)
    out = chargeback_report("2026-11-02T00:00:00+00:00", "2026-11-03T00:00:00+00:00")
    rows = list(csv.DictReader(Path(out["csv"]).read_text().splitlines()))
    assert [(r["team"], r["project"], float(r["total_gpu_hours"])) for r in rows] == [("acct", "p1", 16.0)]
    assert "acct" in Path(out["html"]).read_text()
    logged = MlflowClient(uri).get_run(out["mlflow_run_id"])
    assert logged.data.metrics["system/total_gpu_hours"] == pytest.approx(16.0)
    empty = chargeback_report("2026-10-01T00:00:00", "2026-10-02T00:00:00", log_to_mlflow=False)
    assert (empty["rows"], empty["mlflow_run_id"]) == (0, "")


@pytest.fixture
def no_aws_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process has no AWS credentials at all (as on a fresh embedded stack)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_ENDPOINT_URL", "TRAINYARD_S3_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role either


def test_a_store_without_credentials_is_skipped_and_named_not_failed(env: object, no_aws_credentials: None) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from trainyard.operators.maintenance import audit_checkpoints, sweep_retention

    jobs = Path(env.jobs_dir)  # type: ignore[attr-defined]
    shutil.copy(REPO / "config" / "examples" / "llama-7b-finetune.yaml", jobs)  # checkpoints in s3://checkpoints/
    for task in (audit_checkpoints, sweep_retention):
        with pytest.raises(AirflowSkipException, match=r"s3://checkpoints/llama-7b-finetune-v3/?: no credentials"):
            task()
    root = _fabricate(env, "demo-tiny-lm", [10])  # a store it can read: audited, the other named
    audited = audit_checkpoints(sample=5)
    assert (audited["runs"], audited["sampled"]) == (1, 1)
    assert [k.rstrip("/") for k in audited["skipped_stores"]] == ["s3://checkpoints/llama-7b-finetune-v3"]
    swept = sweep_retention()
    assert swept["swept"] == 1 and list(swept["skipped_stores"]) == list(audited["skipped_stores"])
    assert [r.step for r in list_checkpoints(root)] == [10]


def test_a_fresh_stack_s_maintenance_tasks_end_without_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 no_aws_credentials: None) -> None:
    """The embedded stack's own jobs folder (`config/jobs/`, no TRAINYARD_JOBS_DIR), a fresh home:
    each maintenance task the stack schedules at start-up succeeds (or skips) at its first try —
    and that folder holds only jobs this machine runs (no production bucket, CPU devices)."""
    from airflow.sdk.exceptions import AirflowSkipException

    from trainyard.config.loader import load_spec_file
    from trainyard.config.settings import get_settings

    monkeypatch.delenv("TRAINYARD_JOBS_DIR", raising=False)
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    get_settings.cache_clear()
    try:
        assert get_settings().jobs_dir == REPO / "config" / "jobs"
        for path in sorted(get_settings().jobs_dir.glob("*.y*ml")):
            spec = load_spec_file(path).spec
            stores = [spec.checkpoint.storage or "", spec.dataset.source]
            assert not [s for s in stores if "://" in s and not s.startswith("file://")], path
            assert spec.hardware.gpu_type == "cpu", path
        bag = dagbag()
        scheduled = [dag for dag in maintenance(bag).values() if not dag.is_paused_upon_creation]
        assert {d.dag_id for d in scheduled} == {"trainyard_checkpoint_audit", "trainyard_chargeback"}
        interval = {"data_interval_start": "2026-12-01T00:00:00+00:00", "data_interval_end": "2026-12-02T00:00:00+00:00"}
        for dag in [*scheduled, bag.dags["trainyard_retention_sweep"]]:
            for task in dag.tasks:
                kwargs = {k: task.render_template(v, interval) for k, v in task.op_kwargs.items()}
                with contextlib.suppress(AirflowSkipException):  # a clean end; anything else fails
                    task.python_callable(**kwargs)
    finally:
        get_settings.cache_clear()
