"""The embedded stack on this machine: start, check, stop (`make up`, `make demo`, the end-to-end
tests) — the embedded PostgreSQL (first up, last down: `cli/postgres_server.py`), Airflow
(`api-server`, `scheduler`, `dag-processor`, `triggerer`), the MLflow UI (`mlflow server` over
the same store the tasks write) and one node agent per local node.

Each component runs as its own process in its own session, with its log in `<TRAINYARD_HOME>/logs/<component>.log` and its pid
in `<TRAINYARD_HOME>/pids/<component>.pid`, so it outlives the command that started it and any
later command (`make down`, a test) can find and stop it. Separate processes rather than
`airflow standalone`, so one part can be restarted alone — the way a deployment loses a
scheduler — while training goes on.

Usage: `python -m trainyard.cli.stack up|down|status [--port P] [--airflow-only]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.cli.postgres_server import EmbeddedPostgres
from trainyard.config.airflow import DEFAULT_PORT, airflow_env
from trainyard.plugins.launch import rank_zygote
from trainyard.plugins.run import processes

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
    mlflow_hosts: tuple[str, ...] = ()
    """More `host:port`s the MLflow server answers to, besides 127.0.0.1 and localhost (its
    host-header check refuses others): where clients reach it by another name (a test's
    simulated pods, through a relay)."""

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
        from trainyard.config.cluster import load_cluster

        nodes = [n.name for n in load_cluster("local").nodes]
        return {node: f"http://127.0.0.1:{self.agent_port + i}" for i, node in enumerate(nodes)}

    def env(self) -> dict[str, str]:
        env = airflow_env(self.home, port=self.port, base={**os.environ, **self.overrides})
        if self.agent_port:  # the health watch of every job's DAG polls them
            env.setdefault("TRAINYARD_NODE_AGENTS", json.dumps(self.agents()))
        env["TRAINYARD_AIRFLOW_URL"] = self.url
        if self.mlflow_port:
            env.setdefault("TRAINYARD_MLFLOW_UI_URL", self.mlflow_url)
        # `mlflow server`'s job runner (huey consumer pools, each importing MLflow) serves GenAI
        # jobs nothing here submits: ~17 CPU-s of its first minute (process accounting, 28 vs 11)
        env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
        return env

    def _command(self, component: str) -> list[str]:
        # The parts that fork tasks or parses start with their imports done (`trainyard.cli.airflow_preloaded`).
        if component == "celery-worker":
            return [sys.executable, "-m", "trainyard.cli.airflow_preloaded", "celery", "worker", "--concurrency", "8",
                    "--skip-serve-logs"]
        if component in AIRFLOW:
            # (the scheduler forks tasks only with the LocalExecutor: Celery's workers run them)
            forks = component == "dag-processor" or (component == "scheduler" and not self.celery)
            launcher = "trainyard.cli.airflow_preloaded" if forks else "airflow"
            args = [sys.executable, "-m", launcher, component]
            if component == "api-server":
                return [*args, "--port", str(self.port), "--host", "127.0.0.1"]
            # No log servers: they listen on every interface (Airflow hard-codes it) and the API
            # server of a one-machine stack reads the task and trigger logs from the files.
            return [*args, "--skip-serve-logs"] if component in ("scheduler", "triggerer") else args
        if component == "mlflow":
            from trainyard.config.settings import Settings

            store = Settings(home=self.home).mlflow_tracking_uri
            if store.startswith(("http://", "https://")):  # the clients talk to this server: it keeps the home's
                from trainyard.config.databases import default_url  # database

                store = default_url(self.home, "mlflow")
            hosts = [f"127.0.0.1:{self.mlflow_port}", f"localhost:{self.mlflow_port}", *self.mlflow_hosts]
            # --app-name trainyard: MLflow's server, opening on its model-training pages
            # (`plugins/tracking/mlflow_app.py`).
            return [sys.executable, "-m", "mlflow", "server", "--app-name", "trainyard", "--backend-store-uri", store,
                    "--default-artifact-root", (self.home / "mlartifacts").as_uri(),
                    "--host", "127.0.0.1", "--port", str(self.mlflow_port), "--workers", "1",
                    "--allowed-hosts", ",".join(hosts)]
        node = component.removeprefix("node-agent-")
        url = self.agents()[node]
        return [sys.executable, "-m", "trainyard.node_agent", "--node", node, "--host", "127.0.0.1",
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
        from trainyard.config.settings import Settings
        from trainyard.plugins.tracking.runs import client_for

        uri = Settings(home=self.home).mlflow_tracking_uri
        if not uri.startswith(("http://", "https://")):  # a server migrates its own store
            client_for(uri)

    def _recorded(self, component: str) -> int | None:
        """The pid the component was started with — its process group — alive or not."""
        try:
            return int(self._pid_file(component).read_text())
        except (OSError, ValueError):
            return None

    def pid(self, component: str) -> int | None:
        pid = self._recorded(component)
        return pid if pid is not None and processes.is_alive(pid) else None

    def group(self, component: str) -> list[int]:
        """Every live process of the component's process group that belongs to this home: the
        part itself and what it started — the LocalExecutor's workers, a log server — even after
        the part itself was killed. A process group id is not reused while any member lives;
        the working folder (every part starts in the home; Airflow's `setproctitle` overwrites
        the environment a marker variable would be read from) guards a stale pid file."""
        pgid = self._recorded(component)
        if pgid is None:
            return []
        home = self.home.resolve()
        return [pid for pid in processes.group_members([pgid]) if processes.cwd(pid) == home]

    def start(self, component: str) -> int:
        """Start one component unless it runs already; returns its pid."""
        if component not in self.components:
            raise ValueError(f"unknown component {component!r}; one of {self.components}")
        running = self.pid(component)
        if running is not None:
            return running
        if self.group(component):  # the part crashed and left its children: end them first
            self.stop_all([component], grace_s=5.0)
        for folder in (self._pid_file(component).parent, self.log_file(component).parent):
            folder.mkdir(parents=True, exist_ok=True)
        args = self._command(component)
        (self.home / "runs").mkdir(parents=True, exist_ok=True)
        with self.log_file(component).open("ab") as log:
            proc = subprocess.Popen(args, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.home)
        self._pid_file(component).write_text(str(proc.pid))
        return proc.pid

    def stop(self, component: str, *, grace_s: float = 20.0) -> int:
        """SIGTERM the component's process group, SIGKILL what is left after `grace_s`."""
        return self.stop_all([component], grace_s=grace_s)[component]

    def stop_all(self, components: list[str], *, grace_s: float = 20.0) -> dict[str, int]:
        """SIGTERM every named component's process group at once, then SIGKILL what is left after
        one shared `grace_s` — the parts shut down side by side, not one grace period each.
        A group whose leader already died (a crashed part) is ended too: its children ignore
        no SIGKILL. Returns component → the processes it ended."""
        groups = {c: self.group(c) for c in components}
        for members in groups.values():
            processes.signal_pids(members, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(members) for members in groups.values()):
            time.sleep(0.2)
        for members in groups.values():
            processes.signal_pids(_alive(members), signal.SIGKILL)
        # SIGKILL is delivered asynchronously: wait until the groups are gone (briefly: nothing
        # can refuse it), so a part started again right after never meets its old self.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(members) for members in groups.values()):
            time.sleep(0.05)
        for component, members in groups.items():
            for pid in members:
                processes.reap(pid)
            self._pid_file(component).unlink(missing_ok=True)
        return {component: len(members) for component, members in groups.items()}

    def up(self, *, timeout_s: float = 180.0) -> None:
        if self.postgres is not None:  # first: every other part keeps its state there
            self.postgres.start()
            self.postgres.ensure_databases()
            from trainyard.config.settings import get_settings

            get_settings.cache_clear()  # this process's settings now name the home's server
        self.migrate()
        for component in self.components:
            self.start(component)
        deadline = time.monotonic() + timeout_s
        # The API server builds its task-execution API on the first request to it (3.6 s here):
        # asked while the other parts start, not by the first task of the first run.
        warm = threading.Thread(target=_wait_http, args=(f"{self.url}/execution/health", deadline),
                                kwargs={"request_timeout_s": 30.0}, name="warm-execution-api", daemon=True)
        warm.start()
        self.wait_healthy(timeout_s=timeout_s)
        for url in [*([self.mlflow_url + "/health"] if self.mlflow_port else []),
                    *(u + "/livez" for u in self.agents().values())]:
            _wait_http(url, deadline)
        warm.join(max(0.0, deadline - time.monotonic()))

    def down(self, *, templates: bool = True, grace_s: float = 20.0) -> dict[str, int]:
        """Stop every part, then whatever else of the home still runs (`leftovers`: a run's
        agents, ranks and rank starters); component → the processes ended (0: it was not
        running). With `templates` (`make down`) also this user's rank templates, which no part
        of a stack owns: a test that stops one of several stacks on a host leaves them to the
        others' attempts."""
        ended = self.stop_all(list(reversed(self.components)), grace_s=grace_s)
        ended["runs"] = len(processes.end_all(self.leftovers, grace_s=grace_s))
        # a detached `trainyard launch`'s follower concludes its attempt once the run's processes
        # are gone (the verdict, the MLflow run, the reservation): it is given the grace to
        ended["followers"] = len(processes.end_all(self.followers, grace_s=grace_s, ask=False))
        if self.postgres is not None:  # last: the parts above close their sessions first
            ended["postgres"] = int(self.postgres.stop())
        if templates:
            ended["rank templates"] = rank_zygote.stop_templates()
        return ended

    def leftovers(self) -> list[int]:
        """What of the home still runs once the parts' groups have gone: every process of a run
        under the home's run folder (`RUN_MARKER`: its torchrun agents, rank starters, wrappers
        and ranks, which run in sessions of their own and outlive a scheduler that crashed), and
        any process started in the home (a part's child that left its group). Not the embedded
        PostgreSQL, which goes last by its own shutdown, after the ranks' last records; never the
        command that asks or its callers. Not `TRAINYARD_HOME` alone, which a user's own shell
        may carry."""
        from trainyard.plugins.launch.local import RUN_MARKER

        server = self.postgres.pid() if self.postgres is not None else None
        spared = processes.ancestors() | ({server, *processes.children(server)} if server else set())
        found = set(processes.marked_under(RUN_MARKER, self.home / "runs")) | set(processes.started_in(self.home))
        return sorted(found - spared)

    def followers(self) -> list[int]:
        """The followers of detached `trainyard launch`es of this home's runs: this Python's
        `trainyard.cli.main launch … --attach <run folder>/…` (`cli/launch.py`). They carry no
        run marker (a run's own stop would end them before they conclude), and `TRAINYARD_HOME`
        alone marks nothing."""
        runs = {str(self.home / "runs"), str((self.home / "runs").resolve())}
        found = []
        for pid in processes.started_as([sys.executable, "-m", "trainyard.cli.main", "launch"]):
            argv = processes.command_line(pid) or []
            attached = argv[argv.index("--attach") + 1] if "--attach" in argv[:-1] else ""
            if any(attached.startswith(root + "/") for root in runs):
                found.append(pid)
        return found

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


