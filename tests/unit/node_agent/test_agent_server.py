"""The real HTTP server (in-process, on a free port): /health, /metrics, /faults, the client."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pynvml
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import free_port
from tests.unit.node_agent.fake_nvml import FakeGpu, FakeNvml
from trainyard.node_agent import client
from trainyard.node_agent.config import AgentConfig
from trainyard.node_agent.gpu_probe import NvmlProbe
from trainyard.node_agent.models import FaultRequest, NodeHealth
from trainyard.node_agent.monitor import Monitor
from trainyard.node_agent.server import AgentServer
from trainyard.plugins.run.heartbeat import Heartbeat, heartbeat_path, write_heartbeat


@dataclass
class Agent:
    url: str
    monitor: Monitor
    heartbeats: Path
    fake: FakeNvml


def _start(tmp_path: Path, *, gpus: int | None, faults: bool) -> Iterator[Agent]:
    if gpus is None:
        fake = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    else:
        fake = FakeNvml([FakeGpu(uuid=f"GPU-{i}", temperature=50 + i) for i in range(gpus)])
    config = AgentConfig(node="node-7", heartbeat_dir=tmp_path / "hb", host="127.0.0.1", port=0, cpu_slots=4,
                         xid_wait_ms=10, enable_fault_injection=faults)
    monitor = Monitor(config, NvmlProbe(fake.module))
    monitor.open()
    server = AgentServer(monitor)
    server.start()
    try:
        yield Agent(f"http://127.0.0.1:{server.port}", monitor, config.heartbeat_dir, fake)
    finally:
        server.stop()
        monitor.close()


@pytest.fixture
def gpu_agent(tmp_path: Path) -> Iterator[Agent]:
    """An agent over a fake 2-GPU NVML, fault injection on."""
    yield from _start(tmp_path, gpus=2, faults=True)


@pytest.fixture
def cpu_agent(tmp_path: Path) -> Iterator[Agent]:
    """An agent on a node without the NVIDIA driver (CPU slots), fault injection off."""
    yield from _start(tmp_path, gpus=None, faults=False)


def _request(url: str, method: str = "GET", body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def _metrics(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, content_type, body = _request(url + "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(body.decode())}


def _value(samples: list[tuple[dict[str, str], float]], **labels: str) -> float:
    (value,) = [v for lab, v in samples if all(lab.get(k) == x for k, x in labels.items())]
    return value


def test_health_reports_gpus_and_ranks(gpu_agent: Agent) -> None:
    now = time.time()
    write_heartbeat(gpu_agent.heartbeats / "job" / "0", Heartbeat(
        job="llama", attempt=2, rank=1, pid=42, step=120, time=now - 1, loss=1.75, tokens_per_s=9000.0))
    status, content_type, body = _request(gpu_agent.url + "/health")
    after = time.time()
    assert (status, content_type) == (200, "application/json")
    health = NodeHealth.model_validate_json(body)
    assert (health.node, health.accelerator, health.healthy, health.fault_injection) == ("node-7", "nvidia", True, True)
    assert [(g.index, g.temperature_celsius) for g in health.gpus] == [(0, 50.0), (1, 51.0)]
    (rank,) = health.ranks
    assert (rank.job, rank.attempt, rank.rank, rank.step, rank.loss, rank.stale) == ("llama", 2, 1, 120, 1.75, False)
    assert 1 <= rank.age_s <= after - (now - 1)  # aged at the time of the request


def test_metrics_follow_prometheus_conventions(gpu_agent: Agent) -> None:
    beat_time = time.time() - 30
    write_heartbeat(gpu_agent.heartbeats, Heartbeat(job="llama", rank=0, pid=1, step=5, time=beat_time,
                                                    loss=3.0, tokens_per_s=10.0, nan=True, hang_timeout_s=10))
    heartbeat_path(gpu_agent.heartbeats, 1).write_text('{"half": ')
    m = _metrics(gpu_agent.url)
    after = time.time()
    gpu1 = {"node": "node-7", "gpu": "1", "uuid": "GPU-1", "model": "NVIDIA H100 80GB HBM3"}
    assert _value(m["trainyard_gpu_temperature_celsius"], **gpu1) == 51.0
    assert _value(m["trainyard_gpu_memory_used_bytes"], **gpu1) == 10 * 2**30
    assert _value(m["trainyard_gpu_utilization_ratio"], **gpu1) == 0.5
    assert _value(m["trainyard_gpu_power_watts"], **gpu1) == 300.0
    assert _value(m["trainyard_gpu_ecc_uncorrectable_errors"], counter="volatile", **gpu1) == 0.0
    assert {lab["counter"] for lab, _ in m["trainyard_gpu_ecc_uncorrectable_errors"]} == {"volatile", "aggregate"}
    rank = {"job": "llama", "attempt": "0", "rank": "0"}
    assert 30 <= _value(m["trainyard_rank_heartbeat_age_seconds"], **rank) <= after - beat_time
    assert _value(m["trainyard_rank_step"], **rank) == 5
    assert _value(m["trainyard_rank_nan"], **rank) == 1
    assert _value(m["trainyard_rank_stale"], **rank) == 1
    assert _value(m["trainyard_node_healthy"], node="node-7") == 1  # a hang is the job's, not the node's
    assert _value(m["trainyard_node_verdicts"], kind="hang") == 1
    assert _value(m["trainyard_heartbeat_invalid_files"]) == 1
    assert _value(m["trainyard_node_devices"], type="gpu") == 2
    # The counter families are exposed with their _total samples.
    status, _, raw = _request(gpu_agent.url + "/metrics")
    assert status == 200 and b"trainyard_gpu_ecc_uncorrectable_errors_total{" in raw


def test_metrics_in_openmetrics_when_asked(gpu_agent: Agent) -> None:
    status, content_type, body = _request(gpu_agent.url + "/metrics",
                                          headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and content_type.startswith("application/openmetrics-text")
    names = {f.name for f in parse_openmetrics(body.decode())}
    assert {"trainyard_gpu_temperature_celsius", "trainyard_gpu_xid_events", "trainyard_node_healthy"} <= names


def test_faults_are_refused_unless_enabled(cpu_agent: Agent) -> None:
    for method, body in (("POST", b'{"gpu": 0, "xid": 79}'), ("DELETE", None)):
        status, _, answer = _request(cpu_agent.url + "/faults", method, body, {"Content-Type": "application/json"})
        assert status == 403
        assert "--enable-fault-injection" in json.loads(answer)["error"]
    health = client.fetch_health(cpu_agent.url)
    assert health.healthy and health.verdicts[0].kind == "no_gpu" and health.slots == 4
    with pytest.raises(client.AgentResponseError) as refused:
        client.inject_fault(cpu_agent.url, FaultRequest(gpu=0))
    assert refused.value.status == 403


def test_inject_and_clear_a_gpu_failure(gpu_agent: Agent) -> None:
    health = client.inject_fault(gpu_agent.url, FaultRequest(gpu=1, xid=79))
    assert not health.healthy and health.failed_gpus == [1]
    (verdict,) = health.unhealthy_verdicts()
    assert (verdict.xid, verdict.injected) == (79, True)
    m = _metrics(gpu_agent.url)
    assert _value(m["trainyard_gpu_xid_events"], gpu="1", xid="79") == 1
    assert _value(m["trainyard_gpu_failed"], gpu="1") == 1 and _value(m["trainyard_gpu_failed"], gpu="0") == 0
    assert _value(m["trainyard_node_healthy"]) == 0

    status, _, body = _request(gpu_agent.url + "/faults", "POST", b'{"node_unhealthy": true, "reason": "drill"}')
    assert status == 200 and NodeHealth.model_validate_json(body).unhealthy_verdicts()[-1].reason == "drill"

    health = client.clear_faults(gpu_agent.url)
    assert health.healthy and health.verdicts == []
    assert _value(_metrics(gpu_agent.url)["trainyard_gpu_xid_events"], gpu="1", xid="79") == 1


@pytest.mark.parametrize(("body", "message"), [
    (b"{nope", "Invalid JSON"),
    (b'{"gpu": 1, "node_unhealthy": true}', "exactly one fault"),
    (b'{"gpu": 2}', "gpu 2 does not exist: this node reports 2 device(s)"),
    (b'{"gpu": 0, "colour": "red"}', "Extra inputs are not permitted"),
])
def test_bad_fault_requests_get_400(gpu_agent: Agent, body: bytes, message: str) -> None:
    status, _, answer = _request(gpu_agent.url + "/faults", "POST", body)
    assert status == 400 and message in json.loads(answer)["error"]
    assert client.fetch_health(gpu_agent.url).healthy


def test_unknown_paths_and_methods(cpu_agent: Agent) -> None:
    assert _request(cpu_agent.url + "/nope")[0] == 404
    assert _request(cpu_agent.url + "/health", "POST", b"{}")[0] == 405
    assert _request(cpu_agent.url + "/livez") == (200, "text/plain; charset=utf-8", b"ok\n")
    assert _request(cpu_agent.url + "/health?verbose=1")[0] == 200


def test_real_xid_events_show_up_over_http(gpu_agent: Agent) -> None:
    gpu_agent.fake.push_xid(0, 48)
    deadline = time.monotonic() + 10
    while not (health := client.fetch_health(gpu_agent.url + "/health")).failed_gpus:
        assert time.monotonic() < deadline, "the Xid event never reached /health"
        time.sleep(0.02)
    assert health.failed_gpus == [0] and health.gpus[0].xid_events == {48: 1}
    assert client.clear_faults(gpu_agent.url).failed_gpus == [0]  # a real Xid is not clearable


def test_client_errors_tell_unreachable_from_bad_answers(cpu_agent: Agent) -> None:
    with pytest.raises(client.AgentUnreachable, match="no answer"):
        client.fetch_health(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(client.AgentResponseError, match="HTTP 404"):
        client.fetch_health(cpu_agent.url + "/nope/", timeout=2)


def test_client_builds_endpoints() -> None:
    assert client.endpoint("http://n:9420", "health") == "http://n:9420/health"
    assert client.endpoint("http://n:9420/health/", "faults") == "http://n:9420/faults"
    assert client.endpoint("n:9420", "health") == "http://n:9420/health"
    assert client.endpoint("https://proxy/agents/n1/", "health") == "https://proxy/agents/n1/health"


def test_data_pipeline_figures_reach_prometheus(cpu_agent: Agent) -> None:
    """A heartbeat's data figures (`trainyard.worker.session`: stall, prefetch depth, cache counters)
    become per-rank gauges; a heartbeat without them (an older runtime) exposes none."""
    write_heartbeat(cpu_agent.heartbeats, Heartbeat(
        job="llama", rank=0, pid=1, step=5, time=time.time(), data_stall_s=0.25, prefetch_depth=3,
        cache_hit_rate=0.75, cache_hits=3, cache_misses=1, cache_bytes_fetched=4096, cache_evictions=2))
    write_heartbeat(cpu_agent.heartbeats, Heartbeat(job="llama", rank=1, pid=2, step=5, time=time.time()))
    m = _metrics(cpu_agent.url)
    rank = {"job": "llama", "attempt": "0", "rank": "0"}
    assert _value(m["trainyard_rank_data_stall_seconds"], **rank) == 0.25
    assert _value(m["trainyard_rank_data_prefetch_depth"], **rank) == 3
    assert _value(m["trainyard_rank_data_cache_hit_ratio"], **rank) == 0.75
    assert _value(m["trainyard_rank_data_cache_fetched_bytes"], **rank) == 4096
    assert _value(m["trainyard_rank_data_cache_evictions"], **rank) == 2
    assert [lab["rank"] for lab, _ in m["trainyard_rank_data_cache_hits"]] == ["0"]
