"""The Kueue path's gang (`kueue_job.py`) and its reading (`kube_status.py` on a batch/v1 Job):
one suspended Indexed Job in the team's LocalQueue, whose pods find each other by their host
names, and a status in Kueue's own words while it waits."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.unit.launch.launch_fixtures import gpu_job, validate_k8s
from trainyard.config.teams import load_teams
from trainyard.plugins.launch.kube_status import (
    Observed,
    job_phase,
    owned_pods,
    reads_workload,
    run_status,
)
from trainyard.plugins.launch.kueue_job import render_kueue_job
from trainyard.plugins.launch.manifests import KubernetesOptions, render_all
from trainyard.plugins.launch.rbac import render_rbac
from trainyard.plugins.run.model import RunHandle


def test_the_gang_is_one_suspended_indexed_job_in_its_teams_queue() -> None:
    job, plan, placement, env = gpu_job()
    body, service = render_kueue_job(job, plan, placement, env, attempt=1)
    name, nodes = body["metadata"]["name"], len(placement.nodes)
    spec = body["spec"]
    assert (spec["suspend"], spec["completionMode"], spec["completions"], spec["parallelism"],
            spec["backoffLimit"]) == (True, "Indexed", nodes, nodes, 0)
    labels = body["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "training"
    assert labels["kueue.x-k8s.io/priority-class"] == f"trainyard-{job.metadata.priority}"
    assert body["metadata"]["namespace"] == f"team-{job.metadata.team}"
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == name and pod["schedulerName"] == "default-scheduler"
    validate_k8s({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod})
    command = pod["containers"][0]["command"]
    args = {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}
    assert args["--local-addr"] == f"{name}-$(JOB_COMPLETION_INDEX).{name}"  # its own DNS name
    assert args["--rdzv-endpoint"].startswith(f"{name}-0.{name}:")  # index 0 sorts first: node rank 0
    affinity = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert affinity["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == placement.node_names
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["name"] == name
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()


def test_a_gang_with_a_partial_last_node_is_refused_not_misrendered(tmp_path: Path) -> None:
    from tests.support.kube.jobs import placed, tiny_job, wide_cluster

    job, plan, placement, env = placed(tiny_job("odd", [], gpus=4), tmp_path, cluster=wide_cluster(2)).submit_args()
    first, last = placement.nodes
    odd = placement.model_copy(update={"nodes": [first, last.model_copy(update={"slots": last.slots - 1})]})
    with pytest.raises(ValueError, match="not one Indexed Job"):
        render_kueue_job(job, plan, odd, env, attempt=0)


def test_render_all_with_kueue_prints_kueues_objects_and_the_rules_it_needs() -> None:
    job, plan, placement, env = gpu_job()
    docs = render_all(job, plan, placement, env, load_teams(), attempt=0, total_gpus=256,
                      options=KubernetesOptions(queueing="kueue"))
    kinds = [d["kind"] for d in docs]
    assert {"ClusterQueue", "LocalQueue", "ResourceFlavor", "Service"} <= set(kinds) and "Queue" not in kinds
    assert docs[-1]["apiVersion"] == "batch/v1" and docs[-1]["kind"] == "Job"
    rules = {(r["apiGroups"][0], r["resources"][0]) for d in render_rbac("trainyard", queueing="kueue")
             if d["kind"] == "ClusterRole" for r in d["rules"]}
    assert ("batch", "jobs") in rules and ("kueue.x-k8s.io", "workloads") in rules
    assert ("batch.volcano.sh", "jobs") not in rules


def batch_job(**status: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns", "uid": "u1"},
            "spec": {"suspend": status.pop("suspend", False), "completions": 2, "template": {
                "metadata": {"annotations": {"trainyard.io/slots": "4"}}, "spec": {}}},
            "status": status}


def indexed_pod(index: int, suffix: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": f"j-{index}-{suffix}", "namespace": "ns", "uid": f"p{index}",
                         "ownerReferences": [{"uid": "u1"}]},
            "spec": {"nodeName": node, "hostname": f"j-{index}", "subdomain": "j"},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "trainer", "state": {"running": {"startedAt": "2026-12-07T08:00:00Z"}}}]}}


def test_a_batch_jobs_phase_in_volcanos_words() -> None:
    assert job_phase(batch_job(suspend=True)) == "Pending"
    assert job_phase(batch_job(active=2)) == "Running"
    assert job_phase(batch_job(conditions=[{"type": "Complete", "status": "True"}])) == "Completed"
    assert job_phase(batch_job(conditions=[{"type": "Failed", "status": "True"}])) == "Failed"


def test_pods_go_by_their_host_names_and_a_waiting_gang_says_kueues_reason() -> None:
    handle = RunHandle(kind="kubernetes", job="j", attempt=0, world_size=8, namespace="ns", name="j", uid="u1",
                       ranks_per_node=4, api_version="batch/v1", created_at=datetime.now(UTC))
    pods = owned_pods(handle, [indexed_pod(1, "zz9", "b"), indexed_pod(0, "aa1", "a")], "u1")
    status = run_status(handle, Observed(job=batch_job(active=2), pods=pods))
    assert [a.pod for a in status.agents] == ["j-0-aa1", "j-1-zz9"] and status.nodes == ["a", "b"]
    assert [r.rank for r in status.ranks if r.node == "b"] == [4, 5, 6, 7]
    workload = {"kind": "Workload", "status": {"conditions": [{
        "type": "QuotaReserved", "status": "False", "reason": "Pending",
        "message": "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu"}]}}
    waiting = run_status(handle, Observed(job=batch_job(suspend=True), group=workload))
    assert waiting.state == "pending" and "Kueue: pending: couldn't assign flavors" in waiting.message


def terminated_pod(index: int, code: int, *, deleting: bool = True) -> dict[str, Any]:
    pod = indexed_pod(index, f"x{index}", f"n{index}")
    pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": {
        "exitCode": code, "reason": "Error", "finishedAt": "2026-12-07T08:01:00Z"}}}]}
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2026-12-07T08:01:00Z"
    return pod


EVICTED = {"kind": "Workload", "status": {"conditions": [
    {"type": "Evicted", "status": "True", "reason": "Preempted",
     "message": "Preempted to accommodate a workload (UID: u2) due to reclamation within the cohort"},
    {"type": "Preempted", "status": "True", "reason": "InCohortReclamation", "message": "…"},
    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}]}}


def test_a_gang_kueue_evicted_is_over_once_its_pods_are_gone_with_kueues_cause() -> None:
    """Kueue suspends the Job and its pods go with their grace: `running` while a pod is left,
    then `failed` with the eviction as the cause — also once the Job failed by its backoff limit
    as the pods exited, and never a launch that did not start, however long the attempt ran."""
    handle = RunHandle(kind="kubernetes", job="j", attempt=0, world_size=8, namespace="ns", name="j", uid="u1",
                       ranks_per_node=4, api_version="batch/v1", created_at=datetime(2020, 1, 1, tzinfo=UTC))
    alive = indexed_pod(0, "x0", "n0")
    alive["metadata"]["deletionTimestamp"] = "2026-12-07T08:01:00Z"
    stopping = run_status(handle, Observed(job=batch_job(suspend=True, active=1), pods=[alive, terminated_pod(1, 43)],
                                           group=EVICTED))
    assert (stopping.state, stopping.processes_alive) == ("running", True), stopping
    assert stopping.message.startswith("Kueue evicted the gang: Preempted (InCohortReclamation): Preempted to "
                                       "accommodate") and "its pods are stopping" in stopping.message
    over = run_status(handle, Observed(job=batch_job(suspend=True), pods=[], group=EVICTED))
    assert (over.state, over.processes_alive, over.exit_code) == ("failed", False, None), over
    assert over.evicted.startswith("Preempted (InCohortReclamation)") and "launch failed" not in over.message
    failed = batch_job(suspend=True, failed=2, conditions=[{"type": "Failed", "status": "True",
                                                           "reason": "BackoffLimitExceeded"}])
    ended = run_status(handle, Observed(job=failed, pods=[terminated_pod(0, 43), terminated_pod(1, 43)],
                                        group=EVICTED))
    assert (ended.state, ended.exit_code, ended.evicted) == ("failed", 43, over.evicted), ended
    # without the Workload's eviction, the same Job is an ordinary failure
    assert not run_status(handle, Observed(job=failed, pods=[terminated_pod(0, 43)])).evicted


def test_a_gang_waiting_in_its_queue_never_times_out_its_start_clock_runs_from_admission() -> None:
    """Kueue may hold a gang for hours behind a long job: that is not a launch that failed to
    start. Once admitted, pods that cannot start fail the launch past the start timeout."""
    long_ago = datetime(2020, 1, 1, tzinfo=UTC)
    handle = RunHandle(kind="kubernetes", job="j", attempt=0, world_size=8, namespace="ns", name="j", uid="u1",
                       ranks_per_node=4, api_version="batch/v1", created_at=long_ago)
    queued = {"kind": "Workload", "status": {"conditions": [{
        "type": "QuotaReserved", "status": "False", "reason": "Pending",
        "message": "couldn't assign flavors to pod set main: insufficient unused quota for cpu"}]}}
    waiting = run_status(handle, Observed(job=batch_job(suspend=True), group=queued))
    assert waiting.state == "pending" and "insufficient unused quota" in waiting.message, waiting
    stuck = indexed_pod(0, "x0", "n0")
    stuck["spec"].pop("nodeName")
    stuck["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                           "reason": "Unschedulable", "message": "0/2 nodes"}]}

    def admitted(when: datetime) -> dict[str, Any]:
        return {"kind": "Workload", "status": {"conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted",
             "lastTransitionTime": when.isoformat().replace("+00:00", "Z")}]}}

    fresh = run_status(handle, Observed(job=batch_job(active=1), pods=[stuck], group=admitted(datetime.now(UTC))))
    assert fresh.state == "running" and "not started: pod j-0-x0: 0/2 nodes" in fresh.message, fresh
    late = run_status(handle, Observed(job=batch_job(active=1), pods=[stuck], group=admitted(long_ago)))
    assert late.state == "failed" and late.message.startswith("launch failed: the pods of ns/j did not start"), late


def test_the_workload_is_read_whenever_the_batch_job_is_not_plainly_running() -> None:
    running = indexed_pod(0, "x0", "n0")
    assert not reads_workload(batch_job(active=2), [running])
    assert reads_workload(batch_job(suspend=True, active=2), [running])  # Kueue suspended it
    assert reads_workload(batch_job(active=2), [running, terminated_pod(1, 43)])  # a pod is being deleted
    assert reads_workload(batch_job(conditions=[{"type": "Failed", "status": "True"}]), [])
    assert not reads_workload({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "status": {}}, [])


@pytest.mark.parametrize("gpu", [True, False])
def test_every_container_requests_only_what_the_teams_queues_cover(gpu: bool, tmp_path: Path) -> None:
    """Kueue leaves a workload unadmitted when a pod requests a resource its ClusterQueue does
    not cover; init containers count (the `source.git` fetch asked for cpu and memory)."""
    from tests.support.kube.jobs import placed, tiny_job
    from trainyard.plugins.launch.kueue_queues import covered_resources

    source = {"entrypoint": "train.py", "git": {"repo": "https://example.com/acme/train.git",
                                                 "commit": "0123456789abcdef0123456789abcdef01234567"}}
    if gpu:
        job, plan, placement, env = gpu_job(source=source)
    else:
        job, plan, placement, env = placed(tiny_job("src", []), tmp_path).submit_args()
        job = job.model_copy(update={"spec": job.spec.model_copy(update={
            "source": type(job.spec.source).model_validate(source)})})
    options = KubernetesOptions(rdma_resource="rdma/hca" if gpu else None)
    body, _ = render_kueue_job(job, plan, placement, env, attempt=0, options=options)
    pod = body["spec"]["template"]["spec"]
    assert pod["initContainers"], "the source fetch runs first"
    covered = set(covered_resources(cpu_cluster=not gpu, rdma_resource=options.rdma_resource))
    for container in [*pod["initContainers"], *pod["containers"]]:
        resources = container.get("resources") or {}
        asked = set(resources.get("requests") or {}) | set(resources.get("limits") or {})
        assert asked <= covered, (container["name"], asked - covered)
