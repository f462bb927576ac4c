"""The control plane's rendered identity against a real kube-apiserver with RBAC on (issue 55):
with the token of the ServiceAccount `trainyard render k8s` creates, every call the Kubernetes
launcher makes is authorized, and nothing beyond it is — judged by the real authorizer, where the
emulator accepted one all-powerful token.

A Volcano Job call that is authorized answers 404 here (no Volcano CRDs are installed: the module
proxy refuses Volcano, `tests/support/kube/components.py`); a refused one answers 403 before any
routing, so the two are told apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube import real
from tests.support.require import missing
from trainyard.plugins.launch.manifests import (
    QUEUE_GROUP,
    QUEUE_PLURAL,
    QUEUE_VERSION,
    VOLCANO_GROUP,
    VOLCANO_PLURAL,
    VOLCANO_VERSION,
)
from trainyard.plugins.launch.rbac import ACCOUNT, render_rbac, rules_for
from trainyard.plugins.placement.inventory import GPU_COUNT_LABEL, GPU_PRODUCT_LABEL, RACK_LABEL

pytestmark = pytest.mark.slow
NAMESPACE, OTHER = "trainyard", "team-b"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[real.ControlPlane, str]]:
    """The control plane, the rendered RBAC applied by the administrator, and the account's token."""
    if real.binaries_missing():
        missing("kube", f"the Kubernetes binaries are not built: {', '.join(real.binaries_missing())}")
    from kubernetes import client, utils

    with real.control_plane(tmp_path_factory.mktemp("kube")) as plane:
        admin = plane.client()
        core = client.CoreV1Api(admin)
        for name in (NAMESPACE, OTHER):
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        for doc in render_rbac(NAMESPACE):
            utils.create_from_dict(admin, doc)
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="gpu-node-0", labels={
            GPU_COUNT_LABEL: "8", GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3", RACK_LABEL: "rack-a"})))
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
        token = core.create_namespaced_service_account_token(ACCOUNT, NAMESPACE, request).status.token
        yield plane, token


def status_of(call: Any, *args: Any, **kwargs: Any) -> int:
    from kubernetes.client.exceptions import ApiException

    try:
        call(*args, **kwargs)
    except ApiException as e:
        return int(e.status)
    return 200


def test_every_rule_is_granted_to_the_account_and_judged_by_the_real_authorizer(cluster: Any) -> None:
    from kubernetes import client

    plane, token = cluster
    auth = client.AuthorizationV1Api(plane.client(token))
    for group, resource, verbs, wide in rules_for("volcano"):
        name, _, sub = resource.partition("/")
        for verb in verbs:
            review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    group=group, resource=name, subresource=sub or None, verb=verb,
                    namespace=None if wide else NAMESPACE)))
            assert auth.create_self_subject_access_review(review).status.allowed, (group, resource, verb)


def test_the_launchers_calls_are_authorized_and_nothing_more(cluster: Any) -> None:
    from kubernetes import client

    from trainyard.plugins.launch.kube_clients import KubeClients
    from trainyard.plugins.launch.volcano import KubernetesLauncher

    plane, token = cluster
    api = plane.client(token)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    job = (VOLCANO_GROUP, VOLCANO_VERSION)
    # What the launcher does: authorized (404 where the object or the Volcano CRD is absent).
    fleet = KubernetesLauncher.from_clients(KubeClients.from_api_client(api)).cluster()
    assert [n.name for rack in fleet.spec.racks for n in rack.nodes] == ["gpu-node-0"]
    assert status_of(core.list_namespaced_pod, NAMESPACE, label_selector="trainyard.io/job=x") == 200
    assert status_of(core.list_namespaced_event, NAMESPACE) == 200
    assert status_of(core.read_namespaced_pod_log, "rank-0", NAMESPACE) == 404
    assert status_of(custom.create_namespaced_custom_object, *job, NAMESPACE, VOLCANO_PLURAL, {}) == 404
    assert status_of(custom.get_namespaced_custom_object, *job, NAMESPACE, VOLCANO_PLURAL, "x") == 404
    assert status_of(custom.delete_namespaced_custom_object, *job, NAMESPACE, VOLCANO_PLURAL, "x") == 404
    assert status_of(custom.get_namespaced_custom_object, QUEUE_GROUP, "v1beta1", NAMESPACE, "podgroups", "x") == 404
    # Beyond it: refused by RBAC.
    refused = {
        "secrets in its namespace": status_of(core.list_namespaced_secret, NAMESPACE),
        "pods of another namespace": status_of(core.list_namespaced_pod, OTHER),
        "a Volcano Job in another namespace": status_of(custom.create_namespaced_custom_object, *job, OTHER,
                                                        VOLCANO_PLURAL, {}),
        "creating a pod": status_of(core.create_namespaced_pod, NAMESPACE,
                                    client.V1Pod(metadata=client.V1ObjectMeta(name="p"),
                                                 spec=client.V1PodSpec(containers=[client.V1Container(
                                                     name="c", image="busybox")]))),
        "deleting a node": status_of(core.delete_node, "node-1"),
        "a team's Queue": status_of(custom.create_cluster_custom_object, QUEUE_GROUP, QUEUE_VERSION,
                                    QUEUE_PLURAL, {}),
        "namespaces": status_of(core.list_namespace),
    }
    assert {what: code for what, code in refused.items() if code != 403} == {}


def test_an_unknown_token_is_not_the_account(cluster: Any, tmp_path: Path) -> None:
    from kubernetes import client

    plane, _ = cluster
    assert status_of(client.CoreV1Api(plane.client("not-a-token")).list_node) == 401


def test_the_health_watch_finds_node_agents_from_the_node_objects(cluster: Any) -> None:
    """The node-agent DaemonSet answers on each node's address at its hostPort; the account reads
    where from the Node objects (what the health watch polls), no static map."""
    from kubernetes import client

    from trainyard.plugins.launch.kube_clients import KubeClients
    from trainyard.plugins.launch.manifests import KubernetesOptions, render_node_agent_daemonset
    from trainyard.plugins.launch.volcano import KubernetesLauncher
    from trainyard.plugins.run.model import RunHandle

    plane, token = cluster
    core = client.CoreV1Api(plane.client())
    for name, address in (("gpu-node-1", "10.1.0.11"), ("gpu-node-2", None)):
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
        if address:
            core.patch_node_status(name, {"status": {"addresses": [{"type": "InternalIP", "address": address}]}})
    options = KubernetesOptions(namespace=NAMESPACE, node_agent_port=9411)
    port = render_node_agent_daemonset(options)["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    assert port["hostPort"] == port["containerPort"] == 9411
    launcher = KubernetesLauncher.from_clients(KubeClients.from_api_client(plane.client(token)), options=options)
    handle = RunHandle(kind="kubernetes", job="j", attempt=0, world_size=16, namespace=NAMESPACE, name="j-abcdef",
                       nodes=["gpu-node-1", "gpu-node-2"])
    assert launcher.node_agents(handle) == {"gpu-node-1": "http://10.1.0.11:9411"}  # node 2: no address yet
