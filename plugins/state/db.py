"""The platform state database: one way to open it, shared by every store that keeps state.

SQLite file by default (`Settings.state_db`), PostgreSQL by URL. Placement's allocations
(`plugins/state/reservations.py`) and the job lifecycle (`plugins/state/jobs.py`) live in the
same database, in tables prefixed `trainyard_` so they can share it with Airflow or MLflow.
This module is the single home of what both need: the engine (SQLite pragmas, pool options,
an optional schema for tests), one store constructor (`SqlStore`: engine, sessions, tables on
first open, a transaction, a retried write), a timezone-safe timestamp column, and the rule for
which database errors are worth retrying.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from sqlalchemy import DateTime, Engine, MetaData, TypeDecorator, create_engine, event
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from tenacity import Retrying

from trainyard.config.databases import down_message
from trainyard.plugins.errors import DatabaseDown
from trainyard.plugins.files import sqlite_file

TABLE_PREFIX = "trainyard_"

T = TypeVar("T")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in and out; SQLite stores naive values, PostgreSQL timestamptz."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}; pass a timezone-aware UTC time")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def is_retryable(exc: BaseException) -> bool:
    """Unique violations (someone else wrote first), deadlocks, serialisation failures and
    SQLite's busy database: all mean "try again against the new state"."""
    if isinstance(exc, IntegrityError):
        return True
    if isinstance(exc, OperationalError | DBAPIError):
        code = getattr(getattr(exc, "orig", None), "pgcode", None)
        return code in ("40001", "40P01") or "database is locked" in str(exc)
    return False


def retrying(attempts: int = 8) -> Retrying:
    """Retry a transaction on `is_retryable` errors only, with a short random back-off (the
    platform's one retry policy, `trainyard.plugins.retry`)."""
    from trainyard.plugins.retry import policy

    return policy(is_retryable, attempts=attempts, first_wait_s=0.01, max_wait_s=0.5)


def make_engine(url: str, schema: str | None = None) -> Engine:
    """An engine for the state DB; `schema` (PostgreSQL) maps the tables into that schema."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        _sqlite_immediate_transactions(engine)
        if (db := sqlite_file(url)) is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
    else:
        engine = create_engine(url, pool_pre_ping=True)
    if schema:
        engine = engine.execution_options(schema_translate_map={None: schema})
    return engine


def create_tables(metadata: MetaData, engine: Engine) -> None:
    """`create_all`, tolerating the race where another process creates the same tables first
    (two Airflow tasks opening a fresh state database at once). It is the first contact with
    the database: a server that is not running is said in one line, with the fix."""
    try:
        try:
            metadata.create_all(engine)
        except (IntegrityError, DBAPIError):
            metadata.create_all(engine)
    except OperationalError as e:
        message = down_message(engine.url.render_as_string(hide_password=False),
                               "the platform state database", "TRAINYARD_STATE_DB")
        if message is None:
            raise
        raise DatabaseDown(message) from e


class SqlStore:
    """One store over the platform state database: the engine, sessions, its tables created on
    first open, a transaction and a retried write. The reservations and the job state subclass it
    with their own `metadata` (and `check_schema`, where an old database must be refused), so the
    two stores open the database the same way and cannot drift apart."""

    metadata: ClassVar[MetaData]
    """The subclass's tables (its declarative base's `metadata`)."""

    def __init__(self, url: str, *, schema: str | None = None, create: bool = True) -> None:
        self.url = url
        self.engine = make_engine(url, schema)
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        if create:
            create_tables(self.metadata, self.engine)
            self.check_schema(schema)

    def check_schema(self, schema: str | None) -> None:
        """Refuse a database an older Trainyard wrote (`create_all` adds tables, never columns);
        nothing to check by default."""

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        with self._session() as session, session.begin():
            yield session

    def _write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one write transaction, retried on retryable database errors only."""
        for attempt in retrying():
            with attempt:
                return fn(*args, **kwargs)
        raise AssertionError("unreachable")  # pragma: no cover


def _sqlite_immediate_transactions(engine: Engine) -> None:
    """SQLite takes its write lock lazily, so two readers that both decide to write deadlock
    into "database is locked". `BEGIN IMMEDIATE` takes it up front: writers queue instead."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let us emit BEGIN ourselves
        # WAL: readers never wait for the writer, and a commit is one sequential append
        # (synchronous=NORMAL: durable across a process crash, at most the last commits lost
        # on power loss).
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
