"""`python -m trainyard.node_agent` / `trainyard-node-agent` as a real process on a free port, with this
machine's real NVML (none here: CPU slots; on an NVIDIA machine the same tests see its GPUs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import procs
from tests.support.require import missing
from trainyard.node_agent import client
from trainyard.node_agent.models import FaultRequest, NodeHealth
from trainyard.plugins.run.heartbeat import Heartbeat, heartbeat_path, write_heartbeat

pytestmark = pytest.mark.slow


@dataclass
class RunningAgent:
    url: str
    heartbeats: Path
    process: subprocess.Popen[str]
    log: Path

    def stop(self) -> tuple[int, str]:
        """SIGTERM, as Kubernetes and docker stop do; returns (exit code, log)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        return int(self.process.returncode), self.log.read_text()


def _launch(tmp_path: Path, extra: Sequence[str] = ()) -> RunningAgent:
    port = procs.free_port()
    heartbeats = tmp_path / "heartbeats"
    log = tmp_path / f"agent-{port}.log"
    cmd = [sys.executable, "-m", "trainyard.node_agent", "--node", "test-node", "--host", "127.0.0.1", "--port", str(port),
           "--heartbeat-dir", str(heartbeats), "--poll-interval-s", "0.2", "--cpu-slots", "2", *extra]
    with open(log, "w") as out:
        process = subprocess.Popen(cmd, cwd=procs.REPO_ROOT, env=procs.test_env(), stdout=out,
                                   stderr=subprocess.STDOUT, text=True)
    agent = RunningAgent(f"http://127.0.0.1:{port}", heartbeats, process, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(agent.url + "/livez", timeout=2) as r:
                if r.status == 200:
                    return agent
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            code, text = agent.stop()
            raise AssertionError(f"agent did not come up (exit {code}):\n{text}")
        time.sleep(0.05)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    running = _launch(tmp_path)
    yield running
    running.stop()


def test_serves_health_and_metrics_and_stops_cleanly(agent: RunningAgent) -> None:
    now = time.time()
    hb = agent.heartbeats / "llama" / "attempt-3"
    alive = os.getpid()  # the agent shares this PID namespace: the ranks' processes must live
    write_heartbeat(hb, Heartbeat(job="llama", attempt=3, rank=0, pid=alive, step=50, time=now, loss=2.0,
                                  tokens_per_s=512.0, hang_timeout_s=600))
    write_heartbeat(hb, Heartbeat(job="llama", attempt=3, rank=1, pid=alive, step=44, time=now - 120,
                                  hang_timeout_s=60))
    heartbeat_path(hb, 2).write_text('{"job": "llama", "rank": 2, "st')  # a writer died mid-write

    health = client.fetch_health(agent.url, timeout=10)
    assert health.node == "test-node"
    assert [(r.rank, r.step, r.stale) for r in health.ranks] == [(0, 50, False), (1, 44, True)]
    assert [(v.kind, v.rank) for v in health.verdicts if v.kind == "hang"] == [("hang", 1)]
    assert health.invalid_heartbeat_files == 1
    if health.accelerator == "cpu":
        assert health.slots == 2 and health.gpus == [] and health.probe_error
    else:  # an NVIDIA machine: the real probe saw its GPUs
        assert health.gpus and all(g.memory_total_bytes for g in health.gpus)

    with urllib.request.urlopen(agent.url + "/metrics", timeout=10) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    ages = {s.labels["rank"]: s.value for s in families["trainyard_rank_heartbeat_age_seconds"].samples}
    assert set(ages) == {"0", "1"} and ages["1"] >= 120
    steps = {s.labels["rank"]: s.value for s in families["trainyard_rank_step"].samples}
    assert steps == {"0": 50.0, "1": 44.0}
    assert families["trainyard_node_healthy"].samples[0].value == 1.0

    for _ in range(3):  # polls and scrapes go on; the warnings do not repeat
        client.fetch_health(agent.url, timeout=10)
        time.sleep(0.25)
    code, log = agent.stop()
    assert code == 0, log
    assert log.count("skipping heartbeat file") == 1, log
    if health.accelerator == "cpu":
        assert log.count("no NVIDIA GPU/driver") == 1, log
    assert "SIGTERM: stopping" in log


def test_fault_endpoint_refused_when_not_enabled(agent: RunningAgent) -> None:
    req = urllib.request.Request(agent.url + "/faults", data=b'{"gpu": 0, "xid": 79}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 403
    assert client.fetch_health(agent.url, timeout=10).healthy


def test_fault_injection_when_enabled(tmp_path: Path) -> None:
    agent = _launch(tmp_path, ["--enable-fault-injection"])
    try:
        health = client.inject_fault(agent.url, FaultRequest(gpu=1, xid=79), timeout=10)
        assert not health.healthy and health.failed_gpus == [1] and health.fault_injection
        health = client.inject_fault(agent.url, FaultRequest(node_unhealthy=True, reason="game day"), timeout=10)
        assert [v.kind for v in health.unhealthy_verdicts()] == ["gpu_failed", "node_unhealthy"]
        assert client.clear_faults(agent.url, timeout=10).healthy
    finally:
        code, log = agent.stop()
    assert code == 0, log
    assert "fault injection ON" in log


def test_once_prints_one_report(tmp_path: Path) -> None:
    write_heartbeat(tmp_path, Heartbeat(job="j", rank=0, pid=1, step=1, time=time.time()))
    out = subprocess.run([sys.executable, "-m", "trainyard.node_agent", "--once", "--node", "n1", "--heartbeat-dir",
                          str(tmp_path), "--cpu-slots", "3"], cwd=procs.REPO_ROOT, env=procs.test_env(),
                         capture_output=True, text=True, timeout=120)
    procs.check(out)
    health = NodeHealth.model_validate_json(out.stdout)
    assert health.node == "n1" and [r.job for r in health.ranks] == ["j"]
    assert health.slots == (3 if health.accelerator == "cpu" else 0)


def test_usage_errors_and_a_busy_port(tmp_path: Path, agent: RunningAgent) -> None:
    base = [sys.executable, "-m", "trainyard.node_agent", "--once"]
    env = procs.test_env({"TRAINYARD_HEARTBEAT_DIR": ""})
    missing = subprocess.run(base, cwd=procs.REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "--heartbeat-dir is required" in missing.stderr
    bad = subprocess.run([*base, "--heartbeat-dir", str(tmp_path), "--poll-interval-s", "0"], cwd=procs.REPO_ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--poll-interval-s" in bad.stderr
    port = agent.url.rsplit(":", 1)[1]
    busy = subprocess.run([sys.executable, "-m", "trainyard.node_agent", "--heartbeat-dir", str(tmp_path), "--host",
                           "127.0.0.1", "--port", port], cwd=procs.REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert busy.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("trainyard-node-agent")
    if not script.exists():
        missing("scripts", f"{script} is not installed")
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120,
                         env=procs.test_env())
    procs.check(out)
    assert "--enable-fault-injection" in out.stdout
