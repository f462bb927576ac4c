"""KubernetesLauncher against the emulated API server over HTTP (`tests/support/kube`), with the
real `kubernetes` client and, for the async poll and the Airflow path, the provider's hooks.

No node processes here: the tests register the Node objects and write pod statuses the way a
kubelet would (validated by the server like any write) and advance Volcano's controllers one
tick at a time — the launcher's waits (`sleep`) advance them too — so nothing depends on
timing. Pods that really run on simulated nodes are `tests/integration/launch/
test_kubernetes_emulated.py`. The retry policy is tested with `create_autospec` mocks that
raise real `ApiException`s (no server produces 429s on demand).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import create_autospec

import pytest
import urllib3
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse

from tests.support.kube import schemas
from tests.support.kube.control_plane import ControlPlane
from tests.support.kube.jobs import placed, tiny_job, wide_cluster
from tests.support.require import missing
from tests.unit.launch.launch_fixtures import gpu_job
from trainyard.plugins.launch.base import LaunchError
from trainyard.plugins.launch.fencing import LOST_POD_GRACE_S, OUT_OF_SERVICE_KEY, is_out_of_service
from trainyard.plugins.launch.manifests import KubernetesOptions, render_volcano_job
from trainyard.plugins.launch.volcano import KubernetesLauncher, retry_after_s
from trainyard.plugins.run.model import RunHandle

JOBS = ("batch.volcano.sh/v1alpha1", "jobs")
NODE_LABELS = {"topology.kubernetes.io/rack": "sim-rack", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "cpu"}


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    try:
        schemas.check_crds_present()
    except schemas.SchemaMissing as e:
        missing("schemas", str(e))
    logs = tmp_path / "logs"
    logs.mkdir()
    with ControlPlane(tmp_path / "kube", log_path=lambda pod, container: logs / f"{pod['metadata']['name']}.log") as p:
        for i in range(2):
            p.add_node(f"kube-sim-{i}", labels=NODE_LABELS, address=f"10.213.0.{10 + i}")
        p.rest.create("scheduling.volcano.sh/v1beta1", "queues", None, {  # the demo team's queue only
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "demo"},
            "spec": {"weight": 1, "reclaimable": True}})
        yield p


def launcher_for(plane: ControlPlane, records_dir: Path | None = None, **options: Any) -> KubernetesLauncher:
    def sleep(_: float) -> None:  # the world moves on while the launcher waits
        plane.finish_deletions()
        plane.tick()

    values = {"namespace": "trainyard", "rdma_resource": None, "shared_filesystem": True, **options}
    return KubernetesLauncher.from_kubeconfig(str(plane.kubeconfig), options=KubernetesOptions(**values),
                                              sleep=sleep, poll_interval_s=0, delete_timeout_s=5,
                                              records_dir=records_dir)


@pytest.fixture
def launcher(plane: ControlPlane) -> KubernetesLauncher:
    return launcher_for(plane)


def start(plane: ControlPlane, launcher: KubernetesLauncher, tmp_path: Path, *, name: str = "tiny",
          attempt: int = 0, run: str = "r-test", running: bool = True, gpus: int = 2,
          **kwargs: Any) -> tuple[RunHandle, list[str]]:
    parts = placed(tiny_job(name, ["--steps", "3"], gpus=gpus), tmp_path / "home", run=run, attempt=attempt, **kwargs)
    handle = launcher.submit(*parts.submit_args(), attempt=attempt)
    plane.tick(2)  # PodGroup and pods, then the gang bound
    pods = [f"{handle.name}-worker-{i}" for i in range(2)]  # node-rank order at two pods
    if running:
        for pod in pods:
            plane.pod_running(pod)
        plane.tick()
    return handle, pods


def exits(*records: tuple[int, int]) -> str:
    """A termination message: `rank_exec`'s exits.jsonl lines (rank, exit code)."""
    return "\n".join(json.dumps({"rank": r, "restart": 0, "exit_code": c, "ended_at": 1000.0 + r}) for r, c in records)


# --- submit -------------------------------------------------------------------------------------


