"""`RunHandle` and `RunStatus`: how the control plane finds a running job again.

A handle is everything another process needs to re-attach — an Airflow deferrable sensor on a
triggerer, a retry of the launch task, `trainyard status` — after the launching process is
gone: for local runs the run folder and each agent's pid / process group / start time (so a
reused pid is never mistaken for ours); for Kubernetes the object's namespace, name and uid.
Both are JSON (XCom carries them), never pickles.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RunState = Literal["pending", "running", "succeeded", "failed", "stopped", "unknown"]
TERMINAL_STATES: tuple[RunState, ...] = ("succeeded", "failed", "stopped")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AgentRecord(_Model):
    """One torchrun agent of a local run (one per node of the placement)."""

    node: str
    node_rank: int
    pid: int
    pgid: int
    start_ticks: int | None = None
    """Process start time in clock ticks since boot (`/proc/<pid>/stat` field 22): guards
    against a recycled pid."""
    nproc: int


class RunHandle(_Model):
    kind: str = Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")
    """The cluster mode the run was launched with (`local`, `kubernetes`, …): which launcher
    finds it again (`plugins.attempt.launchers.launcher_for`)."""
    job: str
    run: str = ""
    attempt: int
    world_size: int
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    # local
    run_dir: str = ""
    heartbeat_dir: str = ""
    rdzv_endpoint: str = ""
    max_restarts: int = 0
    """torchrun's `--max-restarts`: a rank failure is final only once these are spent."""
    agents: list[AgentRecord] = Field(default_factory=list)
    # kubernetes
    namespace: str = ""
    name: str = ""
    uid: str = ""
    nodes: list[str] = Field(default_factory=list)
    """Kubernetes: until the pods are bound, the placement's nodes (the set the pods may take, in
    the placement's order); once they are, the nodes they run on, in node-rank order (`bound`)."""
    ranks_per_node: int = 1
    api_version: str = ""
    """Kubernetes: the gang object's `apiVersion` — `batch.volcano.sh/v1alpha1` (a Volcano Job;
    '' in handles written before the Kueue path) or `batch/v1` (an Indexed Job Kueue admits)."""

    @property
    def gang_nodes(self) -> list[str]:
        """The gang's nodes in node-rank order: named by a Kubernetes handle, through its torchrun
        agents for a local one."""
        return list(self.nodes) or list(dict.fromkeys(a.node for a in sorted(self.agents, key=lambda a: a.node_rank)))

    def bound(self, status: RunStatus) -> RunHandle:
        """This handle with `nodes` as `status` found the gang bound (`RunStatus.nodes`: the nodes
        its pods run on, in node-rank order), or itself while they are not all bound. The
        scheduler picks which of the placement's nodes each pod gets, and the node ranks follow
        the pods: what blames, cordons and watches a node goes by this, never by the placement."""
        if not status.nodes or status.nodes == self.nodes:
            return self
        return self.model_copy(update={"nodes": list(status.nodes)})


class RankStatus(_Model):
    rank: int
    node: str = ""
    pid: int | None = None
    """The training process's pid (not torchrun's, not the wrapper's)."""
    restart: int = 0
    exit_code: int | None = None
    """Exit status; negative = killed by that signal (Python's `returncode` convention)."""
    outcome: str = ""
    """What the exit code means (`completed`, `diverged`, `killed by SIGKILL`, …)."""
    step: int | None = None
    phase: str = ""
    heartbeat_age_s: float | None = None
    hung: bool = False
    """The heartbeat is older than the job's hang timeout while the process is alive."""
    signal: str = ""
    """What watches the rank for a hang: `steps` (its own heartbeats), `activity` (its CPU time
    and I/O, for a plain script: `trainyard.plugins.launch.activity`), '' before any beat."""


class AgentStatus(_Model):
    """One torchrun agent: a local agent process, or a Kubernetes pod (one per node rank)."""

    node: str
    alive: bool
    exit_code: int | None = None
    message: str = ""
    pod: str = ""
    """Kubernetes: the pod's name."""
    phase: str = ""
    """Kubernetes: the pod's phase (Pending, Running, Succeeded, Failed)."""
    reason: str = ""
    """Kubernetes: why the pod is where it is — the container's termination reason (Completed,
    Error, OOMKilled), its waiting reason (ImagePullBackOff, CreateContainerError, …),
    Unschedulable, Evicted (its `DisruptionTarget` reason after the colon), or NodeNotReady."""
    node_ready: bool | None = None
    """Kubernetes: the pod's node reports Ready (False: NotReady or unreachable; None: unknown)."""


STILLNESS = {"steps": "made no step progress", "activity": "used no CPU and did no I/O"}
"""What a hung rank did not do, by the signal that watches it (`RankStatus.signal`)."""


def stillness(signal: str) -> str:
    return STILLNESS.get(signal, STILLNESS["steps"])


class RunStatus(_Model):
    state: RunState
    message: str = ""
    exit_code: int | None = None
    """The job's exit code: the first failing rank's, 0 on success."""
    failed_rank: int | None = None
    ranks: list[RankStatus] = Field(default_factory=list)
    agents: list[AgentStatus] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    """Kubernetes: the nodes the gang's pods are bound to, in node-rank order, once every pod is
    bound (empty before, and for a local run)."""
    processes_alive: bool = False
    """Some process of the run still exists (a failed run may need `stop` to clean up)."""
    step: int | None = None
    """The slowest rank's last heartbeat step."""
    evicted: str = ""
    """Why the cluster's queue took the gang back, in its own words ('' when it did not): on a
    Kueue cluster its Workload's eviction (`Preempted (InCohortReclamation): Preempted to
    accommodate a workload …`; `kueue_queues.eviction_cause`). The attempt is over once its pods
    are gone; `classify` calls it preempted."""
    updated_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def hang_signal(self) -> str:
        """What watches the attempt for a hang: `steps` once any rank writes its own heartbeats,
        `activity` where only its wrappers do (a plain script), '' before any beat."""
        signals = {r.signal for r in self.ranks if r.signal}
        return "steps" if "steps" in signals else signals.pop() if signals else ""

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"
