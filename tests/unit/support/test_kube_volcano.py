"""The harness's minimal Volcano: gang scheduling (all of a PodGroup's pods or none), the
scheduler's reasons with the numbers, and the Job's phase from its pods and policies. The
controllers advance one tick at a time; pod statuses are written as a kubelet would."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube import schemas
from tests.support.kube.control_plane import ControlPlane
from tests.support.require import missing

NS = "trainyard"
JOBS = ("batch.volcano.sh/v1alpha1", "jobs")


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    try:
        schemas.check_crds_present()
    except schemas.SchemaMissing as e:
        missing("schemas", str(e))
    with ControlPlane(tmp_path) as p:
        yield p


def job(name: str, replicas: int = 2, cpu: str = "1", policies: list[dict[str, str]] | None = None) -> dict[str, Any]:
    container = {"name": "trainer", "image": "i", "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name, "namespace": NS},
            "spec": {"minAvailable": replicas, "schedulerName": "volcano", "queue": "default",
                     "policies": policies or [{"event": "PodFailed", "action": "AbortJob"}],
                     "tasks": [{"name": "worker", "replicas": replicas, "template": {
                         "metadata": {"labels": {"app": name}},
                         "spec": {"restartPolicy": "Never", "containers": [container]}}}]}}


def pods(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in plane.rest.list("v1", "pods", NS)}


def phase(plane: ControlPlane, name: str) -> str:
    return plane.rest.get(*JOBS, NS, name)["status"]["state"]["phase"]


def test_a_gang_that_does_not_fit_whole_binds_no_pod_and_says_why(plane: ControlPlane) -> None:
    plane.add_node("n0", cpu="1")
    plane.add_node("n1", cpu="500m")
    plane.rest.create(*JOBS, NS, job("gang"))
    plane.tick(2)
    members = pods(plane)
    assert sorted(members) == ["gang-worker-0", "gang-worker-1"]
    assert all(not p["spec"].get("nodeName") for p in members.values())  # n0 could take one: none goes
    (group,) = plane.rest.list("scheduling.volcano.sh/v1beta1", "podgroups", NS)
    (condition,) = group["status"]["conditions"]
    assert condition["type"] == "Unschedulable" and condition["status"] == "True"
    assert condition["message"] == (
        "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable; 0/2 nodes are "
        "available: 2 Insufficient cpu. Pod gang-worker-1 requests cpu: 1; the most any node has free is "
        "cpu: 0.5 (1 of 2 pods of the gang would fit)")
    events = plane.rest.list("v1", "events", NS)
    assert {e["reason"] for e in events} >= {"Unschedulable", "FailedScheduling"}
    plane.rest.patch("v1", "nodes", None, "n1", {"status": {"allocatable": {"cpu": "1", "memory": "4Gi", "pods": "110"}}},
                     status=True)
    plane.tick()
    bound = {p["spec"].get("nodeName") for p in pods(plane).values()}
    assert bound == {"n0", "n1"}  # both at once, once both fit


def test_the_job_runs_when_its_pods_run_and_completes_when_all_succeed(plane: ControlPlane) -> None:
    for node in ("n0", "n1"):
        plane.add_node(node)
    plane.rest.create(*JOBS, NS, job("ok"))
    plane.tick(2)
    assert phase(plane, "ok") == "Pending"
    for name in pods(plane):
        plane.pod_running(name)
    plane.tick()
    assert phase(plane, "ok") == "Running"
    pod = next(iter(pods(plane).values()))
    assert pod["spec"]["hostname"] == pod["metadata"]["name"] and pod["spec"]["subdomain"] == "ok"
    assert {"name": "VC_TASK_INDEX", "value": "0"} in pod["spec"]["containers"][0]["env"]
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"].startswith("ok-")
    for name in pods(plane):
        plane.pod_exited(name, 0)
    plane.tick()
    status = plane.rest.get(*JOBS, NS, "ok")["status"]
    assert status["state"]["phase"] == "Completed" and status["succeeded"] == 2
    assert [c["status"] for c in status["conditions"]] == ["Pending", "Running", "Completed"]


def test_abort_job_on_pod_failed_keeps_the_failed_pod_and_stops_the_others(plane: ControlPlane) -> None:
    for node in ("n0", "n1"):
        plane.add_node(node)
    plane.rest.create(*JOBS, NS, job("abort"))
    plane.tick(2)
    for name in pods(plane):
        plane.pod_running(name)
    plane.tick()
    plane.pod_exited("abort-worker-1", 3)
    plane.tick()
    state = plane.rest.get(*JOBS, NS, "abort")["status"]["state"]
    assert state["phase"] == "Aborting" and state["reason"] == "PodFailed"
    assert state["message"] == "pod abort-worker-1 on n1 failed: exit code 3 (Error)"
    assert pods(plane)["abort-worker-0"]["metadata"].get("deletionTimestamp")
    plane.finish_deletions()
    plane.tick()
    assert phase(plane, "abort") == "Aborted" and list(pods(plane)) == ["abort-worker-1"]


def test_the_webhook_refuses_what_volcano_refuses(plane: ControlPlane) -> None:
    from tests.support.kube.rest import RestError

    too_few = copy.deepcopy(job("few"))
    too_few["spec"]["minAvailable"] = 3
    with pytest.raises(RestError, match="'minAvailable' should not be greater than total replicas"):
        plane.rest.create(*JOBS, NS, too_few)
    elsewhere = job("q")
    elsewhere["spec"]["queue"] = "nobody"
    with pytest.raises(RestError, match=r'unable to find job queue: queues\.scheduling\.volcano\.sh "nobody"'):
        plane.rest.create(*JOBS, NS, elsewhere)


def test_two_gangs_in_one_tick_never_share_a_node_they_do_not_fit_together(plane: ControlPlane) -> None:
    for node in ("n0", "n1"):
        plane.add_node(node)
    plane.rest.create(*JOBS, NS, job("first"))
    plane.rest.create(*JOBS, NS, job("second"))
    plane.tick(2)
    bound = {name: p["spec"].get("nodeName") for name, p in pods(plane).items()}
    placed = [name for name, node in bound.items() if node]
    assert len(placed) == 2 and len({n.rsplit("-worker", 1)[0] for n in placed}) == 1  # one whole gang only
