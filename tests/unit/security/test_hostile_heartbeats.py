"""Hostile heartbeat files: the node agent (its real HTTP server) names each bad file with the
reason in `/health`, keeps reporting the good ranks, and `/metrics` keeps answering with a
valid exposition — one absurd value must never break the scrape of the whole node."""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.node_agent.fake_nvml import FakeNvml
from tests.unit.security.hostile import TIMEOUT_S
from trainyard.node_agent.config import AgentConfig
from trainyard.node_agent.gpu_probe import NvmlProbe
from trainyard.node_agent.models import NodeHealth
from trainyard.node_agent.monitor import Monitor
from trainyard.node_agent.server import AgentServer
from trainyard.plugins.run.heartbeat import Heartbeat, heartbeat_path, write_heartbeat

pytestmark = pytest.mark.timeout(TIMEOUT_S)

GOOD = {"job": "j", "rank": 0, "pid": 10, "step": 7, "time": 0.0, "loss": 2.5}


def _doc(**override: object) -> bytes:
    return json.dumps({**GOOD, "rank": 1, "time": time.time(), **override}).encode()


HOSTILE: dict[str, tuple[bytes, str]] = {
    "400-digit step": (_doc().replace(b'"step": 7', b'"step": 1' + b"0" * 400), "step"),
    "negative step": (_doc(step=-1), "step"),
    "step as a string": (_doc(step="seven"), "step"),
    "time infinite": (_doc().replace(b'"time": ', b'"time": 1e999, "x": '), "time"),
    "time in the year 30000": (_doc(time=1e12), "time"),
    "4000-digit pid": (_doc().replace(b'"pid": 10', b'"pid": ' + b"9" * 4000), "pid"),
    "huge job name": (_doc(job="j" * 10_000), "job"),
    "tokens per second NaN": (_doc().replace(b'"loss": 2.5', b'"loss": 2.5, "tokens_per_s": NaN'), "tokens_per_s"),
    "hang timeout zero": (_doc(hang_timeout_s=0), "hang_timeout_s"),
    "a list": (b"[1, 2, 3]", "document"),
    "nested": (b"[" * 30_000 + b"]" * 30_000, "not a heartbeat"),
    "binary": (b"\x00\xff\xfe\x00", "not a heartbeat"),
    "empty": (b"", "empty"),
    "over the size limit": (b" " * 70_000 + _doc(), "more than a heartbeat"),
}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    config = AgentConfig(node="node-7", heartbeat_dir=tmp_path / "hb", host="127.0.0.1", port=0, cpu_slots=2)
    monitor = Monitor(config, NvmlProbe(fake.module))
    monitor.open()
    server = AgentServer(monitor)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", config.heartbeat_dir
    finally:
        server.stop()
        monitor.close()


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_bad_heartbeat_is_named_in_health_and_metrics_keep_answering(agent: tuple[str, Path], case: str) -> None:
    url, root = agent
    content, words = HOSTILE[case]
    folder = root / "j" / "r" / "0"
    write_heartbeat(folder, Heartbeat.model_validate({**GOOD, "time": time.time()}))
    bad = heartbeat_path(folder, 1)
    bad.write_bytes(content)

    status, body = _get(url + "/health")
    health = NodeHealth.model_validate_json(body)
    assert status == 200 and health.invalid_heartbeat_files == 1
    assert list(health.invalid_heartbeats) == [str(bad)] and words in health.invalid_heartbeats[str(bad)], health
    assert len(health.invalid_heartbeats[str(bad)]) < 300
    assert [(r.rank, r.step) for r in health.ranks] == [(0, 7)]  # the good rank is still reported

    status, text = _get(url + "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}  # a valid exposition
    assert status == 200
    assert [s.value for s in families["trainyard_rank_step"].samples] == [7.0]
    assert [s.value for s in families["trainyard_heartbeat_invalid_files"].samples] == [1.0]


def test_an_overflowing_loss_is_flagged_not_fatal(agent: tuple[str, Path]) -> None:
    """A 400-digit loss parses as inf: a rank whose loss diverged, reported as such."""
    url, root = agent
    heartbeat_path(root / "j", 0).parent.mkdir(parents=True)
    heartbeat_path(root / "j", 0).write_bytes(_doc(rank=0).replace(b'"loss": 2.5', b'"loss": 1' + b"0" * 400))
    health = NodeHealth.model_validate_json(_get(url + "/health")[1])
    (rank,) = health.ranks
    assert rank.nan and health.invalid_heartbeat_files == 0
    status, text = _get(url + "/metrics")
    (loss,) = next(f for f in text_string_to_metric_families(text) if f.name == "trainyard_rank_loss").samples
    assert status == 200 and math.isinf(loss.value)
