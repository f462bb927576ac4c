"""The embedded stack on this machine: start, check, stop (`make up`, `make demo`, the end-to-end
tests) — the embedded PostgreSQL (first up, last down: `cli/postgres_server.py`), Airflow
(`api-server`, `scheduler`, `dag-processor`, `triggerer`), the MLflow UI (`mlflow server` over
the same store the tasks write) and one node agent per local node.

Each component runs as its own process in its own session, with its log in `<TRAINYARD_HOME>/logs/<component>.log` and its pid
in `<TRAINYARD_HOME>/pids/<component>.pid`, so it outlives the command that started it and any
later command (`make down`, a test) can find and stop it. Separate processes rather than
`airflow standalone`, so one part can be restarted alone — the way a deployment loses a
scheduler — while training goes on.

Usage: `python -m cli.stack up|down|status [--port P] [--airflow-only]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cli.postgres_server import EmbeddedPostgres
from config.airflow import DEFAULT_PORT, airflow_env
from plugins.launch import processes

AIRFLOW = ("api-server", "scheduler", "dag-processor", "triggerer")
MLFLOW_PORT = 5000
AGENT_PORT = 9420
"""The first node agent's port (the next node's is one higher)."""
EXPLICIT_DATABASE_URLS = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "TRAINYARD_STATE_DB",
                          "TRAINYARD_MLFLOW_TRACKING_URI")


@dataclass(frozen=True)
class Stack:
    """The embedded Airflow of one Trainyard home."""

    home: Path
    port: int = DEFAULT_PORT
    mlflow_port: int = 0
    """0: no MLflow UI (the tests); `make up` uses `MLFLOW_PORT`."""
    agent_port: int = 0
    """0: no node agents; else the first local node's agent listens here, the next one above."""
    overrides: dict[str, str] = field(default_factory=dict)
    """Environment that wins over the embedded defaults: the production path (PostgreSQL metadata,
    `AIRFLOW__CORE__EXECUTOR=CeleryExecutor` with its broker) is the same stack with these."""
    durable_db: bool = True
    """False: the embedded PostgreSQL skips fsync (a test's throwaway stack)."""

    @property
    def postgres(self) -> EmbeddedPostgres | None:
        """The home's embedded PostgreSQL, unless every database URL is set explicitly
        (`TRAINYARD_STATE_DB`, `TRAINYARD_MLFLOW_TRACKING_URI`, `AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`:
        SQLite files or an external server)."""
        env = {**os.environ, **self.overrides}
        if all(env.get(k) for k in EXPLICIT_DATABASE_URLS):
            return None
        return EmbeddedPostgres(self.home, durable=self.durable_db)

    @property
    def celery(self) -> bool:
        return self.overrides.get("AIRFLOW__CORE__EXECUTOR") == "CeleryExecutor"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def components(self) -> tuple[str, ...]:
        agents = tuple(f"node-agent-{node}" for node in self.agents()) if self.agent_port else ()
        workers = ("celery-worker",) if self.celery else ()
        return AIRFLOW + workers + (("mlflow",) if self.mlflow_port else ()) + agents

    def agents(self) -> dict[str, str]:
        """Local node → its agent's URL (empty without agents)."""
        if not self.agent_port:
            return {}
        from config.cluster import load_cluster

        nodes = [n.name for n in load_cluster("local").nodes]
        return {node: f"http://127.0.0.1:{self.agent_port + i}" for i, node in enumerate(nodes)}

    def env(self) -> dict[str, str]:
        env = airflow_env(self.home, port=self.port, base={**os.environ, **self.overrides})
        if self.agent_port:  # the health watch of every job's DAG polls them
            env.setdefault("TRAINYARD_NODE_AGENTS", json.dumps(self.agents()))
        env["TRAINYARD_AIRFLOW_URL"] = self.url
        if self.mlflow_port:
            env.setdefault("TRAINYARD_MLFLOW_UI_URL", self.mlflow_url)
        return env

    def _command(self, component: str) -> list[str]:
        if component == "celery-worker":
            return [sys.executable, "-m", "airflow", "celery", "worker", "--concurrency", "8"]
        if component in AIRFLOW:
            args = [sys.executable, "-m", "airflow", component]
            return args + (["--port", str(self.port), "--host", "127.0.0.1"] if component == "api-server" else [])
        if component == "mlflow":
            from config.settings import Settings

            store = Settings(home=self.home).mlflow_tracking_uri
            return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store,
                    "--default-artifact-root", (self.home / "mlartifacts").as_uri(),
                    "--host", "127.0.0.1", "--port", str(self.mlflow_port), "--workers", "1",
                    "--allowed-hosts", f"127.0.0.1:{self.mlflow_port},localhost:{self.mlflow_port}"]
        node = component.removeprefix("node-agent-")
        url = self.agents()[node]
        return [sys.executable, "-m", "node_agent", "--node", node, "--host", "127.0.0.1",
                "--port", url.rsplit(":", 1)[1], "--heartbeat-dir", str(self.home / "runs")]

    def _pid_file(self, component: str) -> Path:
        return self.home / "pids" / f"{component}.pid"

    def log_file(self, component: str) -> Path:
        return self.home / "logs" / f"{component}.log"

    def migrate(self) -> None:
        """Create or upgrade the metadata database and a SQLite MLflow store (idempotent)."""
        self.log_file("db-migrate").parent.mkdir(parents=True, exist_ok=True)
        with self.log_file("db-migrate").open("ab") as log:
            subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=self.env(), check=True,
                           stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=600)
        # the MLflow store too, before the server and the first tasks open it side by side
        from config.settings import Settings
        from plugins.tracking.runs import client_for

        client_for(Settings(home=self.home).mlflow_tracking_uri)

    def pid(self, component: str) -> int | None:
        try:
            pid = int(self._pid_file(component).read_text())
        except (OSError, ValueError):
            return None
        return pid if processes.is_alive(pid) else None

    def start(self, component: str) -> int:
        """Start one component unless it runs already; returns its pid."""
        if component not in self.components:
            raise ValueError(f"unknown component {component!r}; one of {self.components}")
        running = self.pid(component)
        if running is not None:
            return running
        for folder in (self._pid_file(component).parent, self.log_file(component).parent):
            folder.mkdir(parents=True, exist_ok=True)
        args = self._command(component)
        (self.home / "runs").mkdir(parents=True, exist_ok=True)
        with self.log_file(component).open("ab") as log:
            proc = subprocess.Popen(args, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.home)
        self._pid_file(component).write_text(str(proc.pid))
        return proc.pid

    def stop(self, component: str, *, grace_s: float = 20.0) -> None:
        """SIGTERM the component's process group, SIGKILL what is left after `grace_s`."""
        self.stop_all([component], grace_s=grace_s)

    def stop_all(self, components: list[str], *, grace_s: float = 20.0) -> None:
        """SIGTERM every named component's process group at once, then SIGKILL what is left after
        one shared `grace_s` — the parts shut down side by side, not one grace period each."""
        groups: dict[str, int] = {}
        for component in components:
            pid = self.pid(component)
            if pid is None:
                self._pid_file(component).unlink(missing_ok=True)
                continue
            groups[component] = pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_group_alive(pid) for pid in groups.values()):
            time.sleep(0.2)
        for pid in groups.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        # SIGKILL is delivered asynchronously: wait until the groups are gone (briefly: nothing
        # can refuse it), so a part started again right after never meets its old self.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_group_alive(pid) for pid in groups.values()):
            time.sleep(0.05)
        for component, pid in groups.items():
            processes.reap(pid)
            self._pid_file(component).unlink(missing_ok=True)

    def up(self, *, timeout_s: float = 180.0) -> None:
        if self.postgres is not None:  # first: every other part keeps its state there
            self.postgres.start()
            self.postgres.ensure_databases()
            from config.settings import get_settings

            get_settings.cache_clear()  # this process's settings now name the home's server
        self.migrate()
        for component in self.components:
            self.start(component)
        self.wait_healthy(timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        for url in [*([self.mlflow_url + "/health"] if self.mlflow_port else []),
                    *(u + "/livez" for u in self.agents().values())]:
            _wait_http(url, deadline)

    def down(self) -> None:
        self.stop_all(list(reversed(self.components)))
        if self.postgres is not None:  # last: the parts above close their sessions first
            self.postgres.stop()

    def health(self) -> dict[str, str]:
        """Each part's status as the API server reports it (`/api/v2/monitor/health`)."""
        with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as response:
            data = json.load(response)
        return {part: str(info.get("status")) for part, info in data.items() if isinstance(info, dict)}

    def wait_healthy(self, *, timeout_s: float = 180.0, parts: tuple[str, ...] = (
            "metadatabase", "scheduler", "triggerer", "dag_processor")) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        last: dict[str, str] | str = "no answer yet"
        while time.monotonic() < deadline:
            try:
                last = self.health()
                if all(last.get(p) == "healthy" for p in parts):
                    return last
            except (OSError, urllib.error.URLError, ValueError) as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(1.0)
        raise TimeoutError(f"Airflow at {self.url} not healthy after {timeout_s:g}s: {last}; "
                           f"logs under {self.home / 'logs'}")


def _wait_http(url: str, deadline: float) -> None:
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError) as e:
            last = str(e)
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer: {last}")


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. Zombies do not count: `killpg(pgid, 0)` also
    answers for a leader nobody has reaped and for orphans no init collects, and `stop` waited
    out its whole grace for parts that had exited at once."""
    processes.reap(pgid)
    return bool(processes.group_members([pgid]))


def default_stack(home: Path, *, port: int = DEFAULT_PORT, airflow_only: bool = False) -> Stack:
    """The stack `make up` and `make demo` run: Airflow, the MLflow UI, the node agents."""
    if airflow_only:
        return Stack(home, port=port)
    return Stack(home, port=port, mlflow_port=int(os.environ.get("TRAINYARD_MLFLOW_PORT", MLFLOW_PORT)),
                 agent_port=int(os.environ.get("TRAINYARD_AGENT_PORT", AGENT_PORT)))


def main(argv: list[str] | None = None) -> int:
    from config.settings import get_settings

    p = argparse.ArgumentParser(prog="python -m cli.stack", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--port", type=int, default=int(os.environ.get("TRAINYARD_AIRFLOW_PORT", DEFAULT_PORT)),
                   help="Airflow's API server port (default 8080)")
    p.add_argument("--airflow-only", action="store_true", help="no MLflow UI, no node agents")
    args = p.parse_args(argv)
    stack = default_stack(get_settings().home, port=args.port, airflow_only=args.airflow_only)
    if args.action == "up":
        stack.up()
        print(f"Airflow   {stack.url}  (no login: local-only simple auth)")
        if stack.mlflow_port:
            print(f"MLflow    {stack.mlflow_url}")
        for node, url in stack.agents().items():
            print(f"agent     {url}  ({node})")
        print(f"logs in {stack.home / 'logs'}; stop with `make down`")
    elif args.action == "down":
        stack.down()
        print("stopped")
    else:
        for component in stack.components:
            print(f"{component:14} {'running, pid ' + str(stack.pid(component)) if stack.pid(component) else 'stopped'}")
        if stack.postgres is not None:
            pid = stack.postgres.pid()
            print(f"{'postgres':14} {f'running, pid {pid}' if pid else 'stopped'} ({stack.postgres.socket_dir})")
        with contextlib.suppress(OSError, ValueError):
            print(json.dumps(stack.health()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
