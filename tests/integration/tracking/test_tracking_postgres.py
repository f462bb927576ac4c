"""The tracking engine on a PostgreSQL-backed MLflow store (a database created and dropped here)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.tracking.factories import (
    SHA,
    export_marking_the_step,
    make_job,
    make_plan,
    registry_dataset,
)
from trainyard.plugins.tracking import registry, runs
from trainyard.plugins.tracking.metrics import MetricsStreamer

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def postgres_tracking_uri(postgres_url: str) -> Iterator[str]:
    """A fresh database for MLflow's schema, dropped afterwards (the shared `test` db stays clean)."""
    import sqlalchemy

    name = f"trainyard_mlflow_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    uri = postgres_url.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield uri
    finally:
        # MLflow keeps a pooled engine per URI in this process; end its sessions, then drop.
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": name})
            conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def test_resume_and_lineage_on_postgres(postgres_tracking_uri: str, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = postgres_tracking_uri
    client = MlflowClient(uri)
    # A database store used directly has no artifact root of its own: give the experiment one.
    client.create_experiment("pg/lineage", artifact_location=(tmp_path / "artifacts").as_uri())
    job = make_job("pg-job", team="pg", project="lineage")
    ds = registry_dataset("v3", "3" * 64)

    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0, dataset=ds)
    with MetricsStreamer(uri, rid, flush_every_s=0.2) as s:
        for step in range(8):
            s.log(step, {"loss": 2.0 - step * 0.1})
    runs.log_recovery_event(rid, "oom", 0, 7, "CUDA out of memory", tracking_uri=uri)
    assert runs.start_or_resume_run(job, make_plan(micro_batch_size=2, num_micro_batches=4),
                                    tracking_uri=uri, run_id=rid, attempt=1, dataset=ds) == rid
    with MetricsStreamer(uri, rid, flush_every_s=0.2) as s:
        for step in range(4, 12):
            s.log(step, {"loss": 1.7 - step * 0.05})
    runs.log_checkpoint(rid, "file:///pg/step-00000012/MANIFEST.json", SHA, 12, {"loss": 1.1}, tracking_uri=uri)
    runs.set_run_status(rid, "completed", tracking_uri=uri)

    run = client.get_run(rid)
    # Steps 4..7 were logged by attempt 0: attempt 1's replay of them goes to loss.replay.
    assert sorted(m.step for m in client.get_metric_history(rid, "loss")) == list(range(12))
    assert sorted(m.step for m in client.get_metric_history(rid, "loss.replay")) == [4, 5, 6, 7]
    assert run.data.tags["trainyard.attempt.1.plan.micro_batch_size"] == "2"
    assert run.data.tags["trainyard.failure_causes"] == "oom"

    info = registry.register_checkpoint(rid, tracking_uri=uri, export=export_marking_the_step)
    found = registry.models_trained_on("s3://datasets/wiki", "v3", tracking_uri=uri)
    assert [(m.name, m.version, m.run_id, m.aliases) for m in found] == [("pg-job", info.version, rid, ["candidate"])]
