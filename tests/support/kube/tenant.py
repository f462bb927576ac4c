"""The launcher as the control plane itself on the real control plane, for the launcher-level
tests (`tests/integration/launch/test_kueue_launch.py`, `test_kube_node_loss.py`).

The administrator's part is `RealKubeHarness.apply_platform` (what `trainyard render k8s`
prints for the cluster: the teams' namespaces under Pod Security `restricted`, quotas, the
control plane's RBAC, priorities, the Kueue queues); the launcher then runs with the control
plane's own ServiceAccount token (`RealKubeHarness.control_plane_kubeconfig`), so every call it
makes is judged by the real authorizer — the same two steps the DAG's e2e stack takes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainyard.plugins.launch.volcano import KubernetesLauncher

if TYPE_CHECKING:
    from tests.support.kube.real_harness import RealKubeHarness
    from trainyard.config.teams import Teams


def control_plane_launcher(kube: RealKubeHarness, teams: Teams, **launcher_kwargs: Any) -> KubernetesLauncher:
    """`teams` applied by the administrator, then the launcher on the control plane's token, with
    the harness's options (`queueing="kueue"`) — and a shared filesystem: these tests' tiny job
    keeps the default `file://` home, which the simulated nodes see at the same paths."""
    kube.apply_platform(teams)
    kubeconfig = kube.control_plane_kubeconfig(kube.root / "control-plane.kubeconfig")
    return KubernetesLauncher.from_kubeconfig(str(kubeconfig), options=kube.launcher_options(shared_filesystem=True),
                                              **launcher_kwargs)


def trainer_log(kube: RealKubeHarness, pod: str, namespace: str, container: str = "trainer") -> str:
    """A container's log as its node keeps it (the real API server would ask the kubelet's own
    server for it, which the simulated kubelet does not run)."""
    try:
        return (kube.pod_dir(pod, namespace) / f"{container}.log").read_text(errors="replace")[-3000:]
    except (OSError, KeyError) as e:
        return f"(no {container} log: {e})"