def test_submit_creates_the_rendered_job_and_a_retry_reattaches(plane: ControlPlane, launcher: KubernetesLauncher,
                                                                   tmp_path: Path) -> None:
    parts = placed(tiny_job("tiny", ["--steps", "3"]), tmp_path / "home")
    handle = launcher.submit(*parts.submit_args(), attempt=0)
    (stored,) = plane.rest.list(*JOBS, "trainyard")
    body = render_volcano_job(*parts.submit_args(), attempt=0, options=launcher.options)
    assert stored["spec"] == body["spec"] and stored["metadata"]["name"] == handle.name
    assert handle.uid == stored["metadata"]["uid"] and handle.nodes == ["kube-sim-0", "kube-sim-1"]
    again = launcher.submit(*parts.submit_args(), attempt=0)  # an Airflow retry of the launch task
    assert again.uid == handle.uid and len(plane.rest.list(*JOBS, "trainyard")) == 1
    assert launcher.submit(*parts.submit_args(), attempt=0, uid=handle.uid).uid == handle.uid
    with pytest.raises(LaunchError, match=r"another object .* refusing to adopt it by name"):
        launcher.submit(*parts.submit_args(), attempt=0, uid="0000-another-uid")
    assert RunHandle.model_validate_json(handle.model_dump_json()) == handle


def test_a_store_endpoint_the_pods_cannot_reach_is_refused_before_anything_is_made(
        plane: ControlPlane, tmp_path: Path) -> None:
    """The pods' S3 endpoint (`pod_s3_endpoint_url`, by default the control plane's own) on
    localhost names the pod itself: refused at submit, no Job made."""
    from trainyard.plugins.launch.cluster_settings import UnsafeForCluster

    local = launcher_for(plane, pod_s3_endpoint_url="http://127.0.0.1:9000")
    parts = placed(tiny_job("tiny", ["--steps", "3"]), tmp_path / "home")
    with pytest.raises(UnsafeForCluster, match=re.escape("TRAINYARD_S3_ENDPOINT_URL='http://127.0.0.1:9000'")):
        local.submit(*parts.submit_args(), attempt=0)
    assert plane.rest.list(*JOBS, "trainyard") == []


def test_a_handle_names_the_control_planes_folder_for_the_attempts_records(plane: ControlPlane,
                                                                           tmp_path: Path) -> None:
    """Why the control plane stopped a gang (`stop-reason.json`, `watching.stop_gang`) is kept
    there, so `classify` reads a node loss or a hang on Kubernetes as it does locally (the e2e
    node-loss test); the pods never see it. Without a records folder the handle names none."""
    assert start(plane, launcher_for(plane), tmp_path, run="r-none")[0].run_dir == ""
    handle, _ = start(plane, launcher_for(plane, records_dir=tmp_path / "runs"), tmp_path, run="r-records")
    assert handle.run_dir == str(tmp_path / "runs" / "tiny" / "r-records" / "0") and Path(handle.run_dir).is_dir()


def test_another_attempts_job_is_refused_until_stopped(plane: ControlPlane, launcher: KubernetesLauncher,
                                                        tmp_path: Path) -> None:
    first, _ = start(plane, launcher, tmp_path)
    parts = placed(tiny_job("tiny", ["--steps", "3"]), tmp_path / "home", attempt=1)
    with pytest.raises(LaunchError, match=r"already exists for attempt 0 \(Running\); stop it before launching attempt 1"):
        launcher.submit(*parts.submit_args(), attempt=1)
    assert launcher.stop(first, grace_s=1).state == "stopped"
    second = launcher.submit(*parts.submit_args(), attempt=1)
    assert second.name == first.name and second.uid != first.uid


