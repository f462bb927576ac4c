"""A team on the real control plane, set up as on a real cluster, and the launcher as the
control plane itself: what `tests/integration/launch/test_kueue_launch.py` and
`test_kube_node_loss.py` both start from (one home for it).

An administrator applies the platform's namespace, the team's namespace (Pod Security
`restricted`, its quota, its data account), the control plane's RBAC for Kueue and the queues
(`ensure_queues`); the launcher then runs with the control plane's ServiceAccount's own token,
so every call it makes is judged by the real authorizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainyard.plugins.launch.kube_clients import KubeClients
from trainyard.plugins.launch.rbac import ACCOUNT, render_rbac
from trainyard.plugins.launch.tenancy import (
    PLATFORM_NAMESPACE,
    render_platform_namespace,
    render_teams,
)
from trainyard.plugins.launch.volcano import KubernetesLauncher

if TYPE_CHECKING:
    from tests.support.kube.real_harness import RealKubeHarness
    from trainyard.config.teams import Teams


def control_plane_launcher(kube: RealKubeHarness, teams: Teams, namespaces: list[str], *, total_slots: int,
                           **launcher_kwargs: Any) -> KubernetesLauncher:
    """The administrator's part (see the module docstring), then the launcher on the control
    plane's own token, `queueing="kueue"`, the pods' heartbeats in an `emptyDir`."""
    from kubernetes import client, utils

    admin = kube.cluster.client()  # type: ignore[union-attr]
    for doc in [render_platform_namespace(), *render_teams(teams, cpu_cluster=True),
                *render_rbac(PLATFORM_NAMESPACE, namespaces, queueing="kueue")]:
        utils.create_from_dict(admin, doc)
    options = kube.launcher_options(queueing="kueue", namespace=None, heartbeat_volume="emptyDir")
    KubernetesLauncher.from_clients(KubeClients.from_api_client(admin), options=options).ensure_queues(
        teams, total_gpus=total_slots, cpu_cluster=True)
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(ACCOUNT, PLATFORM_NAMESPACE, request)
    own = kube.cluster.client(token.status.token)  # type: ignore[union-attr]
    return KubernetesLauncher.from_clients(KubeClients.from_api_client(own), options=options, **launcher_kwargs)


def trainer_log(kube: RealKubeHarness, pod: str, namespace: str, container: str = "trainer") -> str:
    """A container's log as its node keeps it (the real API server would ask the kubelet's own
    server for it, which the simulated kubelet does not run)."""
    try:
        return (kube.pod_dir(pod, namespace) / f"{container}.log").read_text(errors="replace")[-3000:]
    except (OSError, KeyError) as e:
        return f"(no {container} log: {e})"
