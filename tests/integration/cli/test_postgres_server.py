"""The embedded PostgreSQL of a home, for real: created, started, reached through its socket
only, stopped, restarted after a crash with what was committed, and the defaults of the home's
settings following it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy

from trainyard.cli.postgres_server import EmbeddedPostgres
from trainyard.config.databases import default_url, has_cluster, socket_dir
from trainyard.config.settings import Settings

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres(tmp_path / "home", durable=False)
    yield pg
    pg.stop()


def _scalar(url: str, sql: str) -> object:
    """The first value of the last statement (`;`-separated statements run in one transaction)."""
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as conn:
            *first, last = [part for part in sql.split(";") if part.strip()]
            for statement in first:
                conn.execute(sqlalchemy.text(statement))
            result = conn.execute(sqlalchemy.text(last))
            return result.scalar() if result.returns_rows else None
    finally:
        engine.dispose()


def test_a_home_gets_its_server_and_its_settings_follow(server: EmbeddedPostgres) -> None:
    home = server.home
    assert not has_cluster(home) and Settings(home=home).state_db.startswith("sqlite:///")
    pid = server.start()
    assert server.start() == pid  # running: found, not started twice
    assert sorted(server.ensure_databases()) == ["airflow", "mlflow", "trainyard"]
    assert server.ensure_databases() == []  # idempotent
    settings = Settings(home=home)
    assert settings.state_db == default_url(home, "state") == server.url("trainyard")
    assert settings.mlflow_tracking_uri == server.url("mlflow")
    assert "PostgreSQL 18" in str(_scalar(settings.state_db, "select version()"))
    assert (socket_dir(home) / ".s.PGSQL.5432").is_socket()
    # the socket only: the server listens on no TCP address
    assert _scalar(settings.state_db, "show listen_addresses") == ""
    assert _scalar(settings.state_db, "show log_lock_waits") == "on"  # a lock wait is named in its log


def test_committed_data_survives_a_crash_and_the_next_start_reuses_the_cluster(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "home")  # durable, as `make up` runs it
    server.start()
    server.ensure_databases(["probe"])
    url = server.url("probe")
    _scalar(url, "create table t (v int); insert into t values (42)")
    os.kill(server.pid() or 0, signal.SIGKILL)  # the postmaster, as a crashed stack leaves it
    deadline = time.monotonic() + 30
    while server.pid() is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.pid() is None
    server.start()  # the stale postmaster.pid is pg_ctl's to handle
    try:
        assert _scalar(url, "select v from t") == 42
    finally:
        assert server.stop() and server.pid() is None and not server.stop()


def test_a_template_makes_a_database_without_a_migration(server: EmbeddedPostgres) -> None:
    server.start()
    server.ensure_databases(["template_src"])
    _scalar(server.url("template_src"), "create table migrated (id int); insert into migrated values (1)")
    assert server.ensure_databases(["copy"], templates={"copy": "template_src"}) == ["copy"]
    assert _scalar(server.url("copy"), "select count(*) from migrated") == 1


def test_as_root_the_server_is_not_root_and_no_folder_mode_changes(server: EmbeddedPostgres, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root needs the user namespace (a normal user runs the server as itself)")
    modes = {p: p.stat().st_mode for p in (tmp_path, tmp_path.parent)}
    pid = server.start()
    status = Path(f"/proc/{pid}/status").read_text()
    uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
    assert uid_line.split()[1] == "0"  # root outside, seen from here: its files stay root's…
    assert os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")  # …in its own user ns
    assert {p: p.stat().st_mode for p in modes} == modes
    assert (server.data / "PG_VERSION").stat().st_uid == 0