def test_an_ended_attempts_job_is_replaced_by_the_next_attempts(plane: ControlPlane, launcher: KubernetesLauncher,
                                                                 tmp_path: Path) -> None:
    """A failed attempt's Job stays (its pods' exits are the evidence) until the next attempt of
    the same run replaces it; a Job of the same attempt or of a later one is never deleted."""
    first, pods = start(plane, launcher, tmp_path)
    plane.pod_exited(pods[0], 0, message=exits((0, 0)))
    plane.pod_exited(pods[1], 1, message=exits((1, 1)))
    plane.tick(2)
    assert launcher.poll(first).state == "failed"
    parts = placed(tiny_job("tiny", ["--steps", "3"]), tmp_path / "home", attempt=1)
    second = launcher.submit(*parts.submit_args(), attempt=1)
    (job,) = plane.rest.list(*JOBS, "trainyard")
    assert (second.name, second.uid) == (first.name, job["metadata"]["uid"]) and second.uid != first.uid
    assert job["metadata"]["labels"]["trainyard.io/attempt"] == "1"
    stale = placed(tiny_job("tiny", ["--steps", "3"]), tmp_path / "home", attempt=0)
    with pytest.raises(LaunchError, match="already exists for attempt 1"):
        launcher.submit(*stale.submit_args(), attempt=0)  # a stale retry of attempt 0 deletes nothing
    assert plane.rest.list(*JOBS, "trainyard")[0]["metadata"]["uid"] == second.uid


def test_the_volcano_webhook_refuses_a_missing_queue(plane: ControlPlane, launcher: KubernetesLauncher,
                                                     tmp_path: Path) -> None:
    parts = placed(tiny_job("tiny", ["--steps", "3"], team="research"), tmp_path / "home")
    with pytest.raises(LaunchError, match=r'400 .*unable to find job queue: queues.scheduling.volcano.sh "research"'):
        launcher.submit(*parts.submit_args(), attempt=0)


# --- poll ---------------------------------------------------------------------------------------


def test_a_completed_run_reports_every_rank(plane: ControlPlane, launcher: KubernetesLauncher, tmp_path: Path) -> None:
    handle, pods = start(plane, launcher, tmp_path)
    running = launcher.poll(handle)
    assert running.state == "running" and "Volcano phase Running (2 running)" in running.message
    assert [(a.pod, a.node, a.node_ready, a.alive) for a in running.agents] == [
        (pods[0], "kube-sim-0", True, True), (pods[1], "kube-sim-1", True, True)]
    for rank, pod in enumerate(pods):
        plane.pod_exited(pod, 0, message=exits((rank, 0)))
    plane.tick()
    done = launcher.poll(handle)
    assert (done.state, done.exit_code, done.failed_rank, done.processes_alive) == ("succeeded", 0, None, False)
    assert [(r.rank, r.node, r.exit_code, r.outcome) for r in done.ranks] == [
        (0, "kube-sim-0", 0, "completed"), (1, "kube-sim-1", 0, "completed")]


def test_a_rank_that_diverged_is_named_with_its_own_code(plane: ControlPlane, launcher: KubernetesLauncher,
                                                          tmp_path: Path) -> None:
    handle, pods = start(plane, launcher, tmp_path)
    plane.pod_exited(pods[1], 1, message=exits((1, 42)))  # torchrun exits 1; the rank exited 42
    plane.tick()
    plane.finish_deletions()  # Volcano's AbortJob deleted the pod still running
    plane.tick()
    status = launcher.poll(handle)
    assert status.state == "failed" and "Volcano phase Aborted" in status.message
    assert (status.failed_rank, status.exit_code) == (1, 42)
    (rank,) = status.ranks  # the failed pod is kept (PodRetainPhaseSoft), the other one is gone
    assert (rank.rank, rank.node, rank.exit_code, rank.outcome) == (1, "kube-sim-1", 42, "diverged")
    assert status.agents[0].exit_code == 1 and status.agents[0].reason == "Error"


def test_an_oom_killed_pod_says_so_for_its_ranks(plane: ControlPlane, launcher: KubernetesLauncher,
                                                 tmp_path: Path) -> None:
    handle, pods = start(plane, launcher, tmp_path)
    plane.pod_exited(pods[0], 137, reason="OOMKilled")  # the kernel killed the container: no rank record
    plane.tick()
    status = launcher.poll(handle)
    agent = next(a for a in status.agents if a.pod == pods[0])
    assert (agent.exit_code, agent.reason) == (137, "OOMKilled")
    rank = next(r for r in status.ranks if r.rank == 0)
    assert (rank.exit_code, rank.outcome) == (-9, "OOMKilled")
    assert status.failed_rank == 0 and status.exit_code == -9


