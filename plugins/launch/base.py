"""The `Launcher` interface: submit a placed job, poll it, stop it, read its logs.

Every method but `submit` works from the `RunHandle` alone, in any process, so the control
plane can re-attach after restarts (DESIGN §4: restarting Airflow never kills training).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from plugins.errors import FatalError

if TYPE_CHECKING:
    from config.spec import TrainingJob
    from config.worker_env import WorkerEnv
    from plugins.advisor.plan import Plan
    from plugins.launch.model import RunHandle, RunStatus
    from plugins.placement.model import Placement


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

    def stop(self, handle: RunHandle, grace_s: float = 30.0) -> RunStatus:
        """SIGTERM (time for an emergency checkpoint), wait `grace_s`, then kill what is left."""
        ...

    def logs(self, handle: RunHandle, rank: int | None = None, tail: int = 200) -> str: ...

    def settle(self, handle: RunHandle, status: RunStatus | None = None) -> RunStatus:
        """Make sure nothing of a finished run lingers (a peer waiting in torchrun's exit
        barrier, pods a policy left behind), keeping the run's verdict; returns the status."""
        ...
