"""Allocations in the platform state database: reserve (all or nothing), lease, renew, release.

SQLite file by default (`Settings.state_db`), PostgreSQL by URL. Three tables, prefixed
`trainyard_` so they can share a database with Airflow or MLflow:

- `trainyard_gangs`        one row per reserved (job, run, attempt): team, priority, the placement
                           JSON, lease expiry, last checkpoint time (for preemption).
- `trainyard_allocations`  one row per (gang, node): team, node, gpus, device indices, lease.
- `trainyard_gpu_slots`    one row per device held, UNIQUE (node, slot).

Why a row per device: the unique constraint makes double-booking impossible under any
isolation level and on both backends. Two concurrent reservations that want the same device
cannot both commit — on PostgreSQL the second insert waits for the first transaction and then
fails with a unique violation; on SQLite writers are serialised (`BEGIN IMMEDIATE`). The loser
retries against the new state and either takes other free devices or fails with
`ReservationConflict` naming the node. Nodes are written in name order so two transactions never
wait on each other in opposite orders.

Leases: a reservation holds until `lease_expires_at`; whoever watches the job renews it (the
training sensor, `trainyard launch`). Expired reservations are ignored by every read and
purged by the next reservation, so a crashed control plane cannot leak devices forever.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    Engine,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    delete,
    func,
    inspect,
    select,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from trainyard.plugins.errors import FatalError, TransientError
from trainyard.plugins.placement.fairshare import RunningGang
from trainyard.plugins.placement.model import Placement
from trainyard.plugins.state.db import TABLE_PREFIX, SqlStore, UTCDateTime

RESERVATION_LEASE_S = 900.0
"""The one lease of a gang's reservation. Whoever watches the gang (the training trigger,
`trainyard launch`, its follower) renews it every `RENEW_EVERY_S`; a control plane that is
gone for longer than this frees the devices rather than leaking them."""
RENEW_EVERY_S = 60.0
"""How often a watcher renews: a fifteenth of the lease, so a few missed renewals never lose it."""


class ReservationConflict(TransientError):
    """The devices the placement wants are (no longer) free; re-place and try again."""


class StateSchemaOutdated(FatalError):
    """The state database was written by an older Trainyard; it must be recreated."""


class Base(DeclarativeBase):
    pass


class GangRow(Base):
    __tablename__ = f"{TABLE_PREFIX}gangs"
    __table_args__ = (UniqueConstraint("job", "run", "attempt", name=f"{TABLE_PREFIX}gangs_job_run_attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    run: Mapped[str] = mapped_column(String(64), default="")
    """The training run (one trigger of the job): two runs of a job are independent gangs."""
    attempt: Mapped[int] = mapped_column(Integer)
    team: Mapped[str] = mapped_column(String(128), index=True)
    priority: Mapped[str] = mapped_column(String(32))
    gpu_type: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)
    placement: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    lease_expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    last_checkpoint_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class AllocationRow(Base):
    __tablename__ = f"{TABLE_PREFIX}allocations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gang_id: Mapped[int] = mapped_column(ForeignKey(f"{TABLE_PREFIX}gangs.id", ondelete="CASCADE"), index=True)
    job: Mapped[str] = mapped_column(String(128))
    attempt: Mapped[int] = mapped_column(Integer)
    team: Mapped[str] = mapped_column(String(128))
    node: Mapped[str] = mapped_column(String(253), index=True)
    gpus: Mapped[int] = mapped_column(Integer)
    devices: Mapped[str] = mapped_column(String(256))
    """Comma-separated device indices on the node."""
    lease_expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)


class SlotRow(Base):
    __tablename__ = f"{TABLE_PREFIX}gpu_slots"
    __table_args__ = (UniqueConstraint("node", "slot", name=f"{TABLE_PREFIX}gpu_slots_node_slot"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    allocation_id: Mapped[int] = mapped_column(
        ForeignKey(f"{TABLE_PREFIX}allocations.id", ondelete="CASCADE"), index=True)
    node: Mapped[str] = mapped_column(String(253))
    slot: Mapped[int] = mapped_column(Integer)


class StateStore(SqlStore):
    """The allocation store; one per database URL (see `open_state`)."""

    metadata = Base.metadata

    def check_schema(self, schema: str | None) -> None:
        _check_schema(self.engine, schema)

    # --- writes -----------------------------------------------------------------------------

    def reserve(self, placement: Placement, *, lease_s: float = RESERVATION_LEASE_S,
                now: datetime | None = None) -> Placement:
        """Reserve every device of `placement` in one transaction, or none.

        Idempotent per (job, run, attempt): reserving again while the lease is live returns the
        stored placement (an Airflow retry re-attaches, it never books twice). Returns the
        placement with each node's device indices filled in. Raises `ReservationConflict`.
        """
        return self._write(self._reserve_once, placement, lease_s, now or datetime.now(UTC))

    def _reserve_once(self, placement: Placement, lease_s: float, now: datetime) -> Placement:
        expires = now + timedelta(seconds=lease_s)
        with self._transaction() as s:
            self._purge_expired(s, now)
            live = s.scalars(select(GangRow).where(GangRow.job == placement.job,
                                                   GangRow.run == placement.run)).all()
            for gang in live:
                if gang.attempt == placement.attempt:
                    return Placement.model_validate_json(gang.placement)
                raise ReservationConflict(
                    f"job {placement.job!r} run {placement.run!r} attempt {gang.attempt} still holds {gang.gpus} devices "
                    f"until {gang.lease_expires_at:%Y-%m-%d %H:%M:%S}Z; release it before reserving "
                    f"attempt {placement.attempt}")
            nodes = sorted(placement.nodes, key=lambda n: n.name)
            taken = _slots_in_use(s, [n.name for n in nodes])
            devices: dict[str, list[int]] = {}
            for node in nodes:
                free = [i for i in range(node.node_gpus) if i not in taken.get(node.name, set())]
                if len(free) < node.slots:
                    raise ReservationConflict(
                        f"node {node.name} has {len(free)} free devices; job {placement.job!r} "
                        f"needs {node.slots}")
                devices[node.name] = free[: node.slots]
            reserved = placement.model_copy(update={"nodes": [
                n.model_copy(update={"devices": devices[n.name]}) for n in placement.nodes]})
            gang = GangRow(job=placement.job, run=placement.run, attempt=placement.attempt, team=placement.team,
                           priority=placement.priority, gpu_type=placement.gpu_type,
                           gpus=placement.layout.world_size, placement=reserved.model_dump_json(),
                           created_at=now, lease_expires_at=expires)
            s.add(gang)
            s.flush()
            for node in nodes:
                alloc = AllocationRow(gang_id=gang.id, job=placement.job, attempt=placement.attempt,
                                      team=placement.team, node=node.name, gpus=node.slots,
                                      devices=",".join(map(str, devices[node.name])),
                                      lease_expires_at=expires)
                s.add(alloc)
                s.flush()
                s.add_all(SlotRow(allocation_id=alloc.id, node=node.name, slot=i) for i in devices[node.name])
                s.flush()
            return reserved

    def renew(self, job: str, attempt: int, *, run: str = "", lease_s: float = RESERVATION_LEASE_S,
              now: datetime | None = None) -> datetime | None:
        """Extend a live lease; None when the reservation is gone or already expired (its
        devices may belong to someone else by now: the caller must stop the job)."""
        now = now or datetime.now(UTC)
        expires = now + timedelta(seconds=lease_s)
        with self._transaction() as s:
            gang = s.scalars(select(GangRow).where(GangRow.job == job, GangRow.run == run,
                                                   GangRow.attempt == attempt,
                                                   GangRow.lease_expires_at > now)).first()
            if gang is None:
                return None
            gang.lease_expires_at = expires
            s.execute(update(AllocationRow).where(AllocationRow.gang_id == gang.id)
                      .values(lease_expires_at=expires))
            return expires

    def record_checkpoint(self, job: str, attempt: int, at: datetime | None = None, *, run: str = "") -> None:
        """Note a committed checkpoint, so preemption prefers gangs that lose the least work."""
        with self._transaction() as s:
            s.execute(update(GangRow).where(GangRow.job == job, GangRow.run == run, GangRow.attempt == attempt)
                      .values(last_checkpoint_at=at or datetime.now(UTC)))

    def release(self, job: str, attempt: int | None = None, *, run: str | None = None) -> int:
        """Free a job's devices (one run's attempt, one run, or all runs); returns how many were
        freed. Releasing something not reserved is not an error (teardown tasks run after any
        failure)."""
        with self._transaction() as s:
            query = select(GangRow).where(GangRow.job == job)
            if run is not None:
                query = query.where(GangRow.run == run)
            if attempt is not None:
                query = query.where(GangRow.attempt == attempt)
            gangs = s.scalars(query).all()
            freed = sum(g.gpus for g in gangs)
            _delete_gangs(s, [g.id for g in gangs])
            return freed

    def expire(self, now: datetime | None = None) -> list[tuple[str, int]]:
        """Delete reservations whose lease has run out; returns their (job, attempt)."""
        with self._transaction() as s:
            return self._purge_expired(s, now or datetime.now(UTC))

    @staticmethod
    def _purge_expired(s: Session, now: datetime) -> list[tuple[str, int]]:
        gangs = s.execute(select(GangRow.id, GangRow.job, GangRow.attempt)
                          .where(GangRow.lease_expires_at <= now)).all()
        _delete_gangs(s, [g.id for g in gangs])
        return [(g.job, g.attempt) for g in gangs]

    # --- reads (unexpired only) --------------------------------------------------------------

    def used_by_node(self, now: datetime | None = None) -> dict[str, int]:
        now = now or datetime.now(UTC)
        with self._session() as s:
            rows = s.execute(select(AllocationRow.node, func.sum(AllocationRow.gpus))
                             .where(AllocationRow.lease_expires_at > now)
                             .group_by(AllocationRow.node)).all()
        return {node: int(gpus) for node, gpus in rows}

    def usage_by_team(self, now: datetime | None = None) -> dict[str, int]:
        now = now or datetime.now(UTC)
        with self._session() as s:
            rows = s.execute(select(GangRow.team, func.sum(GangRow.gpus))
                             .where(GangRow.lease_expires_at > now).group_by(GangRow.team)).all()
        return {team: int(gpus) for team, gpus in rows}

    def placement(self, job: str, attempt: int, now: datetime | None = None, *, run: str = ""
                  ) -> Placement | None:
        now = now or datetime.now(UTC)
        with self._session() as s:
            text = s.scalars(select(GangRow.placement).where(
                GangRow.job == job, GangRow.run == run, GangRow.attempt == attempt,
                GangRow.lease_expires_at > now)).first()
        return Placement.model_validate_json(text) if text else None

    def running_gangs(self, now: datetime | None = None) -> list[RunningGang]:
        """Live reservations, as preemption candidates."""
        now = now or datetime.now(UTC)
        with self._session() as s:
            gangs = s.scalars(select(GangRow).where(GangRow.lease_expires_at > now)).all()
            allocs = s.scalars(select(AllocationRow).where(AllocationRow.lease_expires_at > now)).all()
        nodes: dict[int, dict[str, int]] = {}
        for a in allocs:
            nodes.setdefault(a.gang_id, {})[a.node] = a.gpus
        return [RunningGang(job=g.job, run=g.run, attempt=g.attempt, team=g.team, priority=g.priority,
                            gpu_type=g.gpu_type, nodes=nodes.get(g.id, {}), started_at=g.created_at,
                            last_checkpoint_at=g.last_checkpoint_at) for g in gangs]


def _slots_in_use(s: Session, nodes: list[str]) -> dict[str, set[int]]:
    taken: dict[str, set[int]] = {}
    for node, slot in s.execute(select(SlotRow.node, SlotRow.slot).where(SlotRow.node.in_(nodes))):
        taken.setdefault(node, set()).add(slot)
    return taken


def _delete_gangs(s: Session, gang_ids: list[int]) -> None:
    """Children first, so no backend needs ON DELETE CASCADE switched on (SQLite's is off)."""
    if not gang_ids:
        return
    alloc_ids = select(AllocationRow.id).where(AllocationRow.gang_id.in_(gang_ids))
    s.execute(delete(SlotRow).where(SlotRow.allocation_id.in_(alloc_ids)))
    s.execute(delete(AllocationRow).where(AllocationRow.gang_id.in_(gang_ids)))
    s.execute(delete(GangRow).where(GangRow.id.in_(gang_ids)))


def _check_schema(engine: Engine, schema: str | None) -> None:
    """`create_all` adds missing tables, never missing columns: a state database written before
    training runs had ids would fail on every query with an SQL error. Say what to do instead."""
    columns = {c["name"] for c in inspect(engine).get_columns(GangRow.__tablename__, schema=schema)}
    if "run" not in columns:
        raise StateSchemaOutdated(
            f"the platform state at {engine.url!r} predates training-run ids (table "
            f"{GangRow.__tablename__} has no 'run' column). It holds only device leases: stop its "
            "jobs, then drop the trainyard_* tables (or delete the SQLite file) and start again")


@functools.lru_cache(maxsize=8)
def open_state(url: str) -> StateStore:
    """The store for a URL, created on first use (tables included) and shared in the process."""
    return StateStore(url)


def usage_by_team(state_db_url: str, now: datetime | None = None) -> dict[str, int]:
    """Devices held per team by reservations with unexpired leases — for the dry run's quota
    check (`plugins/validation/quota.py`)."""
    return open_state(state_db_url).usage_by_team(now)


def free_devices(store: StateStore, nodes: Mapping[str, int], now: datetime | None = None) -> dict[str, int]:
    """Free devices per node, given each node's capacity."""
    used = store.used_by_node(now)
    return {name: max(capacity - used.get(name, 0), 0) for name, capacity in nodes.items()}