def _wait_http(url: str, deadline: float, *, request_timeout_s: float = 3.0) -> None:
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=request_timeout_s) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError) as e:
            last = str(e)
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer: {last}")


def _alive(pids: list[int]) -> list[int]:
    """The processes of `pids` that still run. Zombies do not count (a leader nobody has reaped,
    orphans no init collects): `stop` would wait out its whole grace for parts that exited."""
    for pid in pids:
        processes.reap(pid)
    return [pid for pid in pids if processes.is_alive(pid)]


def default_stack(home: Path, *, port: int = DEFAULT_PORT, airflow_only: bool = False) -> Stack:
    """The stack `make up` and `make demo` run: Airflow, the MLflow UI, the node agents."""
    if airflow_only:
        return Stack(home, port=port)
    return Stack(home, port=port, mlflow_port=int(os.environ.get("TRAINYARD_MLFLOW_PORT", MLFLOW_PORT)),
                 agent_port=int(os.environ.get("TRAINYARD_AGENT_PORT", AGENT_PORT)))


def main(argv: list[str] | None = None) -> int:
    from trainyard.config.settings import get_settings

    p = argparse.ArgumentParser(prog="python -m trainyard.cli.stack", description=__doc__.split("\n\n")[0])
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
        ended = stack.down()
        stopped = {c: n for c, n in ended.items() if n}
        print("stopped " + (", ".join(f"{c} ({n} process{'es' if n > 1 else ''})" for c, n in stopped.items())
                            if stopped else "nothing: no part of the stack was running"))
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
