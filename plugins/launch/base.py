"""The `Launcher` interface: submit a placed job, poll it, stop it, read its logs.

Every method but `submit` works from the `RunHandle` alone, in any process, so the control
plane can re-attach after restarts (DESIGN §4: restarting Airflow never kills training).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from trainyard.plugins.errors import FatalError

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.config.spec import TrainingJob
    from trainyard.config.worker_env import WorkerEnv
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.launch.kube_clients import KubeClients
    from trainyard.plugins.placement.model import Placement
    from trainyard.plugins.run.model import RunHandle, RunStatus


class LaunchError(FatalError):
    """The job could not be started (bad placement for this launcher, API refused, a Job of
    another attempt in the way, …). Fatal: the launchers retry transient API errors themselves
    (honouring Retry-After), so what reaches the caller would fail the same way again."""


@runtime_checkable
class Launcher(Protocol):
    def submit(self, job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv,
               *, attempt: int) -> RunHandle:
        """Start the job detached and return its handle. Idempotent per (job, attempt): a second
        call re-attaches to the run already started, it never launches a second copy."""
        ...

    def poll(self, handle: RunHandle) -> RunStatus: ...

    def stop(self, handle: RunHandle, grace_s: float = 30.0, *, lost_nodes: Collection[str] = ()) -> RunStatus:
        """SIGTERM (time for an emergency checkpoint), wait `grace_s`, then kill what is left.
        `lost_nodes`: nodes the control plane has judged lost. Where nothing there can be
        signalled or confirm its end (Kubernetes), the gang gets no grace: without those ranks
        no emergency checkpoint can complete."""
        ...

    def logs(self, handle: RunHandle, rank: int | None = None, tail: int = 200) -> str: ...

    def node_agents(self, handle: RunHandle) -> dict[str, str]:
        """Node → the base URL of its node agent, for the gang's nodes the launcher can locate
        ({} where the deployment names them in `TRAINYARD_NODE_AGENTS`, as the local stack does)."""
        ...

    def settle(self, handle: RunHandle, status: RunStatus | None = None) -> RunStatus:
        """Make sure nothing of a finished run lingers (a peer waiting in torchrun's exit
        barrier, pods a policy left behind), keeping the run's verdict; returns the status."""
        ...


class LaunchOptions(BaseModel):
    """What varies between two launches on the same cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_restarts: int = Field(default=0, ge=0)
    """torchrun's in-place restarts (the fast path)."""
    cluster_options: dict[str, Any] = Field(default_factory=dict)
    """The cluster file's `spec.launcher` section (the backend validates it)."""


@dataclass(frozen=True)
class Runtime:
    """What the engine needs from the process it runs in, beyond the settings: how to reach a
    Kubernetes API here — inside Airflow the cncf-kubernetes provider's `KubernetesHook` on
    the connection `TRAINYARD_KUBERNETES_CONN_ID` (`operators/kubernetes_clients.py` passes it),
    elsewhere the kubeconfig. Engines never import Airflow, so the hook comes in from outside."""

    settings: Settings
    kube_clients: Callable[[], KubeClients] | None = field(default=None, compare=False)
