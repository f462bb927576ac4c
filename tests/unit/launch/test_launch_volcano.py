"""KubernetesLauncher against the `kubernetes` client's real interface.

No API server runs here, so the API objects are `create_autospec` mocks of the client's classes:
a call with a wrong name or signature fails as it would against the real client. Errors are
real `ApiException`s built from real HTTP responses (headers included).
"""

from __future__ import annotations

from typing import Any
from unittest.mock import call, create_autospec

import pytest
import urllib3
from kubernetes.client import (
    CoreV1Api,
    CustomObjectsApi,
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodList,
    V1PodSpec,
    V1PodStatus,
)
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse

from config.teams import load_teams
from plugins.launch.base import LaunchError
from plugins.launch.manifests import render_volcano_job, volcano_job_name
from plugins.launch.model import RunHandle
from plugins.launch.volcano import KubernetesLauncher, retry_after_s
from tests.unit.launch.launch_fixtures import gpu_job

JOB_API = ("batch.volcano.sh", "v1alpha1", "trainyard", "jobs")


def api_error(status: int, headers: dict[str, str] | None = None) -> ApiException:
    response = urllib3.HTTPResponse(body=b'{"kind":"Status"}', status=status, headers=headers or {},
                                    reason={404: "Not Found", 409: "Conflict", 429: "Too Many Requests"}.get(status, "x"))
    return ApiException(http_resp=RESTResponse(response))


@pytest.fixture
def api() -> Any:
    return create_autospec(CustomObjectsApi, instance=True)


@pytest.fixture
def core() -> Any:
    return create_autospec(CoreV1Api, instance=True)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def launcher(api: Any, core: Any, sleeps: list[float]) -> KubernetesLauncher:
    return KubernetesLauncher(api, core_api=core, sleep=sleeps.append, attempts=4, max_wait_s=30)


def created(body: dict[str, Any], uid: str = "uid-1") -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "uid": uid}}


def test_submit_creates_the_rendered_job(launcher: KubernetesLauncher, api: Any) -> None:
    job, plan, placement, env = gpu_job()
    body = render_volcano_job(job, plan, placement, env, attempt=2)
    api.create_namespaced_custom_object.return_value = created(body)
    handle = launcher.submit(job, plan, placement, env, attempt=2)
    api.create_namespaced_custom_object.assert_called_once_with(*JOB_API, body)
    name = volcano_job_name("gpt-200b", env.run)
    assert name.startswith("gpt-200b-") and name == body["metadata"]["name"]  # one Volcano Job per run
    assert (handle.kind, handle.name, handle.namespace, handle.uid) == ("kubernetes", name, "trainyard", "uid-1")
    assert handle.nodes == placement.node_names and handle.ranks_per_node == 8
    assert RunHandle.model_validate_json(handle.model_dump_json()) == handle


def test_transient_errors_are_retried_honouring_retry_after(launcher: KubernetesLauncher, api: Any,
                                                             sleeps: list[float]) -> None:
    job, plan, placement, env = gpu_job()
    body = render_volcano_job(job, plan, placement, env, attempt=2)
    api.create_namespaced_custom_object.side_effect = [
        api_error(429, {"Retry-After": "7"}), api_error(503), created(body)]
    handle = launcher.submit(job, plan, placement, env, attempt=2)
    assert handle.uid == "uid-1"
    assert api.create_namespaced_custom_object.call_count == 3
    assert sleeps[0] == 7.0 and 0 < sleeps[1] <= 30


def test_permanent_errors_fail_at_once(launcher: KubernetesLauncher, api: Any, sleeps: list[float]) -> None:
    job, plan, placement, env = gpu_job()
    api.create_namespaced_custom_object.side_effect = api_error(403)
    with pytest.raises(LaunchError, match=r"cannot create Volcano Job trainyard/gpt-200b-[0-9a-f]{6}: 403"):
        launcher.submit(job, plan, placement, env, attempt=2)
    assert api.create_namespaced_custom_object.call_count == 1 and sleeps == []


def test_retries_give_up_after_the_budget(launcher: KubernetesLauncher, api: Any, sleeps: list[float]) -> None:
    job, plan, placement, env = gpu_job()
    api.create_namespaced_custom_object.side_effect = api_error(500)
    with pytest.raises(LaunchError, match=": 500"):
        launcher.submit(job, plan, placement, env, attempt=2)
    assert api.create_namespaced_custom_object.call_count == 4 and len(sleeps) == 3


