"""Start and stop a real `mlflow server` process for tests.

The server runs in its own process group (uvicorn and, unless disabled, a job runner are
children), so `stop()` ends the whole group it started and nothing else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support import procs


@dataclass
class MlflowServer:
    uri: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def start_mlflow_server(
    backend_uri: str,
    artifacts_dir: Path,
    log_path: Path,
    *,
    port: int | None = None,
    timeout_s: float = 240,
    app_name: str | None = "trainyard",
) -> MlflowServer:
    """`mlflow server` on 127.0.0.1 with proxied artifacts; returns once `/health` answers. Runs
    the app the product runs (`--app-name trainyard`) unless `app_name` says otherwise."""
    port = port or procs.free_port()
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", backend_uri,
        "--artifacts-destination", str(artifacts_dir),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        *(["--app-name", app_name] if app_name else []),
    ]
    # The job runner (a huey consumer pool) serves GenAI jobs we never submit: leave it off.
    env = procs.test_env({"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    log = log_path.open("wb")
    process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, cwd=log_path.parent)
    log.close()
    server = MlflowServer(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.uri}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop()
    raise RuntimeError(f"mlflow server did not answer /health within {timeout_s}s:\n{server.log_tail()}")