def test_unschedulable_is_pending_with_the_numbers_then_a_launch_failure(plane: ControlPlane, tmp_path: Path) -> None:
    patient, hasty = launcher_for(plane), launcher_for(plane, start_timeout_s=0)
    wide = wide_cluster(2)  # the planner believes in 2 "GPUs" a node; each node has 1 CPU
    handle, _ = start(plane, patient, tmp_path, running=False, cluster=wide, gpus=4)
    status = patient.poll(handle)
    assert status.state == "pending"
    assert "0/2 nodes are available: 2 Insufficient cpu" in status.message
    assert "requests cpu: 2; the most any node has free is cpu: 1" in status.message
    assert {a.reason for a in status.agents} == {"Unschedulable"}
    late, _ = start(plane, hasty, tmp_path, run="r-late", running=False, cluster=wide, gpus=4)
    failed = hasty.poll(late)
    assert failed.state == "failed" and failed.message.startswith("launch failed: the pods of trainyard/")
    assert "did not start in 0 s: Unschedulable: 2/2 tasks in gang unschedulable" in failed.message
    assert "Insufficient cpu" in failed.message


def test_an_image_that_cannot_be_pulled_fails_the_launch_past_the_deadline(plane: ControlPlane,
                                                                           tmp_path: Path) -> None:
    launcher = launcher_for(plane, start_timeout_s=0)
    handle, pods = start(plane, launcher, tmp_path, running=False)
    for pod in pods:
        plane.pod_waiting(pod, "ImagePullBackOff", 'Back-off pulling image "registry.example.com/trainyard/tiny:1"')
    status = launcher.poll(handle)
    assert status.state == "failed"
    assert f"pod {pods[0]}: ImagePullBackOff: Back-off pulling image" in status.message


def test_a_node_not_ready_is_reported_and_stop_fences_it(plane: ControlPlane, launcher: KubernetesLauncher,
                                                                     tmp_path: Path) -> None:
    handle, pods = start(plane, launcher, tmp_path)
    plane.set_node_ready("kube-sim-1", False)
    status = launcher.poll(handle)
    assert "node(s) not Ready: kube-sim-1" in status.message
    lost = next(a for a in status.agents if a.pod == pods[1])
    assert (lost.node_ready, lost.reason) == (False, "NodeNotReady")
    stopped = launcher.stop(handle, grace_s=5)
    assert stopped.state == "stopped" and f"no grace: pods on lost nodes: {pods[1]}" in stopped.message
    assert not stopped.processes_alive and plane.rest.list("v1", "pods", "trainyard") == []
    # the node Kubernetes marks NotReady held a pod of the gang: fenced, so the pod GC ends it
    assert f"tainted kube-sim-1 {OUT_OF_SERVICE_KEY}" in stopped.message
    assert [is_out_of_service(plane.rest.get("v1", "nodes", None, f"kube-sim-{i}")) for i in (0, 1)] == [False, True]


def test_poll_of_a_vanished_or_replaced_job_is_stopped(plane: ControlPlane, launcher: KubernetesLauncher,
                                                       tmp_path: Path) -> None:
    """Nothing of the attempt runs once its Job is gone: the watchers end (they waited for good
    while this said `unknown`)."""
    handle, _ = start(plane, launcher, tmp_path)
    replaced = launcher.poll(handle.model_copy(update={"uid": "0000-older"}))
    assert (replaced.state, replaced.finished, replaced.processes_alive) == ("stopped", True, False)
    assert "expected 0000-older" in replaced.message
    launcher.stop(handle, grace_s=0)
    gone = launcher.poll(handle)
    assert (gone.state, gone.finished) == ("stopped", True) and "is gone" in gone.message


# --- stop, settle, logs -------------------------------------------------------------------------


def _deletion_graces(plane: ControlPlane, after_rv: int) -> dict[str, int | None]:
    """Pod → the grace its deletion was given (the first event that marks it deleted after `after_rv`)."""
    graces: dict[str, int | None] = {}
    for rv, _, event, obj in plane.server.store.history:
        if rv > after_rv and obj["kind"] == "Pod" and event in ("MODIFIED", "DELETED") \
                and obj["metadata"].get("deletionTimestamp"):
            graces.setdefault(obj["metadata"]["name"], obj["metadata"].get("deletionGracePeriodSeconds"))
    return graces


