"""The Kubernetes API clients a `KubernetesLauncher` talks through, from a kubeconfig.

The launcher takes its clients as arguments (credentials stay with the caller). Outside
Airflow the caller is `trainyard` or a script, and its clients come from here: the kubeconfig
(`$KUBECONFIG` or `~/.kube/config`, optionally a named context), or the pod's service account
when running inside the cluster. Inside Airflow, `operators/kubernetes_clients.py` builds them
from the cncf-kubernetes provider's `KubernetesHook` instead (an Airflow connection); this
module never imports Airflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi


@dataclass(frozen=True)
class KubeClients:
    """What the launcher needs: Volcano objects (custom objects) and pods, nodes, logs (core)."""

    custom: CustomObjectsApi
    core: CoreV1Api

    @classmethod
    def from_api_client(cls, api_client: ApiClient) -> KubeClients:
        from kubernetes.client import CoreV1Api, CustomObjectsApi

        return cls(custom=CustomObjectsApi(api_client), core=CoreV1Api(api_client))


def clients_from_kubeconfig(config_file: str | None = None, context: str | None = None) -> KubeClients:
    """Clients for the kubeconfig's (current or named) context; inside a pod with neither a
    kubeconfig nor a file given, its service account. The process-wide default configuration
    of the `kubernetes` package is left alone (a client of its own, like the provider's hook)."""
    import os

    from kubernetes import config
    from kubernetes.client import ApiClient, Configuration

    # The package reads $KUBECONFIG once, when imported; read it now (a list of paths is merged).
    path = config_file or os.environ.get("KUBECONFIG") or None
    try:
        return KubeClients.from_api_client(config.new_client_from_config(config_file=path, context=context))
    except config.ConfigException as kubeconfig_error:
        if config_file or context:
            raise
        configuration = Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as e:
            raise config.ConfigException(
                f"no Kubernetes credentials: {kubeconfig_error}; and not inside a pod ({e}). Set "
                "KUBECONFIG or pass a kubeconfig file") from e
        return KubeClients.from_api_client(ApiClient(configuration))
