"""Kubernetes clients for the launcher from Airflow's `KubernetesHook`, when Airflow is here.

A thin adapter, outside the engines (DESIGN §1: engines never import Airflow): it turns an
Airflow connection (`TRAINYARD_KUBERNETES_CONN_ID`, default `kubernetes_default`, which the
provider resolves to the in-cluster service account or the kubeconfig when the connection
does not exist) into the API clients `trainyard.plugins.launch.volcano.KubernetesLauncher` takes. Where
Airflow or the cncf-kubernetes provider is not installed — `trainyard` on a laptop — the
clients come from the kubeconfig (`trainyard.plugins.launch.kube_clients`).

Airflow is imported inside the function, never at module level: a DAG file may import this
module cheaply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.plugins.launch.kube_clients import KubeClients
    from trainyard.plugins.launch.manifests import KubernetesOptions
    from trainyard.plugins.launch.volcano import KubernetesLauncher
    from trainyard.plugins.run.model import RunHandle, RunStatus


def kubernetes_clients(conn_id: str | None = None) -> KubeClients:
    """From `KubernetesHook(conn_id)` when the provider imports, else from the kubeconfig."""
    from trainyard.plugins.launch.kube_clients import KubeClients, clients_from_kubeconfig

    try:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    except ImportError:
        return clients_from_kubeconfig()
    if conn_id is None:
        from trainyard.config.settings import get_settings

        conn_id = get_settings().kubernetes_conn_id
    hook = KubernetesHook(conn_id=conn_id)
    return KubeClients(custom=hook.custom_object_client, core=hook.core_v1_client)


def kubernetes_launcher(options: KubernetesOptions | None = None, conn_id: str | None = None) -> KubernetesLauncher:
    """The launcher the DAG's launch and watch tasks use."""
    from trainyard.plugins.launch.volcano import KubernetesLauncher

    return KubernetesLauncher.from_clients(kubernetes_clients(conn_id), options=options)


async def poll_with_async_hook(handle: RunHandle, conn_id: str | None = None) -> RunStatus:
    """`KubernetesLauncher.poll_async` through the provider's `AsyncKubernetesHook` (for the
    training trigger on the triggerer: no thread, no sync client)."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

    from trainyard.plugins.launch.volcano import poll_async

    if conn_id is None:
        from trainyard.config.settings import get_settings

        conn_id = get_settings().kubernetes_conn_id
    async with AsyncKubernetesHook(conn_id=conn_id).get_conn() as api_client:
        return await poll_async(handle, api_client)
