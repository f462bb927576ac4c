"""Which lost nodes the stop taints out-of-service, the patch it writes, and the role it needs
(`trainyard.plugins.launch.fencing`, `rbac.py`). The launcher's use of them: `test_launch_volcano.py`
(emulated API server) and `tests/integration/launch/test_kube_node_loss.py` (the real controllers)."""

from __future__ import annotations

from typing import Any

import pytest

from trainyard.plugins.launch.fencing import (
    OUT_OF_SERVICE_KEY,
    OUT_OF_SERVICE_TAINT,
    is_out_of_service,
    nodes_to_fence,
    out_of_service_patch,
)
from trainyard.plugins.launch.kube_status import Observed
from trainyard.plugins.launch.rbac import render_rbac

UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-12-07T10:00:00Z"}


def node(name: str, ready: str | None, *taints: dict[str, Any]) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": name, "resourceVersion": "42"}, "spec": {"taints": list(taints)},
            "status": {"conditions": conditions}}


def pod(name: str, on: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": on}}


def test_only_a_lost_node_kubernetes_marks_not_ready_and_that_holds_a_pod_is_fenced() -> None:
    seen = Observed(job={}, pods=[pod("p0", "n0"), pod("p1", "n1"), pod("p2", "n2"), pod("p3", "n3")],
                    nodes={"n0": node("n0", "Unknown", UNREACHABLE),  # lost and NotReady: fenced
                           "n1": node("n1", "True"),  # lost to the health watch alone: its kubelet ends its pods
                           "n2": node("n2", "False"),  # NotReady but not judged lost by the control plane
                           "n3": node("n3", "False", OUT_OF_SERVICE_TAINT),  # fenced already
                           "n4": node("n4", "False")})  # lost, NotReady, but none of the gang's pods there
    assert nodes_to_fence(seen, {"n0", "n1", "n3", "n4"}) == ["n0"]
    assert nodes_to_fence(seen, ()) == []


def test_the_patch_keeps_the_node_lifecycle_controllers_taints_and_is_bound_to_the_version_read() -> None:
    patch = out_of_service_patch(node("n0", "Unknown", UNREACHABLE))
    assert patch == {"metadata": {"resourceVersion": "42"},
                     "spec": {"taints": [UNREACHABLE, {"key": OUT_OF_SERVICE_KEY, "value": "nodeshutdown",
                                                       "effect": "NoExecute"}]}}
    assert is_out_of_service({"spec": patch["spec"]}) and not is_out_of_service(node("n0", "True", UNREACHABLE))


def node_verbs(docs: list[dict[str, Any]]) -> set[str]:
    return {verb for doc in docs if doc["kind"] == "ClusterRole" for rule in doc["rules"]
            if rule["resources"] == ["nodes"] for verb in rule["verbs"]}


def test_the_control_plane_may_patch_nodes_only_to_fence_them_and_never_delete_one() -> None:
    assert node_verbs(render_rbac("trainyard")) == {"get", "list", "watch", "patch"}
    assert node_verbs(render_rbac("trainyard", queueing="kueue", fence_lost_nodes=False)) == {"get", "list", "watch"}


@pytest.mark.parametrize("fence", [True, False])
def test_trainyard_render_k8s_follows_the_cluster_files_opt_out(fence: bool) -> None:
    from tests.unit.launch.launch_fixtures import gpu_job
    from trainyard.config.teams import load_teams
    from trainyard.plugins.launch.manifests import KubernetesOptions, render_all

    job, plan, placement, env = gpu_job()
    docs = render_all(job, plan, placement, env, load_teams(), attempt=0, total_gpus=256,
                      options=KubernetesOptions(fence_lost_nodes=fence))
    assert ("patch" in node_verbs(docs)) is fence
