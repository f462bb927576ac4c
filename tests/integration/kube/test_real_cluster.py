"""The simulated nodes on a real control plane (issue 55, Build 2): kube-apiserver,
kube-controller-manager, kube-scheduler and Kueue, built by `make kube-components`, with the
nodes' kubelets in network namespaces (`tests/support/kube/real_harness.py`).

What each test holds against the real components, not against text our emulator wrote:
- the nodes register under their own identity (one may not write another's Node), renew their
  Leases, and the node lifecycle controller lifts the not-ready taint they register with;
- Kueue admits an Indexed Job within its ClusterQueue's quota (created suspended by Kueue's
  webhook, unsuspended on admission), kube-scheduler puts one pod on each node, the init
  container runs before the main one, both as the securityContext's user and groups with the
  emptyDir owned by fsGroup, each finds its peer by `<hostname>.<subdomain>` once the peer has
  an address, and the Job controller marks the Job Complete;
- a Job over the quota stays suspended, with Kueue's own reason in its Workload's conditions;
- a graceful deletion is finished by the kubelet once the container ended on SIGTERM;
- a deleted Job's pods are deleted by kube-controller-manager's garbage collector;
- a container keeps only the capabilities its securityContext leaves it (`no_new_privs` too);
- a failed liveness probe restarts a container (restartPolicy Always), a readiness probe decides Ready.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kube import netns
from tests.support.kube.kubelet import NOT_READY_TAINT
from tests.support.kube.real_cluster import binaries_missing
from tests.support.kube.real_harness import RealKubeHarness
from tests.support.require import missing

pytestmark = pytest.mark.slow
NAMESPACE = "team-a"
QUEUE = "team-a-queue"
QUOTA_CPUS = 2
UID, GID, FS_GROUP = 1234, 2345, 3456
KUEUE = "kueue.x-k8s.io/v1beta2"
RUN_S = 120


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKubeHarness]:
    if binaries_missing():
        missing("kube", f"the Kubernetes binaries are not built: {', '.join(binaries_missing())}")
    try:
        harness = RealKubeHarness(tmp_path_factory.mktemp("kube")).__enter__()
    except netns.NetnsUnavailable as e:
        missing("netns", f"the simulated nodes need network namespaces: {e}")
    with harness:
        _queues(harness)
        yield harness


def _queues(kube: RealKubeHarness) -> None:
    """One flavor, a ClusterQueue with a cpu quota of `QUOTA_CPUS`, a LocalQueue in the team's
    namespace, and the headless Service the pods' subdomain names."""
    rest = kube.rest()
    rest.create("v1", "namespaces", None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    rest.create(KUEUE, "resourceflavors", None,
                {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}})
    rest.create(KUEUE, "clusterqueues", None, {
        "apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": "cluster-queue"},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": QUOTA_CPUS}]}]}]}})
    rest.create(KUEUE, "localqueues", NAMESPACE, {
        "apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": NAMESPACE},
        "spec": {"clusterQueue": "cluster-queue"}})
    rest.create("v1", "services", NAMESPACE, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "workers", "namespace": NAMESPACE},
        "spec": {"clusterIP": "None", "selector": {"app": "gang"}}})


MAIN = """set -e
test -f /mnt/init-done || { echo "the init container had not run"; exit 3; }
echo "uid=$(id -u)"; echo "gid=$(id -g)"; echo "groups=$(id -G)"
echo "init=$(cat /mnt/init-done)"
echo "volume=$(stat -c '%g %a' /mnt)"
touch /mnt/main-$JOB_COMPLETION_INDEX
echo "file=$(stat -c '%u %g' /mnt/main-$JOB_COMPLETION_INDEX)"
echo "index=$JOB_COMPLETION_INDEX"; echo "host=$(hostname)"
peer=gang-$((1 - JOB_COMPLETION_INDEX)).workers
for i in $(seq 150); do getent hosts $peer > /mnt/peer && break; sleep 0.2; done
echo "peer=$(cut -d' ' -f1 /mnt/peer)"
"""


