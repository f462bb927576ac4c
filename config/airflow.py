"""The embedded Airflow's settings, in one place (DESIGN §3, §9).

`make airflow`, `make demo`, `trainyard submit` and the end-to-end tests all run Airflow with
the environment `airflow_env()` returns, so they agree on where its state lives
(`<TRAINYARD_HOME>/airflow`), which folders it reads, and how its parts reach each other:

- the DAGs folder `<airflow home>/dags` holds the one DAG file any deployment adds
  (`trainyard.dags.DAG_FILE`, written by `write_dag_file`), and the plugins folder is empty: the
  operators, the triggers and the Trainyard view come from the installed provider, exactly as
  in someone else's Airflow (the README's "Adding Trainyard to an Airflow");

- metadata in the home's embedded PostgreSQL (`trainyard.config.databases`; SQLite in a home without
  one) with the LocalExecutor — production uses its own PostgreSQL and Celery, and
  `AIRFLOW__*` variables set by the caller win over these;
- examples off, new DAGs unpaused, the DAG folder re-listed every few seconds (the default
  300 s hides a new spec for five minutes);
- the API server on 127.0.0.1 only, with the simple auth manager letting every local user act
  as admin, so the UI and the REST API need no login — never for a shared machine;
- `execution_api_server_url` pointing at that API server (without it every task fails with
  "Connection refused" on any port but 8080);
- one JWT secret, `secret_key` and Fernet key shared by every component, generated once per home
  into a file readable only by its owner (the parts of a multi-process Airflow 3 must share them
  or tasks fail with "Invalid auth token"); never printed.

Pure standard library: the Makefile and the tests call it before anything heavy is imported.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

from trainyard.config.databases import default_url

DEFAULT_PORT = 8080

DAG_FILE = '''\
"""Airflow DAG file: Trainyard's DAGs, one per TrainingJob spec in $TRAINYARD_JOBS_DIR."""
from trainyard.dags import dags
globals().update(dags())
'''
"""The DAG file a deployment drops into its DAGs folder (three lines; the docstring's words
'Airflow' and 'DAG' make Airflow's safe-mode scan parse it)."""

DAG_FILE_NAME = "trainyard_dags.py"
"""Its name in the embedded stack's DAGs folder (and the README's)."""

INVALID_SPEC_TAG = "trainyard:invalid-spec"
"""The tag of the DAG an invalid spec becomes (`trainyard.dags.invalid_specs`): `trainyard submit`
reads it over the REST API."""

# How long a connection to the embedded SQLite metadata waits for another process's write before
# failing with "database is locked" (Python's default is 5 s). The scheduler, the API server, the
# DAG processor, the triggerer and every task write to one file; on a loaded two-core machine a
# trigger arriving while the scheduler commits a DAG run waited longer than 5 s and the API
# answered HTTP 500. Airflow imports these by name (`[database] sql_alchemy_connect_args`).
SQLITE_CONNECT_ARGS: dict[str, object] = {"timeout": 60}
SQLITE_CONNECT_ARGS_ASYNC: dict[str, object] = {"timeout": 60}


def airflow_home(trainyard_home: Path) -> Path:
    return trainyard_home / "airflow"


def write_dag_file(home: Path) -> Path:
    """The DAGs folder of the embedded Airflow, with the one Trainyard DAG file (rewritten only
    when its text changed: a new mtime makes the DAG processor parse it again)."""
    folder = home / "dags"
    folder.mkdir(parents=True, exist_ok=True)
    (home / "plugins").mkdir(exist_ok=True)
    path = folder / DAG_FILE_NAME
    if not path.is_file() or path.read_text() != DAG_FILE:
        path.write_text(DAG_FILE)
    return path


def new_secrets() -> dict[str, str]:
    """What every component of one Airflow must share: the JWT secret (task tokens), the API
    server's secret key (sessions) and the Fernet key (connections and variables at rest)."""
    return {
        "jwt_secret": secrets.token_urlsafe(32),
        "secret_key": secrets.token_urlsafe(32),
        "fernet_key": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
    }


def shared_config(values: dict[str, str]) -> str:
    """An `airflow.cfg` holding only the shared secrets; everything else comes from `AIRFLOW__*`
    variables. The compose stack's init service writes it once into a volume every component
    mounts (`python -m trainyard.config.airflow > airflow.cfg`)."""
    return (f"[api]\nsecret_key = {values['secret_key']}\n\n"
            f"[api_auth]\njwt_secret = {values['jwt_secret']}\n\n"
            f"[core]\nfernet_key = {values['fernet_key']}\n")


def _secrets(home: Path) -> dict[str, str]:
    """The shared secrets of this embedded Airflow, made on first use (mode 0600)."""
    path = home / "secrets.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    home.mkdir(parents=True, exist_ok=True)
    values = new_secrets()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(values, f)
    os.replace(tmp, path)
    return values


def airflow_env(trainyard_home: Path, *, port: int = DEFAULT_PORT,
                base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The full environment of an embedded Airflow component (and of `airflow` CLI calls).

    `base` (default: this process's environment) is kept; `AIRFLOW__*` names it already sets win,
    so the production configuration (PostgreSQL, Celery) is the same code with other variables.
    """
    env = dict(os.environ if base is None else base)
    home = airflow_home(trainyard_home.resolve())
    shared = _secrets(home)
    venv_bin = str(Path(sys.executable).parent)
    defaults = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(write_dag_file(home).parent),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "16",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__FERNET_KEY": shared["fernet_key"],
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": default_url(trainyard_home, "airflow"),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": shared["secret_key"],
        "AIRFLOW__API_AUTH__JWT_SECRET": shared["jwt_secret"],
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        # Airflow's default: each parse of the job DAGs' files validates every spec; at 10 s the
        # DAG processor took 179 of the test suite's ~2,800 CPU-s (BSD process accounting). A new
        # spec is parsed on request (`trainyard submit`: `AirflowClient.request_parse`).
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
        # The task supervisor's longest wait between two looks at its task process (default 5 s).
        # When a task's sockets close before its exit is seen, the supervisor has nothing left
        # to wait on and sleeps that long before it reports the end: `attempt_failed` (the task
        # that turns a handed-over attempt red) ended 5.2 s after its code did, 0.25 s at 1 s
        # (the same e2e test, the task instances' end dates). The cost: a running task
        # heartbeats up to once a second (the training watchers are deferred, not running).
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # The scheduler's and the triggerer's log servers (8793/8794 by default) next to the API
        # port, so two embedded stacks (a test beside `make airflow`) never collide.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(port + 1),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(port + 2),
    }
    for key, value in defaults.items():
        env.setdefault(key, value)
    if env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite"):
        env.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS", "trainyard.config.airflow.SQLITE_CONNECT_ARGS")
        env.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC",
                       "trainyard.config.airflow.SQLITE_CONNECT_ARGS_ASYNC")
    env["AIRFLOW_HOME"] = defaults["AIRFLOW_HOME"]
    env["TRAINYARD_HOME"] = str(trainyard_home.resolve())
    # Airflow starts its parts as `airflow …` from PATH: this venv's first.
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    env.setdefault("TRAINYARD_DEMO_DAGS", "true")  # the demo's data DAG beside the jobs'
    return env


if __name__ == "__main__":
    sys.stdout.write(shared_config(new_secrets()))
