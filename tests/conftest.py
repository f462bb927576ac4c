"""Fixtures shared by every suite."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from tests.support.require import missing
from trainyard.config.settings import Settings

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


_XDIST_CONTROLLER = False
"""Set in the process that hands tests to xdist's workers: it sees every worker's tests start
and end, and the workers write their own timelines."""


def pytest_configure(config: pytest.Config) -> None:
    """Where the time went, for every run: a JUnit XML (per-test durations, kept by CI as an
    artifact) under `$CI_ARTIFACTS` or `.trainyard/`, unless `--junitxml` was given. And in CI
    the Hypothesis profile `ci`: examples drawn deterministically, so a green commit stays green
    (a new random example never fails a landing; the failing one is printed to reproduce)."""
    import os

    global _XDIST_CONTROLLER
    _XDIST_CONTROLLER = bool(getattr(config.option, "numprocesses", None)) and not os.environ.get("PYTEST_XDIST_WORKER")
    if not config.option.xmlpath:
        folder = Path(os.environ.get("CI_ARTIFACTS") or Path(config.rootpath) / ".trainyard")
        folder.mkdir(parents=True, exist_ok=True)
        config.option.xmlpath = str(folder / "junit.xml")
    from hypothesis import settings as hypothesis_settings

    hypothesis_settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
    if os.environ.get("CI"):
        hypothesis_settings.load_profile("ci")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite leaves no process behind: the rank-starter templates its launches started
    (they would idle out after 300 s) are stopped once every test has ended — by the process
    that ran them all, not by a worker while the other may still be using one."""
    import os

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        from trainyard.plugins.launch.rank_zygote import stop_templates

        stop_templates()


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _timeline("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    _timeline("end", nodeid)


def _timeline(event: str, nodeid: str) -> None:
    """One line per test start and end, by worker, in `$CI_ARTIFACTS/timeline-<worker>.tsv`:
    what ran beside what — the JUnit XML has each test's duration but not when it ran, so a
    stretch where both workers wait (idle cores in a CPU-bound suite) cannot be told from it."""
    import os
    import time

    folder = os.environ.get("CI_ARTIFACTS")
    if folder and not _XDIST_CONTROLLER:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(Path(folder) / f"timeline-{worker}.tsv", "a") as out:
            out.write(f"{time.time():.2f}\t{event}\t{nodeid}\n")


E2E = "tests/e2e/"
INTEGRATION = "tests/integration/"
SHARED_STACK = "tests/e2e/shared_stack/"


def xdist_group(nodeid: str) -> str:
    """What must stay together in one worker process when `make test` runs the suite on
    pytest-xdist workers. The end-to-end tests form two groups, collected first and so started
    first, one per worker: the tests that share one stack (their package fixture starts it once;
    they run in order) and the tests that start a stack of their own (one at a time: two such
    stacks beside the shared one would overload a 2-core machine). Every other module is a
    group, so a module's fixtures (a torchrun launch of several plans) run once; a worker takes
    the next one whenever it runs low."""
    if nodeid.startswith(SHARED_STACK):
        return "e2e-shared-stack"
    if nodeid.startswith(E2E):
        return "e2e-own-stacks"
    return nodeid.split("::", 1)[0]


@functools.cache
def waiting_modules(root: Path) -> frozenset[str]:
    """The integration modules marked `waits`: they mostly wait, for a hang timeout, a node's
    grace, a stop's SIGTERM grace or a template's idle exit (33–72 % of one core over their wall
    time, alone). Read from the modules' text, not from collected items' markers: xdist's
    controller, which schedules them, collects nothing."""
    return frozenset(str(path.relative_to(root)) for path in (root / INTEGRATION).rglob("test_*.py")
                     if "pytest.mark.waits" in path.read_text())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The integration modules are spread out by kind instead of coming folder by folder: the
    modules marked `waits` (`waiting_modules`) evenly among the rest, and each folder's other
    modules evenly too (the k-th of n at (k + ½) / n of the way), so the worker tests, which
    compute, are not all at the end. In collection order the waiting modules came together, in
    launch/, node_agent/, recovery/ and sensors/, and both workers waited at once (CI's timeline:
    the cores 39–49 % busy for two minutes, ~95 % elsewhere). A module stays whole (its fixtures
    run once), and the order is the same in every worker, as xdist requires."""
    slots = [i for i, item in enumerate(items) if item.nodeid.startswith(INTEGRATION)]
    waiting = waiting_modules(config.rootpath)
    groups: dict[str, list[str]] = {}  # the waiting modules; every other folder's modules
    for module in dict.fromkeys(items[i].nodeid.split("::", 1)[0] for i in slots):  # collection order
        groups.setdefault("waits" if module in waiting else module[len(INTEGRATION):].split("/", 1)[0],
                          []).append(module)
    place = {m: (k + 0.5) / len(group) for group in groups.values() for k, m in enumerate(group)}
    moved = [items[i] for i in sorted(slots, key=lambda i: (place[items[i].nodeid.split("::", 1)[0]], i))]
    for slot, item in zip(slots, moved, strict=True):
        items[slot] = item


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's `loadgroup` cannot group here: it renames the items' node ids, which pytest 9
    derives from their structured ids. This scheduler splits the work by `xdist_group` instead,
    in collection order (the end-to-end groups come first and so start first), handing a worker
    its next group whenever it runs low — except that a worker is not handed a module marked
    `waits` while another worker has one, as long as a module that computes is left: spread in
    the order alone, a long waiting module still ran beside the next one (CI's timeline: both
    workers in waiting modules, the cores 61 % busy for two 30 s windows)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            others_wait = any(scope in waiting and not all(unit.values())
                              for other, assigned in self.assigned_work.items() if other is not node
                              for scope, unit in assigned.items())
            if others_wait:
                computing = next((scope for scope in self.workqueue if scope not in waiting), None)
                if computing is not None:
                    self.workqueue.move_to_end(computing, last=False)  # handed out next
            super()._assign_work_unit(node)

    waiting = waiting_modules(config.rootpath)
    config.option.loadscopereorder = False  # collection order: the long end-to-end groups first
    return ByGroup(config, log)