def indexed_job(name: str, pods: int) -> dict[str, Any]:
    """An Indexed Job of `pods` pods, 1 cpu each, queued to Kueue, an init container, a
    securityContext and an emptyDir; no service-account token (a projected volume, which the
    simulated kubelet does not mount)."""
    mount = [{"name": "scratch", "mountPath": "/mnt"}]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
        "spec": {"completions": pods, "parallelism": pods, "completionMode": "Indexed", "backoffLimit": 0,
                 "template": {"metadata": {"labels": {"app": "gang"}}, "spec": {
                     "subdomain": "workers", "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "securityContext": {"runAsUser": UID, "runAsGroup": GID, "fsGroup": FS_GROUP,
                                         "runAsNonRoot": True},
                     "volumes": [{"name": "scratch", "emptyDir": {}}],
                     "initContainers": [{"name": "fetch", "image": "trainyard:test", "workingDir": "/",
                                         "command": ["sh", "-c", "id -u > /mnt/init-done"], "volumeMounts": mount}],
                     "containers": [{"name": "main", "image": "trainyard:test", "workingDir": "/",
                                     "command": ["sh", "-c", MAIN], "volumeMounts": mount,
                                     "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}]}}}}


def workload_of(kube: RealKubeHarness, job: dict[str, Any]) -> dict[str, Any] | None:
    uid = job["metadata"]["uid"]
    for workload in kube.rest().list(KUEUE, "workloads", NAMESPACE):
        if any(o["uid"] == uid for o in workload["metadata"].get("ownerReferences") or []):
            return workload
    return None


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def test_nodes_register_renew_leases_and_lose_the_not_ready_taint(kube: RealKubeHarness) -> None:
    rest = kube.rest()
    nodes = {n["metadata"]["name"]: n for n in rest.list("v1", "nodes")}
    assert set(nodes) == set(kube.node_names)
    for name, node in nodes.items():
        assert condition(node, "Ready")["status"] == "True"
        assert not [t for t in node["spec"].get("taints") or [] if t["key"] == NOT_READY_TAINT]
        log = (kube.nodes[name].root / "kubelet.log").read_text()
        assert f"registered, taints [{{'key': '{NOT_READY_TAINT}', 'effect': 'NoSchedule'}}]" in log
        lease = rest.get("coordination.k8s.io/v1", "leases", "kube-node-lease", name)
        assert lease["spec"]["holderIdentity"] == name
        assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]


def test_a_node_may_write_only_its_own_node(kube: RealKubeHarness) -> None:
    """Each kubelet has its own identity, judged by the Node authorizer and NodeRestriction."""
    from tests.support.kube.rest import RestError

    assert kube.cluster is not None
    first, second = kube.node_names[:2]
    as_first = kube.cluster.rest(kube.cluster.node_tokens[first])
    as_first.patch("v1", "nodes", None, first, {"metadata": {"annotations": {"trainyard.test/touched": "yes"}}})
    with pytest.raises(RestError) as refused:
        as_first.patch("v1", "nodes", None, second, {"metadata": {"annotations": {"trainyard.test/touched": "yes"}}})
    assert refused.value.status == 403, refused.value


def test_kueue_admits_an_indexed_job_scheduled_one_pod_per_node(kube: RealKubeHarness) -> None:
    rest = kube.rest()
    job = rest.create("batch/v1", "jobs", NAMESPACE, indexed_job("gang", pods=2))
    assert job["spec"]["suspend"] is True, "Kueue's webhook suspends a queued Job at creation"
    admitted = kube.wait_for(lambda: condition(workload_of(kube, job), "Admitted"), RUN_S, "Kueue's admission")
    assert admitted["status"] == "True"
    complete = kube.wait_for(lambda: condition(rest.get("batch/v1", "jobs", NAMESPACE, "gang"), "Complete"),
                             RUN_S, "the Job to complete")
    assert complete["status"] == "True"
    assert rest.get("batch/v1", "jobs", NAMESPACE, "gang")["spec"]["suspend"] is False

    pods = rest.list("v1", "pods", NAMESPACE, labels="batch.kubernetes.io/job-name=gang")
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(kube.node_names), "one pod per node"
    for pod in pods:
        assert pod["status"]["phase"] == "Succeeded"
        init = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
        main = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (init["exitCode"], main["exitCode"]) == (0, 0)
        assert init["finishedAt"] <= main["startedAt"]
        index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        log = (kube.pod_dir(pod["metadata"]["name"], NAMESPACE) / "main.log").read_text()
        facts = dict(re.findall(r"^(\w+)=(.*)$", log, re.M))
        assert facts["uid"] == str(UID) and facts["gid"] == str(GID), log
        assert str(FS_GROUP) in facts["groups"].split(), log
        assert facts["init"] == str(UID), "the init container ran as the pod's user"
        assert facts["volume"] == f"{FS_GROUP} 2777", "the emptyDir belongs to fsGroup, setgid"
        assert facts["file"] == f"{UID} {FS_GROUP}", "a file made in it gets fsGroup"
        assert (facts["index"], facts["host"]) == (index, f"gang-{index}"), "the Job controller's index and host name"
        peer = next(p for p in pods if p is not pod)
        assert facts["peer"] == peer["status"]["podIP"], "the peer's name resolves to its address"


def test_a_job_over_the_quota_stays_suspended_with_kueues_reason(kube: RealKubeHarness) -> None:
    rest = kube.rest()
    job = rest.create("batch/v1", "jobs", NAMESPACE, indexed_job("too-big", pods=QUOTA_CPUS + 1))
    reserved = kube.wait_for(lambda: condition(workload_of(kube, job), "QuotaReserved"), RUN_S,
                             "Kueue to judge the workload")
    print(f"Kueue: {reserved['type']}={reserved['status']} {reserved['reason']}: {reserved['message']}")
    assert (reserved["status"], reserved["reason"]) == ("False", "Pending")
    assert "cpu" in reserved["message"]
    assert rest.get("batch/v1", "jobs", NAMESPACE, "too-big")["spec"]["suspend"] is True
    assert not rest.list("v1", "pods", NAMESPACE, labels="batch.kubernetes.io/job-name=too-big")



WAIT_FOR_TERM = """trap 'echo "got SIGTERM"; exit 0' TERM
echo started
while true; do sleep 0.2; done
"""


def waiting_pod_spec() -> dict[str, Any]:
    """A container that runs until SIGTERM (PID 1 of its namespace: it handles the signal itself)."""
    return {"restartPolicy": "Never", "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 300,
            "containers": [{"name": "main", "image": "trainyard:test", "workingDir": "/",
                            "command": ["sh", "-c", WAIT_FOR_TERM]}]}


def gone(kube: RealKubeHarness, name: str) -> bool:
    from tests.support.kube.rest import RestError

    try:
        kube.rest().get("v1", "pods", NAMESPACE, name)
    except RestError as e:
        return e.status == 404
    return False


def test_a_graceful_deletion_is_confirmed_by_the_kubelet_once_the_container_ended(kube: RealKubeHarness) -> None:
    """The API server only marks the pod (deletionTimestamp, 300 s grace); the kubelet sends
    SIGTERM and, once the container has ended, removes the pod itself: nothing else in a real
    cluster would before the grace ran out."""
    rest = kube.rest()
    rest.create("v1", "pods", NAMESPACE, {"apiVersion": "v1", "kind": "Pod",
                                          "metadata": {"name": "graceful", "namespace": NAMESPACE},
                                          "spec": waiting_pod_spec()})
    kube.wait_for(lambda: rest.get("v1", "pods", NAMESPACE, "graceful")["status"].get("phase") == "Running", RUN_S,
                  "the pod to run")
    log = kube.pod_dir("graceful", NAMESPACE) / "main.log"
    rest.delete("v1", "pods", NAMESPACE, "graceful")
    marked = rest.get("v1", "pods", NAMESPACE, "graceful")["metadata"]
    assert marked["deletionTimestamp"] and marked["deletionGracePeriodSeconds"] == 300
    kube.wait_for(lambda: gone(kube, "graceful"), RUN_S, "the kubelet to confirm the deletion")
    assert "got SIGTERM" in log.read_text()


def test_a_deleted_jobs_pods_are_collected_by_the_garbage_collector(kube: RealKubeHarness) -> None:
    """No queue label: Kueue leaves the Job alone. Deleting the Job (background propagation, as
    kubectl does) leaves its pods to kube-controller-manager's garbage collector, which deletes
    them through their owner reference; the kubelet ends them."""
    rest = kube.rest()
    rest.create("batch/v1", "jobs", NAMESPACE, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "orphan", "namespace": NAMESPACE},
        "spec": {"backoffLimit": 0, "template": {"spec": waiting_pod_spec()}}})
    selector = "batch.kubernetes.io/job-name=orphan"
    pods = kube.wait_for(lambda: [p for p in rest.list("v1", "pods", NAMESPACE, labels=selector)
                                  if p["status"].get("phase") == "Running"], RUN_S, "the Job's pod to run")
    assert pods[0]["metadata"]["ownerReferences"][0]["kind"] == "Job"
    rest.delete("batch/v1", "jobs", NAMESPACE, "orphan", {"propagationPolicy": "Background"})
    kube.wait_for(lambda: not rest.list("v1", "pods", NAMESPACE, labels=selector), RUN_S,
                  "the garbage collector to delete the Job's pod and the kubelet to end it")
    log = (kube.nodes[pods[0]["spec"]["nodeName"]].root / "pods"
           / f"{NAMESPACE}_{pods[0]['metadata']['name']}_{pods[0]['metadata']['uid']}" / "main.log")
    assert "got SIGTERM" in log.read_text()


CAPS = """grep -E 'CapEff|NoNewPrivs' /proc/self/status
cat /mnt/secret > /dev/null && echo read || echo refused
"""


def test_a_container_runs_with_only_the_capabilities_its_security_context_leaves(kube: RealKubeHarness) -> None:
    """Root with every capability dropped cannot read another user's 0600 file; with
    `DAC_READ_SEARCH` added back (the node agent's rendering) it can; both without privilege
    escalation (`no_new_privs`)."""
    rest = kube.rest()
    mount = [{"name": "shared", "mountPath": "/mnt"}]

    def root(name: str, add: list[str]) -> dict[str, Any]:
        return {"name": name, "image": "trainyard:test", "workingDir": "/", "command": ["sh", "-c", CAPS],
                "volumeMounts": mount, "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": False,
                                                           "capabilities": {"drop": ["ALL"], "add": add}}}

    rest.create("v1", "pods", NAMESPACE, {"apiVersion": "v1", "kind": "Pod",
                                          "metadata": {"name": "caps", "namespace": NAMESPACE}, "spec": {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "volumes": [{"name": "shared", "emptyDir": {}}],
        "initContainers": [{"name": "owner", "image": "trainyard:test", "workingDir": "/", "volumeMounts": mount,
                            "securityContext": {"runAsUser": UID, "runAsGroup": GID},
                            "command": ["sh", "-c", "umask 077; echo s > /mnt/secret"]}],
        "containers": [root("none", []), root("search", ["DAC_READ_SEARCH"])]}})
    kube.wait_for(lambda: rest.get("v1", "pods", NAMESPACE, "caps")["status"].get("phase") == "Succeeded", RUN_S,
                  "the pod to finish")
    logs = {c: (kube.pod_dir("caps", NAMESPACE) / f"{c}.log").read_text() for c in ("none", "search")}
    said = {c: text.split() for c, text in logs.items()}  # cat's own complaint goes to the log too
    assert said["none"][:4] + said["none"][-1:] == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1", "refused"], logs
    assert said["search"] == ["CapEff:", "0000000000000004", "NoNewPrivs:", "1", "read"], logs


