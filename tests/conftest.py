"""Fixtures shared by every suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.settings import Settings
from tests.support.require import missing

POSTGRES_ADDRESS = ("127.0.0.1", 5432)
POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Embedded-default settings rooted in a fresh temporary folder."""
    return Settings(home=tmp_path / ".trainyard")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The test machine's PostgreSQL. Where nothing listens on its port the test skips (fails
    in CI: `tests.support.require`); any other error — a refused login, a missing database —
    is an error of the test run, not a reason to skip."""
    import socket

    import sqlalchemy

    try:
        socket.create_connection(POSTGRES_ADDRESS, timeout=3).close()
    except OSError as e:
        missing("postgres", f"no PostgreSQL server answers at {POSTGRES_ADDRESS[0]}:{POSTGRES_ADDRESS[1]} "
                            f"({type(e).__name__}: {e})")
    engine = sqlalchemy.create_engine(POSTGRES_URL)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("select 1"))
    finally:
        engine.dispose()
    return POSTGRES_URL


def pytest_configure(config: pytest.Config) -> None:
    """Where the time went, for every run: a JUnit XML (per-test durations, kept by CI as an
    artifact) under `$CI_ARTIFACTS` or `.trainyard/`, unless `--junitxml` was given. And in CI
    the Hypothesis profile `ci`: examples drawn deterministically, so a green commit stays green
    (a new random example never fails a landing; the failing one is printed to reproduce)."""
    import os

    if not config.option.xmlpath:
        folder = Path(os.environ.get("CI_ARTIFACTS") or Path(config.rootpath) / ".trainyard")
        folder.mkdir(parents=True, exist_ok=True)
        config.option.xmlpath = str(folder / "junit.xml")
    from hypothesis import settings as hypothesis_settings

    hypothesis_settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
    if os.environ.get("CI"):
        hypothesis_settings.load_profile("ci")
