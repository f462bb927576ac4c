"""The launcher backends `plugins.attempt.launchers.launcher_for` chooses between: how each
launcher is built from the settings to start an attempt, and from a `RunHandle` to find one
again. The only place a launcher is constructed for the control plane.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.plugins.launch.base import LaunchOptions, Runtime
    from trainyard.plugins.launch.local import LocalLauncher
    from trainyard.plugins.launch.volcano import KubernetesLauncher
    from trainyard.plugins.run.model import RunHandle


class LocalBackend:
    """torchrun agents on this host (`LocalLauncher`), run from this checkout's code."""

    @classmethod
    def create(cls, settings: Settings, options: LaunchOptions, runtime: Runtime) -> LocalLauncher:
        from trainyard.config.settings import PACKAGE_ROOT
        from trainyard.plugins.launch.local import LocalLauncher

        return LocalLauncher(settings.runs_dir, source_dir=PACKAGE_ROOT, max_restarts=options.max_restarts,
                             endpoint_url=settings.s3_endpoint_url, data_cache_dir=settings.data_cache_dir)

    @classmethod
    def attach(cls, handle: RunHandle, settings: Settings, runtime: Runtime) -> LocalLauncher:
        from trainyard.plugins.launch.local import LocalLauncher

        # the runs folder the handle's run folder lies in (<runs>/<job>/<run>/<attempt>)
        return LocalLauncher(Path(handle.run_dir).parents[2] if handle.run_dir else settings.runs_dir)


class KubernetesBackend:
    """A Volcano Job per attempt (`KubernetesLauncher`), over the runtime's API clients: the
    Airflow connection's hook inside Airflow, the kubeconfig elsewhere. The cluster file's
    `spec.launcher` section holds its `KubernetesOptions` (namespace, images, …)."""

    @classmethod
    def create(cls, settings: Settings, options: LaunchOptions, runtime: Runtime) -> KubernetesLauncher:
        from trainyard.plugins.launch.manifests import KubernetesOptions

        # the pods reach the store where the control plane does unless the cluster file says otherwise
        k8s = KubernetesOptions.model_validate({"pod_s3_endpoint_url": settings.s3_endpoint_url,
                                                **options.cluster_options,
                                                "torchrun_max_restarts": options.max_restarts})
        return cls._launcher(runtime, k8s, records_dir=settings.runs_dir)

    @classmethod
    def attach(cls, handle: RunHandle, settings: Settings, runtime: Runtime) -> KubernetesLauncher:
        from trainyard.plugins.launch.manifests import KubernetesOptions

        return cls._launcher(runtime, KubernetesOptions(namespace=handle.namespace or "trainyard"))

    @staticmethod
    def _launcher(runtime: Runtime, options: object, records_dir: Path | None = None) -> KubernetesLauncher:
        from trainyard.plugins.launch.kube_clients import clients_from_kubeconfig
        from trainyard.plugins.launch.volcano import KubernetesLauncher

        clients = runtime.kube_clients() if runtime.kube_clients is not None else clients_from_kubeconfig()
        return KubernetesLauncher.from_clients(clients, options=options, records_dir=records_dir)