def test_stop_gives_the_grace_then_deletes_in_the_foreground(plane: ControlPlane, launcher: KubernetesLauncher,
                                                             tmp_path: Path) -> None:
    handle, pods = start(plane, launcher, tmp_path)
    seen_from = plane.server.store.rv
    stopped = launcher.stop(handle, grace_s=7)
    assert stopped.state == "stopped" and "deleted trainyard/" in stopped.message and not stopped.processes_alive
    history = [(event, obj) for rv, _, event, obj in plane.server.store.history if rv > seen_from]
    assert _deletion_graces(plane, seen_from) == dict.fromkeys(pods, 7)  # SIGTERM, then 7 s before SIGKILL
    job_finalizers = [obj["metadata"].get("finalizers") for event, obj in history
                      if obj["kind"] == "Job" and event == "MODIFIED"]
    assert ["foregroundDeletion"] in job_finalizers  # the Job waited for its pods
    assert plane.rest.list(*JOBS, "trainyard") == [] and plane.rest.list("v1", "pods", "trainyard") == []
    assert launcher.stop(handle).message.endswith("was already gone")


def test_stop_gives_no_grace_once_the_health_watch_lost_a_node_before_kubernetes_did(
        plane: ControlPlane, launcher: KubernetesLauncher, tmp_path: Path) -> None:
    """The node is still Ready to Kubernetes (its node controller waits 50 s), but its agent
    is gone: without that pod's ranks the other pod's emergency checkpoint cannot complete — the
    healthy node's pod is deleted at once; the lost node's pod gracefully, never forced (its
    kubelet cannot confirm: it stays Terminating until Kubernetes' own verdict and the
    out-of-service taint end it), and a node Kubernetes still sees Ready is not tainted."""
    handle, pods = start(plane, launcher, tmp_path)
    seen_from = plane.server.store.rv
    stopped = launcher.stop(handle, grace_s=7, lost_nodes=["kube-sim-1"])
    assert stopped.state == "stopped" and f"no grace: pods on lost nodes: {pods[1]}" in stopped.message
    graces = _deletion_graces(plane, seen_from)
    assert graces == {pods[0]: 0, pods[1]: LOST_POD_GRACE_S}, graces
    assert not stopped.processes_alive and plane.rest.list("v1", "pods", "trainyard") == []
    assert "tainted" not in stopped.message and not is_out_of_service(plane.rest.get("v1", "nodes", None, "kube-sim-1"))


def test_without_fencing_a_lost_nodes_pod_is_forced_away_and_no_node_is_tainted(plane: ControlPlane,
                                                                                tmp_path: Path) -> None:
    """The administrator's opt-out (`fence_lost_nodes=False`): the old forced deletion (grace 0)."""
    launcher = launcher_for(plane, fence_lost_nodes=False)
    handle, pods = start(plane, launcher, tmp_path)
    plane.set_node_ready("kube-sim-1", False)
    seen_from = plane.server.store.rv
    stopped = launcher.stop(handle, grace_s=7)
    assert _deletion_graces(plane, seen_from) == dict.fromkeys(pods, 0)
    assert not stopped.processes_alive and "tainted" not in stopped.message
    assert not is_out_of_service(plane.rest.get("v1", "nodes", None, "kube-sim-1"))


def test_a_stale_handle_never_deletes_a_newer_attempts_job(plane: ControlPlane, launcher: KubernetesLauncher,
                                                           tmp_path: Path) -> None:
    old, _ = start(plane, launcher, tmp_path)
    launcher.stop(old, grace_s=0)
    new, _ = start(plane, launcher, tmp_path, attempt=1)
    assert "another object now" in launcher.stop(old).message
    (job,) = plane.rest.list(*JOBS, "trainyard")
    assert job["metadata"]["uid"] == new.uid and not job["metadata"].get("deletionTimestamp")


