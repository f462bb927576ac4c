"""A lost node on the real control plane (issue 55): its pods ended as a real cluster ends them.

On `RealKubeHarness` — kube-apiserver, kube-controller-manager with its DEFAULT node-monitor
grace (50 s in v1.37) and eviction, kube-scheduler, Kueue — three simulated nodes, each running
its node agent as the rendered DaemonSet's pod, behind its link. A 2-rank gang runs on two of them; one node's link is cut (its
kubelet, its agent and its pod keep running behind it, unreachable). Then the product, as the
control plane with its own ServiceAccount token:
- detects it: the health watch's rule over the node agents (`watching.lost_nodes`: missed polls),
  found where the product finds them (`KubernetesLauncher.node_agents`: each Node's InternalIP);
- stops the gang (`KubernetesLauncher.stop` with the lost node): the healthy node's pod goes at
  once, the lost node's pod is deleted gracefully — no kubelet confirms it, so it stays
  Terminating — and once kube-controller-manager marks the node NotReady the stop taints it
  out-of-service (`fencing.py`);
- and kube-controller-manager's pod GC ends the pod (marked Failed, then deleted: the test writes
  nothing to the pod, and its kubelet is cut off), the Job goes, Kueue frees the gang's quota.
The next attempt, placed without the lost node (what the cordon does for placement), is admitted
within the team's quota of one gang and completes on the spare node.

Costs the default grace: about 50 s to NotReady and up to 20 s for the pod GC's period.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kube import tenant
from tests.support.kube.harness import NODES_WITH_SPARE
from tests.support.kube.jobs import placed, tiny_job
from tests.support.kube.real_harness import RealKubeHarness
from trainyard.config.cluster import Cluster, load_cluster
from trainyard.config.teams import Team, Teams
from trainyard.plugins.attempt import watching
from trainyard.plugins.launch.fencing import LOST_POD_GRACE_S, OUT_OF_SERVICE_KEY
from trainyard.plugins.launch.volcano import KubernetesLauncher
from trainyard.plugins.run.model import RunHandle, RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.waits]
TEAMS = Teams(teams={"demo": Team(share=1.0, quota_gpus=2)})
"""The team's Kueue quota (its share of the three nodes' slots) holds one gang of two, not two:
the next attempt is admitted only once the lost one's quota is freed."""
NAMESPACE = "team-demo"
JOB = "tiny-lost"
RUN = "r-lost"


@pytest.fixture(scope="module")
def kube() -> Iterator[RealKubeHarness]:
    """Three nodes (two for the gang, a spare), the node-agent DaemonSet's pods on them."""
    with tenant.traversable_harness("kube-node-loss-", NODES_WITH_SPARE, node_agents=True) as harness:
        yield harness


@pytest.fixture(scope="module")
def launcher(kube: RealKubeHarness) -> KubernetesLauncher:
    # the stop waits for Kubernetes' own verdict (50 s) and the pod GC (20 s period)
    return tenant.control_plane_launcher(kube, TEAMS, delete_timeout_s=240)


def with_spare() -> Cluster:
    """The harness's cluster file with its third node (the spare)."""
    data: dict[str, Any] = load_cluster("kube-sim").model_dump(by_alias=True, exclude_none=True)
    data["spec"]["racks"][0]["nodes"][0]["count"] = len(NODES_WITH_SPARE)
    return Cluster.model_validate(data)


class PodHistory:
    """Every version of one pod the API server announces, from a watch (the administrator's
    eyes: the test only reads), until it is DELETED."""

    def __init__(self, kube: RealKubeHarness, name: str) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.deleted = threading.Event()
        self._api = kube.cluster.client()  # type: ignore[union-attr]
        self._name = name
        threading.Thread(target=self._watch, name="pod-history", daemon=True).start()

    def _watch(self) -> None:
        from kubernetes import client, watch

        core = client.CoreV1Api(self._api)
        while not self.deleted.is_set():
            for event in watch.Watch().stream(core.list_namespaced_pod, NAMESPACE, timeout_seconds=30,
                                              field_selector=f"metadata.name={self._name}"):
                self.events.append((event["type"], self._api.sanitize_for_serialization(event["object"])))
                if event["type"] == "DELETED":
                    self.deleted.set()
                    return


