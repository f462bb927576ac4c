"""The allocation store against real databases: a SQLite file and the PostgreSQL server.

Concurrency is real: threads (each with its own connection) and, on PostgreSQL, separate
processes race to reserve the same devices; afterwards no device may be held twice and exactly
the capacity may have been granted.
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy

from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.placement.model import PlacedNode, Placement
from trainyard.plugins.state.reservations import (
    ReservationConflict,
    SlotRow,
    StateStore,
    free_devices,
    usage_by_team,
)

T0 = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)


def placement(job: str, nodes: dict[str, int], *, team: str = "demo", attempt: int = 0,
              capacity: int = 4) -> Placement:
    """A hand-made placement: `nodes` = node → devices used (all nodes the same count)."""
    slots = set(nodes.values())
    if len(slots) != 1:
        raise ValueError(f"one ranks-per-node value per placement, got {sorted(slots)}")
    k = slots.pop()
    placed = [PlacedNode(name=name, rack="r0", address="127.0.0.1", gpu_type="H100", node_gpus=capacity,
                         node_rank=i, first_rank=i * k, slots=k) for i, name in enumerate(nodes)]
    return Placement(job=job, attempt=attempt, team=team, gpu_type="H100",
                     layout=RankLayout(tp=1, pp=1, dp=k * len(placed), ranks_per_node=k), nodes=placed)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """(url, schema): a fresh SQLite file, or a fresh schema on PostgreSQL (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state.db'}", None
        return
    url = request.getfixturevalue("postgres_url")
    schema = f"trainyard_test_{uuid.uuid4().hex[:10]}"
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield url, schema
    finally:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


@pytest.fixture
def store(store_url: tuple[str, str | None]) -> Iterator[StateStore]:
    url, schema = store_url
    s = StateStore(url, schema=schema)
    yield s
    s.close()


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)  # SQLite has no schemas
def test_tables_live_in_the_test_schema(store: StateStore, store_url: tuple[str, str | None]) -> None:
    url, schema = store_url
    inspector = sqlalchemy.inspect(sqlalchemy.create_engine(url))
    assert {"trainyard_gangs", "trainyard_allocations", "trainyard_gpu_slots"} <= set(
        inspector.get_table_names(schema=schema))
    assert "trainyard_gangs" not in inspector.get_table_names(schema="public")


def test_reserve_assigns_devices_and_counts_usage(store: StateStore) -> None:
    reserved = store.reserve(placement("a", {"n0": 2, "n1": 2}), now=T0)
    assert [n.devices for n in reserved.nodes] == [[0, 1], [0, 1]]
    second = store.reserve(placement("b", {"n0": 2}, team="vision"), now=T0)
    assert second.nodes[0].devices == [2, 3]
    assert store.usage_by_team(T0) == {"demo": 4, "vision": 2}
    assert store.used_by_node(T0) == {"n0": 4, "n1": 2}
    assert free_devices(store, {"n0": 4, "n1": 4, "n2": 4}, T0) == {"n0": 0, "n1": 2, "n2": 4}
    assert store.placement("a", 0, T0) == reserved


def test_reserve_is_idempotent_per_attempt_and_refuses_a_second_live_attempt(store: StateStore) -> None:
    first = store.reserve(placement("a", {"n0": 2}), now=T0)
    again = store.reserve(placement("a", {"n1": 2}), now=T0)  # an Airflow retry: same answer
    assert again == first and store.used_by_node(T0) == {"n0": 2}
    with pytest.raises(ReservationConflict, match="job 'a' run '' attempt 0 still holds 2 devices"):
        store.reserve(placement("a", {"n1": 2}, attempt=1), now=T0)


def test_two_runs_of_one_job_are_independent_gangs(store: StateStore) -> None:
    first = store.reserve(placement("a", {"n0": 2}).model_copy(update={"run": "r-one"}), now=T0)
    second = store.reserve(placement("a", {"n1": 2}).model_copy(update={"run": "r-two"}), now=T0)
    assert (first.run, second.run) == ("r-one", "r-two")
    assert store.used_by_node(T0) == {"n0": 2, "n1": 2}
    assert store.placement("a", 0, T0, run="r-two") == second
    assert store.release("a", 0, run="r-one") == 2
    assert store.used_by_node(T0) == {"n1": 2}


def test_all_or_nothing(store: StateStore) -> None:
    store.reserve(placement("a", {"n1": 3}), now=T0)
    with pytest.raises(ReservationConflict, match="node n1 has 1 free devices; job 'b' needs 2"):
        store.reserve(placement("b", {"n0": 2, "n1": 2}), now=T0)
    assert store.used_by_node(T0) == {"n1": 3}  # nothing of b on n0
    assert store.usage_by_team(T0) == {"demo": 3}