def test_settle_keeps_the_verdict_and_cleans_up_what_lingers(plane: ControlPlane, launcher: KubernetesLauncher,
                                                             tmp_path: Path) -> None:
    handle, pods = start(plane, launcher, tmp_path)
    plane.pod_exited(pods[0], 1, message=exits((0, 1)))
    plane.tick()
    failed = launcher.poll(handle)
    assert failed.state == "running"  # Aborting: the other pod is still being stopped
    plane.finish_deletions()
    plane.tick()
    settled = launcher.settle(handle)
    assert settled.state == "failed" and settled.failed_rank == 0
    lingering = settled.model_copy(update={"processes_alive": True})
    cleaned = launcher.settle(handle, lingering)
    assert cleaned.state == "failed" and "cleaned up: deleted trainyard/" in cleaned.message
    assert plane.rest.list(*JOBS, "trainyard") == []


def test_settle_removes_a_job_its_queue_evicted(plane: ControlPlane, launcher: KubernetesLauncher,
                                                tmp_path: Path) -> None:
    """Kueue would admit a suspended, evicted Job again by itself, beside the next attempt."""
    from trainyard.plugins.run.model import RunStatus

    handle, pods = start(plane, launcher, tmp_path)
    for pod in pods:
        plane.pod_exited(pod, 43, message=exits((0, 43)))
    plane.tick()
    cause = "Preempted (InClusterQueue): Preempted to accommodate a workload (UID: u) due to prioritization"
    evicted = RunStatus(state="failed", evicted=cause, message=f"Kueue evicted the gang: {cause}")
    cleaned = launcher.settle(handle, evicted)
    assert cleaned.evicted == cause and "cleaned up: deleted trainyard/" in cleaned.message
    assert plane.rest.list(*JOBS, "trainyard") == []


def test_logs_read_the_pod_of_the_rank(plane: ControlPlane, launcher: KubernetesLauncher, tmp_path: Path) -> None:
    handle, pods = start(plane, launcher, tmp_path)
    (tmp_path / "logs" / f"{pods[1]}.log").write_text("".join(f"step {i}\n" for i in range(1, 6)))
    assert launcher.logs(handle, rank=1, tail=2) == "step 4\nstep 5\n"
    assert f"==> {pods[0]} <==\n(pod {pods[0]}: container \"trainer\"" in launcher.logs(handle)
    with pytest.raises(ValueError, match="rank 2 is outside the job's world size 2"):
        launcher.logs(handle, rank=2)


def test_the_inventory_comes_from_the_nodes(plane: ControlPlane, launcher: KubernetesLauncher) -> None:
    cluster = launcher.cluster("kube-sim")
    assert [(n.name, n.rack, n.gpu_type, n.gpus, n.healthy) for n in cluster.nodes] == [
        ("kube-sim-0", "sim-rack", "cpu", 1, True), ("kube-sim-1", "sim-rack", "cpu", 1, True)]


# --- through the provider's hooks (the Airflow path) ----------------------------------------------


