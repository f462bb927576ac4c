"""The scale-out configuration, exercised for real: the same DAG with Airflow's metadata on
PostgreSQL and the CeleryExecutor (Redis broker), the platform state and MLflow's backend on
PostgreSQL — the tiny job through it, so the production path is more than a compose file.

Uses the PostgreSQL and Redis servers of the test machine (127.0.0.1); each gets databases of
its own (dropped after) and a Redis database number of its own (flushed after). Skips, with the
reason, where a server does not answer.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.airflow_stack import running_stack
from tests.support.require import missing

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

REDIS = ("127.0.0.1", 6379)


def _redis_or_skip() -> None:
    try:
        with socket.create_connection(REDIS, timeout=2) as conn:
            conn.sendall(b"PING\r\n")
            assert conn.recv(16).startswith(b"+PONG")
    except (OSError, AssertionError) as e:
        missing("redis", f"no Redis server answers at {REDIS[0]}:{REDIS[1]} ({type(e).__name__})")


@pytest.fixture
def databases(postgres_url: str) -> Iterator[dict[str, str]]:
    import sqlalchemy

    _redis_or_skip()
    tag = uuid.uuid4().hex[:8]
    names = {part: f"trainyard_e2e_{part}_{tag}" for part in ("airflow", "mlflow", "state")}
    admin = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for name in names.values():
            conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    base = postgres_url.rsplit("/", 1)[0]
    try:
        yield {part: f"{base}/{name}" for part, name in names.items()}
    finally:
        with admin.connect() as conn:
            for name in names.values():
                conn.execute(sqlalchemy.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                             "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": name})
                conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def test_the_tiny_job_runs_on_postgres_celery_and_redis(databases: dict[str, str], tmp_path: Path) -> None:
    import random

    redis_db = random.randint(1, 15)
    broker = f"redis://{REDIS[0]}:{REDIS[1]}/{redis_db}"
    overrides = {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": databases["airflow"],
        "AIRFLOW__CELERY__BROKER_URL": broker,
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + databases["airflow"],  # postgresql+psycopg2: SQLAlchemy 2.1 defaults to psycopg 3
        "TRAINYARD_STATE_DB": databases["state"],
        "TRAINYARD_MLFLOW_TRACKING_URI": databases["mlflow"],
    }
    try:
        with running_stack(tmp_path / "home", overrides=overrides) as stack:
            assert "celery-worker" in stack.stack.components
            attempts = stack.train({"max_steps": 20})
            assert [(a.outcome, a.action) for a in attempts] == [("completed", "register")], \
                f"{attempts}\n{stack.logs()}"
            worker_log = stack.stack.log_file("celery-worker").read_text(errors="replace")
            assert "launch_training" in worker_log  # the tasks ran on the Celery worker

            from trainyard.plugins.state.jobs import JobStateStore
            from trainyard.plugins.tracking.runs import client_for

            run = attempts[0].run
            assert JobStateStore(databases["state"]).get_run("demo-tiny-lm", run).state == "completed"
            mlflow = client_for(databases["mlflow"])
            (found,) = mlflow.search_runs(
                [mlflow.get_experiment_by_name("demo/tiny-lm").experiment_id],
                filter_string=f"tags.`trainyard.run` = '{run}'")
            assert found.data.tags["trainyard.status"] == "completed"
            assert {m.step for m in mlflow.get_metric_history(found.info.run_id, "loss")} == set(range(1, 21))
            assert mlflow.search_model_versions(f"run_id = '{found.info.run_id}'")
    finally:
        import redis

        redis.Redis(host=REDIS[0], port=REDIS[1], db=redis_db).flushdb()
