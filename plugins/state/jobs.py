"""The job state in the platform state database: each training run's lifecycle, every attempt's
cause and timings, and the nodes taken out of service (cordons).

Same database as placement's allocations (`Settings.state_db`; SQLite by default, PostgreSQL by
URL; `plugins/state/db.py` opens it). Three tables, prefixed `trainyard_`:

- `trainyard_runs`        one row per (job, run): team, project, lifecycle state, the trigger
                          key that opened it (UNIQUE per job: a retried trigger gets the same
                          run), the MLflow run id, timestamps, the final reason.
- `trainyard_attempts`    one row per (job, run, attempt): the DAG run, state (`running` /
                          `ended`), timings, outcome and reason (the `FailureReport`, kept whole
                          as JSON), the action and its reason, torchrun's in-place restarts, and
                          the launcher's `RunHandle` JSON (so `trainyard stop` finds the processes).
- `trainyard_node_cordons` one row per node taken out of service, with the reason and since
                          when (issue 13: a node that lost a GPU is not placed on again until
                          `trainyard nodes uncordon`).

The lifecycle (seed §7) is checked on every change (`ALLOWED`); an illegal change raises
`IllegalTransition` naming both states. Repeating the current state is a no-op, so a retried
Airflow task can write its state again. Writes retry only on retryable database errors
(`trainyard.plugins.state.db.is_retryable`).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Integer, String, Text, UniqueConstraint, delete, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from trainyard.config.runs import check_run_id, new_run_id
from trainyard.plugins.errors import FatalError
from trainyard.plugins.recovery.model import (
    FINAL_LIFECYCLE_STATES,
    AttemptRecord,
    FailureReport,
    LifecycleState,
    RecoveryAction,
)
from trainyard.plugins.run.model import RunHandle
from trainyard.plugins.state.db import TABLE_PREFIX, SqlStore, UTCDateTime

ALLOWED: dict[str, frozenset[str]] = {
    "pending": frozenset({"scheduling", "failed", "cancelled"}),
    "scheduling": frozenset({"starting", "pending", "failed", "cancelled"}),
    "starting": frozenset({"running", "recovering", "completed", "failed", "cancelled"}),
    "running": frozenset({"recovering", "completed", "failed", "cancelled"}),
    "recovering": frozenset({"pending", "scheduling", "starting", "failed", "cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}
"""Lifecycle state → the states it may move to. `scheduling → pending` and `recovering →
pending`: waiting for capacity (a requeue after preemption). `starting → completed`: a job
so short it ended before anyone saw it run."""

AttemptState = Literal["running", "ended"]

FINAL_BY_ACTION: dict[str, str] = {"finish": "completed", "cancel": "cancelled", "give_up": "failed"}
"""The run's final state an action implies at once. `register` is absent: the run is over only
when the registration is (`plugins/attempt/steps.register` ends it completed or failed), so no
surface says "completed" of a run whose model then fails to register."""


class IllegalTransition(FatalError):
    """A lifecycle change the lifecycle does not allow (a bug in the caller, not the world)."""

    def __init__(self, job: str, run: str, current: str, requested: str) -> None:
        allowed = ", ".join(sorted(ALLOWED.get(current, ()))) or "nothing (final)"
        super().__init__(f"run {run} of {job} cannot go from {current!r} to {requested!r} "
                         f"(from {current!r} it may go to: {allowed})")
        self.current, self.requested = current, requested


class RunNotFound(FatalError):
    """No such run (or the job has no run at all)."""


class _Base(DeclarativeBase):
    pass


class RunRow(_Base):
    __tablename__ = f"{TABLE_PREFIX}runs"
    __table_args__ = (UniqueConstraint("job", "run", name=f"{TABLE_PREFIX}runs_job_run"),
                      UniqueConstraint("job", "trigger_key", name=f"{TABLE_PREFIX}runs_job_trigger"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    run: Mapped[str] = mapped_column(String(64))
    team: Mapped[str] = mapped_column(String(128), default="")
    project: Mapped[str] = mapped_column(String(128), default="")
    state: Mapped[str] = mapped_column(String(16))
    trigger_key: Mapped[str] = mapped_column(String(256))
    mlflow_run_id: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    final_reason: Mapped[str] = mapped_column(Text, default="")


class AttemptRow(_Base):
    __tablename__ = f"{TABLE_PREFIX}attempts"
    __table_args__ = (UniqueConstraint("job", "run", "attempt", name=f"{TABLE_PREFIX}attempts_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    run: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer)
    dag_run_id: Mapped[str] = mapped_column(String(256), default="")
    state: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    outcome: Mapped[str] = mapped_column(String(32), default="")
    reason: Mapped[str] = mapped_column(Text, default="")
    action: Mapped[str] = mapped_column(String(32), default="")
    action_reason: Mapped[str] = mapped_column(Text, default="")
    restarts_in_place: Mapped[int] = mapped_column(Integer, default=0)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    report: Mapped[str] = mapped_column(Text, default="")
    """The whole `FailureReport` JSON (evidence lines included)."""
    handle: Mapped[str] = mapped_column(Text, default="")
    """The launcher's `RunHandle` JSON."""