def test_the_providers_hooks_drive_the_launcher(plane: ControlPlane, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.operators.kubernetes_clients import kubernetes_launcher, poll_with_async_hook

    monkeypatch.setenv("AIRFLOW_CONN_KUBE_SIM", plane.connection_json)
    launcher = kubernetes_launcher(KubernetesOptions(namespace="trainyard", rdma_resource=None,
                                                     shared_filesystem=True), conn_id="kube_sim")
    handle, pods = start(plane, launcher, tmp_path)  # through KubernetesHook's sync clients
    sync = launcher.poll(handle)
    async_ = asyncio.run(poll_with_async_hook(handle, conn_id="kube_sim"))  # AsyncKubernetesHook
    assert async_.model_dump(exclude={"updated_at"}) == sync.model_dump(exclude={"updated_at"})
    assert async_.state == "running" and [a.pod for a in async_.agents] == pods


# --- the retry policy (mocks: no server answers 429 on demand) ----------------------------------


def api_error(status: int, headers: dict[str, str] | None = None) -> ApiException:
    response = urllib3.HTTPResponse(body=b'{"kind":"Status"}', status=status, headers=headers or {},
                                    reason={404: "Not Found", 409: "Conflict", 429: "Too Many Requests"}.get(status, "x"))
    return ApiException(http_resp=RESTResponse(response))


@pytest.fixture
def mocked() -> tuple[KubernetesLauncher, Any, list[float]]:
    api = create_autospec(CustomObjectsApi, instance=True)
    sleeps: list[float] = []
    return KubernetesLauncher(api, sleep=sleeps.append, attempts=4, max_wait_s=30), api, sleeps


def test_transient_errors_are_retried_honouring_retry_after(mocked: tuple[KubernetesLauncher, Any, list[float]]) -> None:
    launcher, api, sleeps = mocked
    job, plan, placement, env = gpu_job()
    body = render_volcano_job(job, plan, placement, env, attempt=2)
    api.create_namespaced_custom_object.side_effect = [
        api_error(429, {"Retry-After": "7"}), api_error(503), {**body, "metadata": {**body["metadata"], "uid": "u1"}}]
    assert launcher.submit(job, plan, placement, env, attempt=2).uid == "u1"
    assert api.create_namespaced_custom_object.call_count == 3
    assert sleeps[0] == 7.0 and 0 < sleeps[1] <= 30


def test_permanent_errors_fail_at_once_and_retries_give_up(mocked: tuple[KubernetesLauncher, Any, list[float]]) -> None:
    launcher, api, sleeps = mocked
    job, plan, placement, env = gpu_job()
    api.create_namespaced_custom_object.side_effect = api_error(403)
    with pytest.raises(LaunchError, match=r"cannot create Volcano Job team-foundation/gpt-200b-[0-9a-f]{6}: 403"):
        launcher.submit(job, plan, placement, env, attempt=2)
    assert api.create_namespaced_custom_object.call_count == 1 and sleeps == []
    api.create_namespaced_custom_object.side_effect = api_error(500)
    with pytest.raises(LaunchError, match=": 500"):
        launcher.submit(job, plan, placement, env, attempt=2)
    assert api.create_namespaced_custom_object.call_count == 5 and len(sleeps) == 3


def test_retry_after_accepts_an_http_date() -> None:
    assert retry_after_s(api_error(429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
    assert retry_after_s(api_error(429, {"retry-after": "12"})) == 12.0
    assert retry_after_s(api_error(503)) is None


def test_a_local_handle_is_refused(mocked: tuple[KubernetesLauncher, Any, list[float]]) -> None:
    with pytest.raises(ValueError, match="cannot use a 'local' handle"):
        mocked[0].poll(RunHandle(kind="local", job="j", attempt=0, world_size=1))


def test_both_launchers_meet_the_protocol_settle_included(mocked: tuple[KubernetesLauncher, Any, list[float]],
                                                          tmp_path: Path) -> None:
    from trainyard.plugins.launch.base import Launcher
    from trainyard.plugins.launch.local import LocalLauncher

    assert isinstance(mocked[0], Launcher) and isinstance(LocalLauncher(tmp_path), Launcher)
    assert "settle" in Launcher.__dict__


def test_the_attempts_storage_secret_is_made_after_its_job_and_owned_by_it() -> None:
    from kubernetes.client import CoreV1Api

    from trainyard.config.worker_env import StorageCredentials

    job, plan, placement, env = gpu_job()
    env = env.model_copy(update={"storage_credentials": StorageCredentials(
        access_key_id="ASIARUN", secret_access_key="s", session_token="t")})
    api, core = create_autospec(CustomObjectsApi, instance=True), create_autospec(CoreV1Api, instance=True)
    api.create_namespaced_custom_object.side_effect = lambda *a, **k: {**a[4], "metadata": {
        **a[4]["metadata"], "uid": "job-uid"}}
    handle = KubernetesLauncher(api, core_api=core).submit(job, plan, placement, env, attempt=2)
    (namespace, secret), _ = core.create_namespaced_secret.call_args
    assert namespace == handle.namespace and secret["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    assert secret["metadata"]["ownerReferences"][0]["name"] == handle.name
    core.create_namespaced_secret.side_effect = ApiException(status=409, reason="AlreadyExists")
    KubernetesLauncher(api, core_api=core).submit(job, plan, placement, env, attempt=2)  # a retried launch
    with pytest.raises(LaunchError, match="core API"):  # keys and no way to hand them over: refused up front
        KubernetesLauncher(create_autospec(CustomObjectsApi, instance=True)).submit(job, plan, placement, env,
                                                                                    attempt=2)