def test_a_failed_liveness_probe_restarts_the_container_and_readiness_decides_ready(kube: RealKubeHarness) -> None:
    """restartPolicy Always: a liveness probe that never connects gets the container killed
    (SIGTERM, SIGKILL after the pod's grace) and started again after the back-off; a readiness
    probe that never passes keeps the running pod not Ready."""
    rest = kube.rest()
    rest.create("v1", "pods", NAMESPACE, {"apiVersion": "v1", "kind": "Pod",
                                          "metadata": {"name": "probed", "namespace": NAMESPACE}, "spec": {
        "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "trainyard:test", "workingDir": "/",
                        "command": ["sh", "-c", "echo started; exec sleep 3600"],
                        "livenessProbe": {"tcpSocket": {"port": 1}, "periodSeconds": 1, "failureThreshold": 1},
                        "readinessProbe": {"httpGet": {"path": "/", "port": 2}, "periodSeconds": 1}}]}})

    def restarted() -> dict[str, Any] | None:
        pod = rest.get("v1", "pods", NAMESPACE, "probed")
        statuses = pod["status"].get("containerStatuses") or []
        return pod if statuses and statuses[0]["restartCount"] >= 1 and "running" in statuses[0]["state"] else None

    pod = kube.wait_for(restarted, RUN_S, "the container to be restarted")
    (status,) = pod["status"]["containerStatuses"]
    assert pod["status"]["phase"] == "Running" and condition(pod, "Ready")["status"] == "False", pod["status"]
    assert status["lastState"]["terminated"]["signal"] in (15, 9) and status["ready"] is False, status
    reasons = {e["reason"] for e in rest.list("v1", "events", NAMESPACE)
               if e["involvedObject"]["name"] == "probed"}
    assert {"Unhealthy", "Killing"} <= reasons, reasons
    assert (kube.pod_dir("probed", NAMESPACE) / "main.log").read_text().split() == ["started", "started"]
    rest.delete("v1", "pods", NAMESPACE, "probed", {"gracePeriodSeconds": 0})
