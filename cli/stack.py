"""The embedded Airflow stack on this machine: start, check, stop (`make airflow`, `make demo`,
the end-to-end tests).

Each component (`api-server`, `scheduler`, `dag-processor`, `triggerer`) runs as its own
process in its own session, with its log in `<TRAINYARD_HOME>/logs/<component>.log` and its pid
in `<TRAINYARD_HOME>/pids/<component>.pid`, so it outlives the command that started it and any
later command (`make down`, a test) can find and stop it. Separate processes rather than
`airflow standalone`, so one part can be restarted alone — the way a deployment loses a
scheduler — while training goes on.

Usage: `python -m cli.stack up|down|status [--port P]`.
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
from dataclasses import dataclass
from pathlib import Path

from config.airflow import DEFAULT_PORT, airflow_env

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


@dataclass(frozen=True)
class Stack:
    """The embedded Airflow of one Trainyard home."""

    home: Path
    port: int = DEFAULT_PORT

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return airflow_env(self.home, port=self.port)

    def _pid_file(self, component: str) -> Path:
        return self.home / "pids" / f"{component}.pid"

    def log_file(self, component: str) -> Path:
        return self.home / "logs" / f"{component}.log"

    def migrate(self) -> None:
        """Create or upgrade the metadata database (idempotent)."""
        self.log_file("db-migrate").parent.mkdir(parents=True, exist_ok=True)
        with self.log_file("db-migrate").open("ab") as log:
            subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=self.env(), check=True,
                           stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=600)

    def pid(self, component: str) -> int | None:
        try:
            pid = int(self._pid_file(component).read_text())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    def start(self, component: str) -> int:
        """Start one component unless it runs already; returns its pid."""
        if component not in COMPONENTS:
            raise ValueError(f"unknown component {component!r}; one of {COMPONENTS}")
        running = self.pid(component)
        if running is not None:
            return running
        for folder in (self._pid_file(component).parent, self.log_file(component).parent):
            folder.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "airflow", component]
        if component == "api-server":
            args += ["--port", str(self.port), "--host", "127.0.0.1"]
        with self.log_file(component).open("ab") as log:
            proc = subprocess.Popen(args, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.home)
        self._pid_file(component).write_text(str(proc.pid))
        return proc.pid

    def stop(self, component: str, *, grace_s: float = 20.0) -> None:
        """SIGTERM the component's process group, SIGKILL what is left after `grace_s`."""
        pid = self.pid(component)
        if pid is None:
            self._pid_file(component).unlink(missing_ok=True)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        self._pid_file(component).unlink(missing_ok=True)

    def up(self, *, timeout_s: float = 180.0) -> None:
        self.migrate()
        for component in COMPONENTS:
            self.start(component)
        self.wait_healthy(timeout_s=timeout_s)

    def down(self) -> None:
        for component in reversed(COMPONENTS):
            self.stop(component)

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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    from config.settings import get_settings

    p = argparse.ArgumentParser(prog="python -m cli.stack", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--port", type=int, default=int(os.environ.get("TRAINYARD_AIRFLOW_PORT", DEFAULT_PORT)))
    args = p.parse_args(argv)
    stack = Stack(get_settings().home, port=args.port)
    if args.action == "up":
        stack.up()
        print(f"Airflow is up: {stack.url} (no login: local-only simple auth); logs in {stack.home / 'logs'}")
    elif args.action == "down":
        stack.down()
        print("Airflow stopped")
    else:
        for component in COMPONENTS:
            print(f"{component:14} {'running, pid ' + str(stack.pid(component)) if stack.pid(component) else 'stopped'}")
        with contextlib.suppress(OSError, ValueError):
            print(json.dumps(stack.health()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