def test_conflict_reattaches_to_the_same_attempt_only(launcher: KubernetesLauncher, api: Any) -> None:
    job, plan, placement, env = gpu_job()
    body = render_volcano_job(job, plan, placement, env, attempt=2)
    api.create_namespaced_custom_object.side_effect = api_error(409)
    api.get_namespaced_custom_object.return_value = created(body, uid="uid-existing")
    assert launcher.submit(job, plan, placement, env, attempt=2).uid == "uid-existing"
    api.get_namespaced_custom_object.assert_called_with(*JOB_API, volcano_job_name("gpt-200b", env.run))
    older = created(body)
    older["metadata"]["labels"] = {**older["metadata"]["labels"], "trainyard.io/attempt": "1"}
    api.get_namespaced_custom_object.return_value = older
    with pytest.raises(LaunchError, match="already exists for attempt 1; stop it before launching attempt 2"):
        launcher.submit(job, plan, placement, env, attempt=2)


def handle() -> RunHandle:
    return RunHandle(kind="kubernetes", job="gpt-200b", attempt=2, world_size=256, namespace="trainyard",
                     name="gpt-200b", uid="uid-1", nodes=[f"n{i}" for i in range(32)], ranks_per_node=8)


def volcano_status(phase: str, **counts: int) -> dict[str, Any]:
    return {"metadata": {"name": "gpt-200b", "uid": "uid-1"},
            "status": {"state": {"phase": phase}, **counts}}


@pytest.mark.parametrize(("phase", "state"), [
    ("Running", "running"), ("Completed", "succeeded"), ("Aborted", "failed"), ("Failed", "failed"),
    ("Restarting", "running"), ("Terminated", "failed")])
def test_poll_maps_volcano_phases(launcher: KubernetesLauncher, api: Any, core: Any, phase: str, state: str) -> None:
    api.get_namespaced_custom_object.return_value = volcano_status(phase, running=32)
    core.list_namespaced_pod.return_value = V1PodList(items=[])
    status = launcher.poll(handle())
    assert status.state == state and f"Volcano phase {phase}" in status.message
    core.list_namespaced_pod.assert_called_once_with(
        "trainyard", label_selector="trainyard.io/job=gpt-200b,trainyard.io/attempt=2")


def test_pending_explains_why_from_the_podgroup(launcher: KubernetesLauncher, api: Any, core: Any) -> None:
    reason = "0/1250 nodes are available: 32 Insufficient nvidia.com/gpu"
    api.get_namespaced_custom_object.side_effect = [
        volcano_status("Pending", pending=32),
        {"status": {"conditions": [{"type": "Unschedulable", "status": "True", "message": reason}]}},
    ]
    core.list_namespaced_pod.return_value = V1PodList(items=[])
    status = launcher.poll(handle())
    assert status.state == "pending" and status.message.endswith(f"scheduler: {reason}")
    assert api.get_namespaced_custom_object.call_args_list[1] == call(
        "scheduling.volcano.sh", "v1beta1", "trainyard", "podgroups", "gpt-200b-uid-1")


def pod(rank: int, code: int | None) -> V1Pod:
    state = V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=code, reason="Error")) \
        if code is not None else V1ContainerState()
    return V1Pod(metadata=V1ObjectMeta(name=f"gpt-200b-worker-{rank}-0", labels={"trainyard.io/node-rank": str(rank)}),
                 spec=V1PodSpec(node_name=f"n{rank}", containers=[]),
                 status=V1PodStatus(phase="Failed" if code else "Running", container_statuses=[
                     V1ContainerStatus(name="trainer", image="i", image_id="", ready=False, restart_count=0,
                                       state=state)]))


def test_poll_reports_the_failed_pods_exit_code(launcher: KubernetesLauncher, api: Any, core: Any) -> None:
    api.get_namespaced_custom_object.return_value = volcano_status("Aborted", failed=1)
    core.list_namespaced_pod.return_value = V1PodList(items=[pod(1, 137), pod(0, None)])
    status = launcher.poll(handle())
    assert status.state == "failed" and status.exit_code == 137
    assert [(a.node, a.exit_code) for a in status.agents] == [("n0", None), ("n1", 137)]
    assert "killed by SIGKILL" in status.agents[1].message


def test_poll_of_a_vanished_or_replaced_job_is_unknown(launcher: KubernetesLauncher, api: Any, core: Any) -> None:
    api.get_namespaced_custom_object.side_effect = api_error(404)
    assert launcher.poll(handle()).state == "unknown"
    api.get_namespaced_custom_object.side_effect = None
    api.get_namespaced_custom_object.return_value = {"metadata": {"uid": "uid-2"}, "status": {}}
    status = launcher.poll(handle())
    assert status.state == "unknown" and "uid uid-2, expected uid-1" in status.message


