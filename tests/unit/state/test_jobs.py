"""The job state on real databases: a SQLite file and the PostgreSQL server (its own schema,
dropped afterwards; skipped with the reason where no server answers)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy

from trainyard.plugins.errors import FatalError
from trainyard.plugins.recovery.model import AttemptConf, FailureReport, RecoveryAction
from trainyard.plugins.run.model import AgentRecord, RunHandle
from trainyard.plugins.state.jobs import IllegalTransition, JobStateStore, RunNotFound

T0 = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobStateStore]:
    if request.param == "sqlite":
        s = JobStateStore(f"sqlite:///{tmp_path / 'state.db'}")
        yield s
        s.close()
        return
    url = request.getfixturevalue("postgres_url")
    schema = f"trainyard_test_{uuid.uuid4().hex[:10]}"
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f'CREATE SCHEMA "{schema}"'))
    s = JobStateStore(url, schema=schema)
    try:
        yield s
    finally:
        s.close()
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


def handle(attempt: int = 0) -> RunHandle:
    return RunHandle(kind="local", job="tiny", attempt=attempt, world_size=2, run_dir=f"/runs/tiny/{attempt}", created_at=T0,
                     agents=[AgentRecord(node="local-0", node_rank=0, pid=123, pgid=123, nproc=2)])


def report(run: str, attempt: int, outcome: str, **kw: object) -> FailureReport:
    return FailureReport(job="tiny", run=run, attempt=attempt, outcome=outcome, reason=f"{outcome} here",
                         evidence=["launcher: failed"], step=10 * (attempt + 1), **kw)


def test_open_run_is_idempotent_per_trigger_key(store: JobStateStore) -> None:
    first = store.open_run("tiny", trigger_key="manual__2026-11-30", team="demo", project="lm", now=T0)
    again = store.open_run("tiny", trigger_key="manual__2026-11-30", now=T0 + timedelta(seconds=5))
    other = store.open_run("tiny", trigger_key="manual__2026-12-01", now=T0 + timedelta(seconds=9))
    assert again.run == first.run and other.run != first.run
    assert (first.state, first.team, first.project, first.attempts) == ("pending", "demo", "lm", 0)
    assert first.created_at == T0
    assert [r.run for r in store.list_runs("tiny")] == [other.run, first.run]  # newest first
    assert store.get_run("tiny").run == other.run  # latest by default
    assert store.open_run("other-job", trigger_key="manual__2026-11-30").run != first.run
    with pytest.raises(ValueError, match="trigger_key"):
        store.open_run("tiny", trigger_key="")


def test_concurrent_opens_of_one_trigger_make_one_run(store: JobStateStore) -> None:
    runs: list[str] = []
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            runs.append(store.open_run("tiny", trigger_key="race").run)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=open_it) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(runs)) == 1 and len(runs) == 6


def test_lifecycle_is_checked(store: JobStateStore) -> None:
    run = store.open_run("tiny", trigger_key="k").run
    for state in ("scheduling", "starting", "running", "running", "recovering", "scheduling", "starting",
                  "running"):
        assert store.transition("tiny", run, state).state == state
    with pytest.raises(IllegalTransition) as bad:
        store.transition("tiny", run, "pending")
    assert isinstance(bad.value, FatalError)
    assert "'running' to 'pending'" in str(bad.value) and (bad.value.current, bad.value.requested) == (
        "running", "pending")
    done = store.transition("tiny", run, "completed", reason="registered v3")
    assert (done.state, done.final_reason, done.final) == ("completed", "registered v3", True)
    with pytest.raises(IllegalTransition, match="nothing \\(final\\)"):
        store.transition("tiny", run, "recovering")
    with pytest.raises(RunNotFound, match="trainyard jobs"):
        store.transition("tiny", "r-nope", "running")


def test_attempts_record_handle_outcome_and_action(store: JobStateStore) -> None:
    run = store.open_run("tiny", trigger_key="k", now=T0).run
    store.transition("tiny", run, "scheduling")
    store.transition("tiny", run, "starting")
    a0 = store.start_attempt("tiny", run, 0, dag_run_id="manual__1", now=T0)
    assert store.start_attempt("tiny", run, 0, handle=handle(0)).dag_run_id == "manual__1"  # idempotent
    assert store.live_attempt("tiny", run).run_handle == handle(0)
    assert a0.state == "running"
    store.transition("tiny", run, "running")

    crash = report(run, 0, "worker_crash", rank=1, exit_code=-9, restarts_in_place=1,
                   ended_at=T0 + timedelta(seconds=30))
    restart = RecoveryAction(kind="restart", reason="worker_crash: restart the same gang from step 10")
    info = store.finish_attempt(crash, restart)
    assert (info.state, info.attempts, info.last_cause) == ("recovering", 1, "worker_crash")
    assert store.live_attempt("tiny", run) is None

    store.start_attempt("tiny", run, 1, handle=handle(1), now=T0 + timedelta(seconds=40))
    store.transition("tiny", run, "starting")
    store.transition("tiny", run, "running")
    done = report(run, 1, "completed", ended_at=T0 + timedelta(seconds=100))
    info = store.finish_attempt(done, RecoveryAction(kind="register", reason="register the model"))
    # not over until the registration is: no surface may say "completed" of a run whose model
    # then fails to register (issue 57)
    assert (info.state, info.final_reason, info.last_cause) == ("running", "", "worker_crash")

    first, second = store.attempts("tiny", run)
    assert (first.outcome, first.action, first.restarts_in_place, first.step, first.duration_s) == (
        "worker_crash", "restart", 1, 10, 30.0)
    assert first.failure_report == crash and first.run_handle == handle(0)
    assert (second.outcome, second.action, second.duration_s) == ("completed", "register", 60.0)
    history = [first.record()]
    assert history[0].exit_code == -9 and history[0].action == "restart"
    conf = AttemptConf(run=run, history=history)
    assert conf.history[0].reason == "worker_crash here"


def test_give_up_fails_the_run_and_a_cancelled_run_never_recovers(store: JobStateStore) -> None:
    run = store.open_run("tiny", trigger_key="a").run
    store.start_attempt("tiny", run, 0)
    for state in ("scheduling", "starting", "running"):
        store.transition("tiny", run, state)
    info = store.finish_attempt(report(run, 0, "oom"), RecoveryAction(kind="give_up", reason="nothing fits"))
    assert (info.state, info.final_reason) == ("failed", "nothing fits")

    other = store.open_run("tiny", trigger_key="b").run
    store.start_attempt("tiny", other, 0)
    for state in ("scheduling", "starting", "running", "cancelled"):
        store.transition("tiny", other, state, reason="trainyard stop")
    with pytest.raises(IllegalTransition):
        store.finish_attempt(report(other, 0, "worker_crash"), RecoveryAction(kind="restart", reason="r"))


def test_cordons(store: JobStateStore) -> None:
    assert store.cordoned() == {}
    c = store.cordon("local-1", "gpu_failed: Xid 79", by="watch_health", now=T0)
    again = store.cordon("local-1", "another reason", now=T0 + timedelta(hours=1))
    assert again == c and (c.reason, c.by, c.since) == ("gpu_failed: Xid 79", "watch_health", T0)
    store.cordon("local-0", "disk full")
    assert list(store.cordoned()) == ["local-0", "local-1"]
    assert store.uncordon("local-1") is True and store.uncordon("local-1") is False
    assert list(store.cordoned()) == ["local-0"]


def test_shares_the_database_with_placement(tmp_path: Path) -> None:
    from trainyard.plugins.state.reservations import StateStore

    url = f"sqlite:///{tmp_path / 'state.db'}"
    StateStore(url).close()
    JobStateStore(url).close()
    tables = set(sqlalchemy.inspect(sqlalchemy.create_engine(url)).get_table_names())
    assert {"trainyard_gangs", "trainyard_runs", "trainyard_attempts", "trainyard_node_cordons"} <= tables


def test_begin_attempt_walks_the_lifecycle_and_refuses_a_final_run(store: JobStateStore) -> None:
    from trainyard.plugins.attempt.bookkeeping import begin_attempt

    run = store.open_run("tiny", trigger_key="b").run
    assert begin_attempt(store, "tiny", run, 0).state == "starting"
    assert begin_attempt(store, "tiny", run, 0).state == "starting"  # a retried task
    store.transition("tiny", run, "cancelled", reason="trainyard stop")
    with pytest.raises(IllegalTransition, match="'cancelled' to 'starting'"):
        begin_attempt(store, "tiny", run, 1)
    assert [a.attempt for a in store.attempts("tiny", run)] == [0]
