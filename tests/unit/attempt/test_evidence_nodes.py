"""`observe_node` (judged by `classify.node_fatal_reasons`) against a real node agent (in-process
HTTP server over a fake NVML, as in
tests/unit/node_agent): a failed GPU makes the node lost; a silent agent counts missed
heartbeats until the third."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import free_port
from tests.unit.node_agent.test_agent_server import Agent, _start
from trainyard.node_agent import client
from trainyard.node_agent.models import FaultRequest
from trainyard.plugins.attempt.evidence import observe_node
from trainyard.plugins.recovery.classify import node_fatal_reasons
from trainyard.plugins.run.rules import MISSED_HEARTBEATS_LOST


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    yield from _start(tmp_path, gpus=2, faults=True)


def test_a_failed_gpu_makes_the_node_lost(agent: Agent) -> None:
    healthy = observe_node("node-7", agent.url)
    assert healthy.health is not None and node_fatal_reasons(healthy) == []
    client.inject_fault(agent.url, FaultRequest(gpu=1, xid=79))
    lost = observe_node("node-7", agent.url)
    (reason,) = node_fatal_reasons(lost)
    assert reason.startswith("node-7 GPU 1: gpu_failed (Xid 79)")


def test_missed_heartbeats_add_up_to_a_lost_node() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens
    seen = observe_node("node-9", url, timeout=1.0)
    for _ in range(MISSED_HEARTBEATS_LOST - 1):
        assert node_fatal_reasons(seen) == []
        seen = observe_node("node-9", url, missed_before=seen.missed_heartbeats, timeout=1.0)
    assert seen.missed_heartbeats == MISSED_HEARTBEATS_LOST
    assert node_fatal_reasons(seen)[0].startswith("node agent on node-9 missed 3 heartbeats")


def test_the_health_watcher_judges_nodes_the_same_way(agent: Agent) -> None:
    from trainyard.plugins.attempt.watching import lost_nodes
    from trainyard.plugins.run.model import RunHandle

    handle = RunHandle(kind="local", job="tiny", attempt=0, world_size=2, nodes=["node-7", "node-8"])
    agents = {"node-7": agent.url, "node-8": f"http://127.0.0.1:{free_port()}"}
    misses: dict[str, int] = {}
    answered: dict[str, float] = {}
    before = time.time()
    assert lost_nodes(handle, agents, misses=misses, max_misses=2, answered=answered) == []
    assert misses == {"node-7": 0, "node-8": 1}
    assert list(answered) == ["node-7"] and before <= answered["node-7"] <= time.time()  # what dates a silence
    client.inject_fault(agent.url, FaultRequest(gpu=0, xid=48))
    lost = dict(lost_nodes(handle, agents, misses=misses, max_misses=2))
    assert lost["node-7"].startswith("node-7 GPU 0: gpu_failed (Xid 48)")
    assert lost["node-8"].startswith("node agent on node-8 missed 2 heartbeats")


def test_the_health_watcher_asks_every_node_at_once() -> None:
    """Four agents that answer only once all four have been asked: probed one after another,
    the first would wait past the probe timeout and count a miss (a rack of silent agents
    would stretch each poll by the timeout per node)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from trainyard.node_agent.models import NodeHealth
    from trainyard.plugins.attempt.watching import PROBE_TIMEOUT_S, lost_nodes
    from trainyard.plugins.run.model import RunHandle

    nodes = [f"node-{i}" for i in range(4)]
    everyone_asked = threading.Barrier(len(nodes), timeout=PROBE_TIMEOUT_S + 1)

    class Agent(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            everyone_asked.wait()
            body = NodeHealth(node="n", time=time.time(), healthy=True, accelerator="cpu", uptime_s=1.0
                              ).model_dump_json().encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Agent) for _ in nodes]
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        agents = {n: f"http://127.0.0.1:{s.server_address[1]}" for n, s in zip(nodes, servers, strict=True)}
        misses: dict[str, int] = {}
        handle = RunHandle(kind="local", job="tiny", attempt=0, world_size=4, nodes=nodes)
        assert lost_nodes(handle, agents, misses=misses) == []
        assert misses == dict.fromkeys(nodes, 0)
    finally:
        everyone_asked.abort()
        for server in servers:
            server.shutdown()
            server.server_close()


def test_a_node_lost_to_silence_is_dated_by_its_last_answer_and_a_verdict_by_itself() -> None:
    from trainyard.plugins.attempt.watching import node_lost_stop

    answered = {"node-7": 1_000.0, "node-8": 1_004.0, "node-9": 990.0}
    stop = node_lost_stop([("node-8", "node agent on node-8 missed 3 heartbeats"), ("node-9", "node-9 GPU 0: gpu_failed")],
                          misses={"node-7": 0, "node-8": 3, "node-9": 0}, answered=answered)
    assert (stop.reason, stop.nodes, stop.since) == ("node_lost", ["node-8", "node-9"], 1_004.0)
    assert stop.detail == "node-8: node agent on node-8 missed 3 heartbeats; node-9: node-9 GPU 0: gpu_failed"
    never = node_lost_stop([("node-8", "missed 3 heartbeats")], misses={"node-8": 3}, answered={})
    assert never.since is None  # silent from the first poll: nothing dates it
