"""The embedded Airflow's SQLite waits for a busy database instead of failing a request; a
production connection string (PostgreSQL) gets none of it — psycopg2 would refuse the argument."""

from __future__ import annotations

import importlib
from pathlib import Path

from trainyard.config.airflow import airflow_env


def _imported(path: str) -> object:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_sqlite_connections_wait_for_a_busy_database(tmp_path: Path) -> None:
    env = airflow_env(tmp_path, base={})
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite:///")
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"):
        args = _imported(env[key])
        assert isinstance(args, dict) and args["timeout"] > 5  # Python's sqlite3 default is 5 s


def test_a_postgres_metadata_database_gets_no_sqlite_arguments(tmp_path: Path) -> None:
    conn = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
    env = airflow_env(tmp_path, base={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": conn})
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == conn
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS" not in env
