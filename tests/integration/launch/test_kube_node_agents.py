"""The node agents as the rendered DaemonSet on the real control plane (issue 55, Build 3).

`RealKubeHarness(node_agents=True)` applies what `render_node_agent_daemonset` renders for the
harness's options (emptyDir heartbeats: the agent reads the kubelet's pods folder as root with
only `DAC_READ_SEARCH`); kube-controller-manager's DaemonSet controller makes a pod per node,
kube-scheduler binds it, each node's kubelet runs it on the node's network with its hostPort
and probes. A tiny gang runs on both nodes as uid 1000; the test then asks the product where
the agents are (`KubernetesLauncher.node_agents`: the Node objects' InternalIP at the
DaemonSet's port, with the control plane's own token) and GETs each agent's `/health` and
`/metrics` there (through the harness's proxy into the simulated network): each reports the
heartbeats of that node's rank of the gang, read from the pod's emptyDir, 0600 files of uid
1000 — which only the capability lets root read.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.kube import tenant
from tests.support.kube.jobs import placed, tiny_job
from tests.support.kube.real_harness import RealKubeHarness
from trainyard.config.teams import Team, Teams
from trainyard.node_agent.client import fetch_health
from trainyard.plugins.launch.manifests import render_node_agent_daemonset
from trainyard.plugins.launch.tenancy import PLATFORM_NAMESPACE
from trainyard.plugins.launch.volcano import KubernetesLauncher

pytestmark = [pytest.mark.slow, pytest.mark.waits]
TEAMS = Teams(teams={"demo": Team(share=1.0, quota_gpus=2)})
NAMESPACE = "team-demo"
JOB = "tiny-agents"
RUN = "r-agents"


@pytest.fixture(scope="module")
def kube() -> Iterator[RealKubeHarness]:
    with tenant.traversable_harness("kube-node-agents-", node_agents=True) as harness:
        yield harness


@pytest.fixture(scope="module")
def launcher(kube: RealKubeHarness) -> KubernetesLauncher:
    return tenant.control_plane_launcher(kube, TEAMS)


def test_the_daemonsets_pods_run_on_every_node_as_rendered(kube: RealKubeHarness) -> None:
    rendered = render_node_agent_daemonset(kube.launcher_options())
    applied = kube.rest().get("apps/v1", "daemonsets", PLATFORM_NAMESPACE, "trainyard-node-agent")
    status = applied["status"]
    assert status["desiredNumberScheduled"] == status["numberReady"] == len(kube.node_names), status
    pods = kube.agent_pods()
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(kube.node_names)
    (container,) = rendered["spec"]["template"]["spec"]["containers"]
    for pod in pods:
        (running,) = pod["spec"]["containers"]
        assert running["command"] == container["command"] and running["ports"][0]["hostPort"] == 9400
        assert running["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["DAC_READ_SEARCH"]}
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"  # the controller's, not ours
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert "Ready" in [c["type"] for c in pod["status"]["conditions"] if c["status"] == "True"], pod["status"]
        assert pod["status"]["podIP"] == kube.network.nodes[pod["spec"]["nodeName"]].address  # hostPort: the node's


def test_the_health_watch_finds_each_agent_from_its_node_and_reads_its_ranks_heartbeats(
        kube: RealKubeHarness, launcher: KubernetesLauncher) -> None:
    job = placed(tiny_job(JOB, ["--steps", "100000", "--sleep", "0.2"]), kube.root / "home", run=RUN)
    handle = launcher.submit(*job.submit_args(), attempt=0)
    try:
        running = tenant.wait_for_status(kube, launcher, handle, lambda s: s.state == "running" and len(s.nodes) == 2
                                         and all("step 2" in tenant.trainer_log(kube, a.pod, NAMESPACE)
                                                 for a in s.agents), "the gang to train on both nodes")
        handle = handle.bound(running)
        agents = launcher.node_agents(handle)
        assert agents == {name: f"http://{kube.network.nodes[name].address}:9400" for name in handle.nodes}, agents
        with kube.reaching_nodes():
            reports = {node: fetch_health(url) for node, url in agents.items()}
            metrics = {node: urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
                       for node, url in agents.items()}
        ranks = {}
        for node, health in reports.items():  # one slot a node: one rank each, its own node's
            assert health.node == node, health
            (ranks[node],) = [r for r in health.ranks if r.job == JOB and r.run == RUN and r.attempt == 0]
            assert ranks[node].step >= 2 and not ranks[node].stale, ranks[node]
            assert health.invalid_heartbeat_files == 0, health.invalid_heartbeats
            steps = [line for line in metrics[node].splitlines() if line.startswith("trainyard_rank_step{")
                     and f'node="{node}"' in line and f'job="{JOB}"' in line]
            assert steps == [next(line for line in steps if f'rank="{ranks[node].rank}"' in line)], metrics[node]
        assert sorted(r.rank for r in ranks.values()) == [0, 1], ranks
    finally:
        launcher.stop(handle, grace_s=5)