def test_stop_deletes_with_grace_and_uid_precondition(launcher: KubernetesLauncher, api: Any) -> None:
    api.delete_namespaced_custom_object.side_effect = [api_error(502), {"status": "Success"}]
    status = launcher.stop(handle(), grace_s=45)
    assert status.state == "stopped" and api.delete_namespaced_custom_object.call_count == 2
    args, kwargs = api.delete_namespaced_custom_object.call_args
    assert args == (*JOB_API, "gpt-200b")
    assert kwargs["grace_period_seconds"] == 45 and kwargs["propagation_policy"] == "Foreground"
    assert kwargs["body"].preconditions.uid == "uid-1"


@pytest.mark.parametrize("code", [404, 409])
def test_stop_of_a_gone_job_is_done(launcher: KubernetesLauncher, api: Any, code: int) -> None:
    api.delete_namespaced_custom_object.side_effect = api_error(code)
    assert launcher.stop(handle()).state == "stopped"
    assert api.delete_namespaced_custom_object.call_count == 1


def test_logs_read_the_pod_of_the_rank(launcher: KubernetesLauncher, core: Any) -> None:
    core.read_namespaced_pod_log.return_value = "step 10 loss 2.3"
    assert launcher.logs(handle(), rank=17, tail=50) == "step 10 loss 2.3"
    core.read_namespaced_pod_log.assert_called_once_with("gpt-200b-worker-2-0", "trainyard",
                                                         container="trainer", tail_lines=50)
    with pytest.raises(ValueError, match="rank 256 is outside the job's world size 256"):
        launcher.logs(handle(), rank=256)


def test_queues_are_created_or_updated(launcher: KubernetesLauncher, api: Any) -> None:
    teams = load_teams()
    api.create_cluster_custom_object.side_effect = lambda group, version, plural, body: (
        (_ for _ in ()).throw(api_error(409)) if body["metadata"]["name"] == "vision" else body)
    names = launcher.ensure_queues(teams, 10_000)
    assert names == sorted(teams.teams)
    assert api.create_cluster_custom_object.call_count == len(names)
    api.patch_cluster_custom_object.assert_called_once()
    args = api.patch_cluster_custom_object.call_args.args
    assert args[:4] == ("scheduling.volcano.sh", "v1beta1", "queues", "vision")
    assert args[4]["spec"]["deserved"] == {"nvidia.com/gpu": "1500"}


def test_retry_after_accepts_an_http_date() -> None:
    assert retry_after_s(api_error(429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
    assert retry_after_s(api_error(429, {"retry-after": "12"})) == 12.0
    assert retry_after_s(api_error(503)) is None


def test_a_local_handle_is_refused(launcher: KubernetesLauncher) -> None:
    with pytest.raises(ValueError, match="cannot use a 'local' handle"):
        launcher.poll(RunHandle(kind="local", job="j", attempt=0, world_size=1))


def test_both_launchers_meet_the_protocol_settle_included(launcher: KubernetesLauncher, tmp_path: Any) -> None:
    from plugins.launch.base import Launcher
    from plugins.launch.local import LocalLauncher

    assert isinstance(launcher, Launcher) and isinstance(LocalLauncher(tmp_path), Launcher)
    assert "settle" in Launcher.__dict__


def test_settle_keeps_the_verdict_and_cleans_up_only_what_lingers(launcher: KubernetesLauncher, api: Any,
                                                                   core: Any) -> None:
    api.get_namespaced_custom_object.return_value = volcano_status("Failed", failed=1)
    core.list_namespaced_pod.return_value = V1PodList(items=[])
    settled = launcher.settle(handle())
    assert settled.state == "failed" and not settled.processes_alive
    assert api.delete_namespaced_custom_object.call_count == 0  # Volcano ended the pods itself
    lingering = settled.model_copy(update={"processes_alive": True})
    api.delete_namespaced_custom_object.return_value = {"status": "Success"}
    cleaned = launcher.settle(handle(), lingering)
    assert cleaned.state == "failed" and "cleaned up: deleted trainyard/gpt-200b" in cleaned.message
    assert api.delete_namespaced_custom_object.call_count == 1


def test_the_pods_of_one_run_are_not_confused_with_another_runs_at_the_same_attempt(
        launcher: KubernetesLauncher, api: Any, core: Any) -> None:
    api.get_namespaced_custom_object.return_value = volcano_status("Running", running=32)
    core.list_namespaced_pod.return_value = V1PodList(items=[])
    launcher.poll(handle().model_copy(update={"run": "20261201t031500-aaaaaa"}))
    core.list_namespaced_pod.assert_called_once_with(
        "trainyard", label_selector="trainyard.io/job=gpt-200b,trainyard.io/attempt=2,trainyard.io/run=20261201t031500-aaaaaa")
