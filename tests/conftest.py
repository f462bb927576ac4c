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


E2E = Path(__file__).parent / "e2e"
SHARED_STACK = E2E / "shared_stack"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs the suite on pytest-xdist workers (`-n N --dist loadgroup
    --no-loadscope-reorder`); these groups say what must stay together in one worker process.
    The end-to-end tests form two groups, listed first so they start first, each on a worker of
    its own beside the rest of the suite: the tests that share one stack (their package fixture
    starts it once; they run in order) and the tests that start a stack of their own (one at a
    time: two such stacks beside the shared one would overload a 2-core machine). Every other
    module is a group, so a module's fixtures (a torchrun launch of several plans) run once.
    Without xdist the marks do nothing."""
    for item in items:
        path = Path(str(item.path))
        if path.is_relative_to(SHARED_STACK):
            group = "e2e-shared-stack"
        elif path.is_relative_to(E2E):
            group = "e2e-own-stacks"
        else:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