def wait(kube: RealKubeHarness, launcher: KubernetesLauncher, handle: RunHandle, predicate: Any, what: str,
         timeout_s: float = 180) -> RunStatus:
    return tenant.wait_for_status(kube, launcher, handle, predicate, what, timeout_s)


def test_a_lost_nodes_pods_are_ended_by_the_controllers_and_the_next_attempt_runs_on_the_spare(
        kube: RealKubeHarness, launcher: KubernetesLauncher) -> None:
    cluster, spare = with_spare(), NODES_WITH_SPARE[-1]
    first = placed(tiny_job(JOB, ["--steps", "100000", "--sleep", "0.2"]), kube.root / "home", run=RUN,
                   cluster=cluster, exclude=frozenset({spare}))
    handle = launcher.submit(*first.submit_args(), attempt=0)
    running = wait(kube, launcher, handle, lambda s: s.state == "running" and len(s.nodes) == 2
                   and all("step 2" in tenant.trainer_log(kube, a.pod, NAMESPACE) for a in s.agents),
                   "the gang to train on two nodes")
    handle = handle.bound(running)
    lost = sorted(running.nodes)[-1]
    lost_pod = next(a.pod for a in running.agents if a.node == lost)
    history = PodHistory(kube, lost_pod)

    agents = launcher.node_agents(handle)
    assert set(agents) == set(running.nodes), agents
    kube.lose_node(lost)
    misses: dict[str, int] = {}
    answered: dict[str, float] = {}
    with kube.reaching_nodes():
        verdict = kube.wait_for(lambda: watching.lost_nodes(handle, agents, misses=misses, answered=answered),
                                90, "the health watch to lose the node")
    assert [node for node, _ in verdict] == [lost], verdict
    reason = watching.node_lost_stop(verdict, misses=misses, answered=answered)
    stopped = launcher.stop(handle, grace_s=10, lost_nodes=reason.nodes)

    assert stopped.state == "stopped" and not stopped.processes_alive, stopped.message
    assert f"tainted {lost} {OUT_OF_SERVICE_KEY} (NotReady)" in stopped.message, stopped.message
    node = kube.rest().get("v1", "nodes", None, lost)
    assert {"key": OUT_OF_SERVICE_KEY, "value": "nodeshutdown", "effect": "NoExecute"} in node["spec"]["taints"]
    assert next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready") != "True"
    # the lost pod: deleted gracefully (never forced), Terminating while no kubelet could confirm,
    # then marked Failed by the pod GC (its kubelet is cut off; the test writes nothing) and deleted
    assert history.deleted.wait(30), history.events
    kinds = [(kind, pod["metadata"].get("deletionGracePeriodSeconds"), pod["status"].get("phase"))
             for kind, pod in history.events]
    terminating = [k for k in kinds if k[1] is not None]
    # the stop's graceful deletion — unless the Job's foreground deletion had the garbage collector
    # delete the pod first, with its own terminationGracePeriodSeconds, which the stop's then
    # shortens (CI, once: 10 s, then 1 s); never forced while it runs
    assert ("MODIFIED", LOST_POD_GRACE_S, "Running") in terminating, kinds
    assert {grace for _, grace, phase in terminating if phase == "Running"} <= {
        LOST_POD_GRACE_S, launcher.options.termination_grace_s}, kinds
    assert ("MODIFIED", LOST_POD_GRACE_S, "Failed") in kinds, kinds  # the pod GC marks it Failed (no kubelet did)
    assert kinds[-1] == ("DELETED", 0, "Failed"), kinds  # then deletes it
    assert kube.rest().list("batch/v1", "jobs", NAMESPACE) == []

    # the next attempt, without the lost node: admitted within the team's quota, on the spare
    second = placed(tiny_job(JOB, ["--steps", "3"]), kube.root / "home", run=RUN, attempt=1, cluster=cluster,
                    exclude=frozenset(reason.nodes))
    started = time.monotonic()
    handle1 = launcher.submit(*second.submit_args(), attempt=1)
    done = wait(kube, launcher, handle1, lambda s: s.finished, "the next attempt to complete on the spare")
    assert done.state == "succeeded", (done.message, time.monotonic() - started)
    assert sorted(done.nodes) == sorted(set(NODES_WITH_SPARE) - {lost}) and spare in done.nodes, done
