"""Real node agents (`python -m node_agent`, one process per node, fault injection on) for the
tests that need the health watch: each on a free port, reading the workers' heartbeats under
one folder (the runs folder: the agent searches it recursively)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support import procs


@contextmanager
def node_agents(nodes: Sequence[str], heartbeat_dir: Path, log_dir: Path, *, slots: int = 2
                ) -> Iterator[dict[str, str]]:
    """Start one agent per node; yield node → base URL (`Settings.node_agents`); stop them all."""
    heartbeat_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen[bytes]] = []
    urls: dict[str, str] = {}
    try:
        for node in nodes:
            port = procs.free_port()
            cmd = [sys.executable, "-m", "node_agent", "--node", node, "--host", "127.0.0.1", "--port", str(port),
                   "--heartbeat-dir", str(heartbeat_dir), "--cpu-slots", str(slots), "--enable-fault-injection",
                   "--poll-interval-s", "1"]
            with (log_dir / f"node-agent-{node}.log").open("wb") as log:
                started.append(subprocess.Popen(cmd, cwd=procs.REPO_ROOT, env=procs.test_env(), stdout=log,
                                                stderr=subprocess.STDOUT))
            urls[node] = f"http://127.0.0.1:{port}"
        for (node, url), proc in zip(urls.items(), started, strict=True):
            _wait_live(node, url, proc, log_dir)
        yield urls
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def _wait_live(node: str, url: str, proc: subprocess.Popen[bytes], log_dir: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/livez", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log = (log_dir / f"node-agent-{node}.log").read_text(errors="replace")
            raise AssertionError(f"node agent for {node} did not come up (exit {proc.poll()}):\n{log}")
        time.sleep(0.1)