def test_leases_expire_renew_and_release(store: StateStore, store_url: tuple[str, str | None]) -> None:
    store.reserve(placement("a", {"n0": 4}), lease_s=60, now=T0)
    assert store.usage_by_team(T0 + timedelta(seconds=59)) == {"demo": 4}
    assert store.renew("a", 0, lease_s=60, now=T0 + timedelta(seconds=50)) == T0 + timedelta(seconds=110)
    assert store.usage_by_team(T0 + timedelta(seconds=100)) == {"demo": 4}
    later = T0 + timedelta(seconds=111)
    assert store.usage_by_team(later) == {} and store.used_by_node(later) == {}
    assert store.renew("a", 0, now=later) is None  # too late: the devices may be someone else's
    # A new reservation purges the expired one and takes its devices.
    taken = store.reserve(placement("b", {"n0": 4}), now=later)
    assert taken.nodes[0].devices == [0, 1, 2, 3]
    url, schema = store_url
    if schema is None:  # the module-level helper opens the default schema; SQLite only
        assert usage_by_team(url, later) == {"demo": 4}
    assert store.release("b") == 4 and store.release("b") == 0
    assert store.usage_by_team(later) == {}


def test_expire_and_running_gangs(store: StateStore) -> None:
    store.reserve(placement("a", {"n0": 1}, team="x"), lease_s=10, now=T0)
    store.reserve(placement("b", {"n0": 1, "n1": 1}, team="y"), lease_s=1000, now=T0)
    store.record_checkpoint("b", 0, T0 + timedelta(seconds=5))
    gangs = {g.job: g for g in store.running_gangs(T0 + timedelta(seconds=1))}
    assert gangs["b"].nodes == {"n0": 1, "n1": 1} and gangs["b"].last_checkpoint_at == T0 + timedelta(seconds=5)
    assert gangs["a"].started_at == T0
    assert store.expire(T0 + timedelta(seconds=20)) == [("a", 0)]
    assert [g.job for g in store.running_gangs(T0 + timedelta(seconds=20))] == ["b"]


def _race(url: str, schema: str | None, job: str, results: list[str]) -> None:
    s = StateStore(url, schema=schema, create=False)
    try:
        s.reserve(placement(job, {"hot": 1}), now=T0)
        results.append("ok")
    except ReservationConflict:
        results.append("conflict")
    finally:
        s.close()


def _assert_no_double_booking(store: StateStore, capacity: int) -> None:
    with store.engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(sqlalchemy.select(SlotRow.node, SlotRow.slot)).all()]
    assert len(rows) == len(set(rows)) == capacity
    assert {slot for _, slot in rows} == set(range(capacity))


@pytest.mark.slow
def test_concurrent_threads_never_double_book(store: StateStore, store_url: tuple[str, str | None]) -> None:
    url, schema = store_url
    results: list[str] = []
    threads = [threading.Thread(target=_race, args=(url, schema, f"job-{i}", results)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == ["conflict"] * 8 + ["ok"] * 4  # node "hot" has 4 devices
    _assert_no_double_booking(store, 4)
    assert store.usage_by_team(T0) == {"demo": 4}


def _race_process(url: str, schema: str | None, job: str, queue: multiprocessing.Queue) -> None:
    results: list[str] = []
    _race(url, schema, job, results)
    queue.put(results[0])


@pytest.mark.slow
@pytest.mark.postgres
def test_concurrent_processes_never_double_book_on_postgres(postgres_url: str) -> None:
    schema = f"trainyard_test_{uuid.uuid4().hex[:10]}"
    engine = sqlalchemy.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f'CREATE SCHEMA "{schema}"'))
    try:
        store = StateStore(postgres_url, schema=schema)
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_race_process, args=(postgres_url, schema, f"p-{i}", queue)) for i in range(6)]
        for p in procs:
            p.start()
        outcomes = sorted(queue.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        assert outcomes == ["conflict", "conflict", "ok", "ok", "ok", "ok"]
        _assert_no_double_booking(store, 4)
        store.close()
    finally:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


def test_place_and_reserve_re_places_after_losing_a_race(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.config.cluster import load_cluster
    from trainyard.config.loader import load_spec_file
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.attempt import reserve

    job = load_spec_file("config/jobs/demo-tiny-lm.yaml")
    cluster = load_cluster("local")
    real_free = reserve.free_devices
    calls = {"n": 0}

    def stale_then_real(*args: object, **kwargs: object) -> dict[str, int]:
        # The first look sees local-0 free, but a rival books it before our commit.
        calls["n"] += 1
        if calls["n"] == 1:
            rival = placement("rival", {"local-0": 2}, capacity=2)
            rival = rival.model_copy(update={"gpu_type": "cpu"})
            answer = real_free(*args, **kwargs)
            store.reserve(rival)
            return answer
        return real_free(*args, **kwargs)

    monkeypatch.setattr(reserve, "free_devices", stale_then_real)
    placed = reserve.place_and_reserve(job, Plan(layout=RankLayout(dp=2)), cluster, store, attempt=0)
    assert placed.node_names == ["local-1"] and placed.nodes[0].devices == [0, 1]
    assert calls["n"] == 2
    # Idempotent: the same (job, attempt) again returns the reservation it holds.
    assert reserve.place_and_reserve(job, Plan(layout=RankLayout(dp=2)), cluster, store, attempt=0) == placed