class LayoutRow(_Base):
    """Where an attempt ran and how it was split: its `Plan` and `Placement` JSON, kept after the
    reservation is released (the Trainyard view and `status` show them for finished runs too).
    A table of its own, so a state database made before it gets it without a migration."""

    __tablename__ = f"{TABLE_PREFIX}attempt_layouts"
    __table_args__ = (UniqueConstraint("job", "run", "attempt", name=f"{TABLE_PREFIX}attempt_layouts_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    run: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer)
    plan: Mapped[str] = mapped_column(Text, default="")
    placement: Mapped[str] = mapped_column(Text, default="")


class CordonRow(_Base):
    __tablename__ = f"{TABLE_PREFIX}node_cordons"

    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    by: Mapped[str] = mapped_column(String(256), default="")
    since: Mapped[datetime] = mapped_column(UTCDateTime())


class _View(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)


class RunInfo(_View):
    job: str
    run: str
    team: str
    project: str
    state: LifecycleState
    trigger_key: str
    mlflow_run_id: str
    created_at: datetime
    updated_at: datetime
    final_reason: str
    attempts: int = 0
    last_cause: str = ""
    """The outcome of the newest ended attempt that failed ('' if none did)."""

    @property
    def final(self) -> bool:
        return self.state in FINAL_LIFECYCLE_STATES


class AttemptInfo(_View):
    job: str
    run: str
    attempt: int
    dag_run_id: str
    state: AttemptState
    started_at: datetime
    ended_at: datetime | None
    outcome: str
    reason: str
    action: str
    action_reason: str
    restarts_in_place: int
    step: int | None
    report: str
    handle: str

    @property
    def run_handle(self) -> RunHandle | None:
        return RunHandle.model_validate_json(self.handle) if self.handle else None

    @property
    def failure_report(self) -> FailureReport | None:
        return FailureReport.model_validate_json(self.report) if self.report else None

    @property
    def duration_s(self) -> float | None:
        return (self.ended_at - self.started_at).total_seconds() if self.ended_at else None

    def record(self) -> AttemptRecord | None:
        """The history line (`AttemptConf.history`) of an ended attempt."""
        report = self.failure_report
        if report is None:
            return None
        action = RecoveryAction(kind=self.action, reason=self.action_reason) if self.action else None  # type: ignore[arg-type]
        return AttemptRecord.of(report, action)


class Cordon(_View):
    node: str
    reason: str
    by: str
    since: datetime


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(UTC)


class JobStateStore(SqlStore):
    """The job state; one per database URL (see `open_job_state`)."""

    metadata = _Base.metadata

    # --- runs ----------------------------------------------------------------------------------

    def open_run(self, job: str, *, trigger_key: str, team: str = "", project: str = "", run: str = "",
                 mlflow_run_id: str = "", now: datetime | None = None) -> RunInfo:
        """The run of `job` opened by `trigger_key` — created (state `pending`) the first time,
        returned as it is every later time: a retried task gets the same run."""
        if not trigger_key:
            raise ValueError("open_run needs a trigger_key (the Airflow DAG run id, a submit id, …)")
        run = check_run_id(run) if run else ""
        return self._write(self._open_run, job, trigger_key, team, project, run, mlflow_run_id, _now(now))

    def _open_run(self, job: str, key: str, team: str, project: str, run: str, mlflow: str,
                  now: datetime) -> RunInfo:
        with self._transaction() as s:
            row = s.scalars(select(RunRow).where(RunRow.job == job, RunRow.trigger_key == key)).first()
            if row is None:
                row = RunRow(job=job, run=run or new_run_id(now), team=team, project=project, state="pending",
                             trigger_key=key, mlflow_run_id=mlflow, created_at=now, updated_at=now,
                             final_reason="")
                s.add(row)
                s.flush()
            return self._info(s, row)

    def get_run(self, job: str, run: str = "") -> RunInfo:
        """A run of `job`, or its newest run when `run` is empty. Raises `RunNotFound`."""
        with self._transaction() as s:
            return self._info(s, self._run_row(s, job, run))

    def list_runs(self, job: str = "", *, limit: int = 50, team: str = "", state: str = "") -> list[RunInfo]:
        """Runs, newest first (of one job, or of all; of one team; in one lifecycle state)."""
        with self._transaction() as s:
            query = select(RunRow).order_by(RunRow.created_at.desc(), RunRow.id.desc()).limit(limit)
            if job:
                query = query.where(RunRow.job == job)
            if team:
                query = query.where(RunRow.team == team)
            if state:
                query = query.where(RunRow.state == state)
            return [self._info(s, row) for row in s.scalars(query)]

    def transition(self, job: str, run: str, state: LifecycleState, *, reason: str = "",
                   now: datetime | None = None) -> RunInfo:
        """Move the run to `state` (checked against `ALLOWED`; the same state again is a no-op).
        `reason` is kept as the final reason when `state` is final."""
        return self._write(self._transition, job, run, state, reason, _now(now))

    def _transition(self, job: str, run: str, state: str, reason: str, now: datetime) -> RunInfo:
        if state not in ALLOWED:
            raise ValueError(f"unknown lifecycle state {state!r}; one of {sorted(ALLOWED)}")
        with self._transaction() as s:
            row = self._run_row(s, job, run)
            if row.state != state:
                if state not in ALLOWED[row.state]:
                    raise IllegalTransition(job, row.run, row.state, state)
                row.state, row.updated_at = state, now
                if state in FINAL_LIFECYCLE_STATES:
                    row.final_reason = reason
            return self._info(s, row)

    def set_mlflow_run(self, job: str, run: str, mlflow_run_id: str) -> None:
        def write() -> None:
            with self._transaction() as s:
                self._run_row(s, job, run).mlflow_run_id = mlflow_run_id
        self._write(write)

    # --- attempts ------------------------------------------------------------------------------

    def start_attempt(self, job: str, run: str, attempt: int, *, dag_run_id: str = "",
                      handle: RunHandle | None = None, now: datetime | None = None) -> AttemptInfo:
        """Record that `attempt` started (idempotent: a second call returns the first row,
        filling in a handle it did not have)."""
        return self._write(self._start_attempt, job, run, attempt, dag_run_id, handle, _now(now))

    def _start_attempt(self, job: str, run: str, attempt: int, dag_run_id: str, handle: RunHandle | None,
                       now: datetime) -> AttemptInfo:
        with self._transaction() as s:
            self._run_row(s, job, run)
            row = self._attempt_row(s, job, run, attempt, missing_ok=True)
            if row is None:
                row = AttemptRow(job=job, run=run, attempt=attempt, dag_run_id=dag_run_id, state="running",
                                 started_at=now, handle=handle.model_dump_json() if handle else "")
                s.add(row)
                s.flush()
            elif handle is not None and not row.handle:
                row.handle = handle.model_dump_json()
            return AttemptInfo.model_validate(row)

    def set_handle(self, job: str, run: str, attempt: int, handle: RunHandle) -> None:
        """Persist the launcher's handle the moment the launch returns."""
        def write() -> None:
            with self._transaction() as s:
                self._attempt_row(s, job, run, attempt).handle = handle.model_dump_json()
        self._write(write)

    def end_attempt(self, report: FailureReport, action: RecoveryAction | None = None, *,
                    now: datetime | None = None) -> AttemptInfo:
        """Record how the attempt `report` describes ended, and the action decided after it."""
        return self._write(self._end_attempt, report, action, _now(now))

    def _end_attempt(self, report: FailureReport, action: RecoveryAction | None, now: datetime) -> AttemptInfo:
        with self._transaction() as s:
            row = self._attempt_row(s, report.job, report.run, report.attempt)
            row.state, row.ended_at = "ended", report.ended_at or now
            row.outcome, row.reason, row.step = report.outcome, report.reason, report.step
            row.restarts_in_place, row.report = report.restarts_in_place, report.model_dump_json()
            if action is not None:
                row.action, row.action_reason = action.kind, action.reason
            return AttemptInfo.model_validate(row)

    def set_resumed(self, job: str, run: str, attempt: int, at: datetime) -> float | None:
        """The next attempt's gang started at `at`: written into `attempt`'s report
        (`FailureReport.resumed_at`, the first time only); its time to resume in seconds, or
        None when that attempt has no report."""
        def write() -> float | None:
            with self._transaction() as s:
                row = self._attempt_row(s, job, run, attempt, missing_ok=True)
                if row is None or not row.report:
                    return None
                report = FailureReport.model_validate_json(row.report)
                if report.resumed_at is None:
                    report = report.model_copy(update={"resumed_at": at})
                    row.report = report.model_dump_json()
                return report.time_to_resume_s
        return self._write(write)

    def finish_attempt(self, report: FailureReport, action: RecoveryAction, *,
                       now: datetime | None = None) -> RunInfo:
        """`end_attempt`, then the run's lifecycle change the action implies: `finish` →
        completed, `cancel` → cancelled, `give_up` → failed (the action's reason is the final
        reason), `register` → none yet (the registration ends the run), any retrying action →
        recovering. A run already cancelled (`trainyard stop`) refuses `recovering`:
        `IllegalTransition`, so nothing restarts what a user stopped."""
        self.end_attempt(report, action, now=now)
        if action.kind == "register":
            return self.get_run(report.job, report.run)
        target = FINAL_BY_ACTION.get(action.kind, "recovering")
        reason = action.reason if action.kind != "cancel" else report.reason
        return self.transition(report.job, report.run, target, reason=reason, now=now)  # type: ignore[arg-type]

    def attempts(self, job: str, run: str) -> list[AttemptInfo]:
        """Every attempt of a run, oldest first."""
        with self._transaction() as s:
            rows = s.scalars(select(AttemptRow).where(AttemptRow.job == job, AttemptRow.run == run)
                             .order_by(AttemptRow.attempt))
            return [AttemptInfo.model_validate(r) for r in rows]

    def live_attempt(self, job: str, run: str) -> AttemptInfo | None:
        """The newest attempt that has not ended, if any."""
        running = [a for a in self.attempts(job, run) if a.state == "running"]
        return running[-1] if running else None

    # --- nodes ---------------------------------------------------------------------------------

    def cordon(self, node: str, reason: str, *, by: str = "", now: datetime | None = None) -> Cordon:
        """Take `node` out of service (idempotent: the first reason and time stay)."""
        if not node:
            raise ValueError("cordon needs a node name")
        return self._write(self._cordon, node, reason, by, _now(now))

    def _cordon(self, node: str, reason: str, by: str, now: datetime) -> Cordon:
        with self._transaction() as s:
            row = s.get(CordonRow, node)
            if row is None:
                row = CordonRow(node=node, reason=reason, by=by, since=now)
                s.add(row)
                s.flush()
            return Cordon.model_validate(row)

    def uncordon(self, node: str) -> bool:
        """Put `node` back in service; False when it was not cordoned."""
        def write() -> bool:
            with self._transaction() as s:
                return bool(s.execute(delete(CordonRow).where(CordonRow.node == node)).rowcount)
        return self._write(write)

    def set_layout(self, job: str, run: str, attempt: int, *, plan: str, placement: str) -> None:
        """Record the attempt's plan and placement (JSON); idempotent, the last write wins."""
        def write() -> None:
            with self._transaction() as s:
                row = s.scalars(select(LayoutRow).where(LayoutRow.job == job, LayoutRow.run == run,
                                                        LayoutRow.attempt == attempt)).first()
                if row is None:
                    s.add(LayoutRow(job=job, run=run, attempt=attempt, plan=plan, placement=placement))
                else:
                    row.plan, row.placement = plan, placement
        self._write(write)

    def layouts(self, job: str, run: str) -> dict[int, tuple[str, str]]:
        """Attempt → (plan JSON, placement JSON), for the attempts that launched."""
        with self._transaction() as s:
            rows = s.scalars(select(LayoutRow).where(LayoutRow.job == job, LayoutRow.run == run))
            return {r.attempt: (r.plan, r.placement) for r in rows}

    def cordoned(self) -> dict[str, Cordon]:
        """Node → its cordon, for placement to exclude."""
        with self._transaction() as s:
            return {r.node: Cordon.model_validate(r) for r in s.scalars(select(CordonRow).order_by(CordonRow.node))}

    # --- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _run_row(s: Session, job: str, run: str) -> RunRow:
        query = select(RunRow).where(RunRow.job == job)
        query = query.where(RunRow.run == run) if run else query.order_by(RunRow.created_at.desc(), RunRow.id.desc())
        row = s.scalars(query.limit(1)).first()
        if row is None:
            what = f"no run {run!r} of job {job!r}" if run else f"job {job!r} has no run"
            raise RunNotFound(f"{what} in the platform state (`trainyard jobs` lists the runs)")
        return row

    @staticmethod
    def _attempt_row(s: Session, job: str, run: str, attempt: int, *, missing_ok: bool = False) -> AttemptRow:
        row = s.scalars(select(AttemptRow).where(AttemptRow.job == job, AttemptRow.run == run,
                                                 AttemptRow.attempt == attempt)).first()
        if row is None and not missing_ok:
            raise RunNotFound(f"no attempt {attempt} of run {run!r} of job {job!r} in the platform state")
        return row  # type: ignore[return-value]

    @staticmethod
    def _info(s: Session, row: RunRow) -> RunInfo:
        attempts = s.scalars(select(AttemptRow).where(AttemptRow.job == row.job, AttemptRow.run == row.run)
                             .order_by(AttemptRow.attempt)).all()
        causes = [a.outcome for a in attempts if a.outcome and a.outcome not in ("completed", "cancelled")]
        return RunInfo.model_validate(row).model_copy(
            update={"attempts": len(attempts), "last_cause": causes[-1] if causes else ""})


@functools.lru_cache(maxsize=8)
def open_job_state(url: str) -> JobStateStore:
    """The store for a URL, created on first use (tables included) and shared in the process."""
    return JobStateStore(url)


def airflow_dag_run_id(dag_id: str, recorded: str) -> str:
    """The DAG run id of an attempt as Airflow knows it: the attempt row records
    `<dag_id>/<dag_run_id>` (the trigger key's form); '' for an attempt that no DAG run
    started (`cli/<run>`: `trainyard launch`)."""
    prefix = f"{dag_id}/"
    return recorded[len(prefix):] if recorded.startswith(prefix) else ""
