"""The view model of one training run: everything the Trainyard view shows, as plain data.

Built by `trainyard.plugins.control_room.build` from the platform state, the checkpoint store, the
ranks' heartbeats and MLflow; rendered by `trainyard.plugins.control_room.render`; served as JSON too
(`…/view.json`), so what a person sees and what a test asserts are the same object. Every
figure that may be unknown is `None` (a finished run has no heartbeat, a hand-written plan no
estimate): the page says "—", never a made-up number.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.tracking.recovery_timing import RecoveryTiming


class _View(BaseModel):
    model_config = ConfigDict(frozen=True)


class MemoryBar(_View):
    """One device's memory: the plan's estimate by item, against the budget and the capacity."""

    items: dict[str, int] = Field(default_factory=dict)
    """Bytes per device by item (`weights`, `gradients`, `optimizer`, `activations`, …)."""
    total_bytes: int | None = None
    budget_bytes: int | None = None
    """What a plan should stay within (`memory_fraction` of the capacity)."""
    capacity_bytes: int | None = None
    """The device's memory as the cluster declares it."""

    @property
    def over_budget(self) -> bool:
        return None not in (self.total_bytes, self.budget_bytes) and self.total_bytes > self.budget_bytes  # type: ignore[operator]


class PlanView(_View):
    """The layout an attempt ran with, and the advisor's estimates for it."""

    label: str
    """`TP1·PP1·DP2 ZeRO-0 mbs4×2` (`Plan.describe`)."""
    layout: RankLayout
    """The plan's degrees, as the plan carries them (the page renders from it)."""
    zero_stage: int = 0
    fsdp: bool = False
    micro_batch_size: int
    num_micro_batches: int
    recompute: str
    global_batch_size: int | None = None
    sequence_length: int | None = None
    memory: MemoryBar
    step_time_s: float | None = None
    step_split: dict[str, float] = Field(default_factory=dict)
    """Seconds per step by phase (`compute`, `pipeline bubble`, `comm tp`, `comm dp`, …),
    summing to `step_time_s`; empty when the plan has no time estimate."""
    tokens_per_s: float | None = None
    mfu: float | None = None


class DeviceCell(_View):
    """One device of the gang: which rank it holds and that rank's group on each dimension."""

    index: int
    """Device index on its node."""
    rank: int
    groups: dict[str, int]
    """Group kind → the group's index (`tp` 0, `dp` 1, …): what colours the cell."""
    step: int | None = None
    """The rank's last heartbeat step, while the attempt trains."""


class NodeBox(_View):
    name: str
    address: str = ""
    capacity: int
    """Devices the node has (the ones the job does not use are drawn empty)."""
    devices: list[DeviceCell]
    used: bool = True
    """False: a node of the same rack this attempt did not use (drawn for context)."""


class RackBox(_View):
    name: str
    nodes: list[NodeBox]
    more_nodes: int = 0
    """Unused nodes of the rack left out of the drawing (a rack of a large fleet)."""


class PlacementView(_View):
    """Racks → nodes → devices of one attempt, with its process groups."""

    attempt: int
    gpu_type: str
    strategy: str = ""
    score: float | None = None
    racks: list[RackBox]
    group_sizes: dict[str, int]
    """Group kind → its degree; the legend shows the kinds with more than one member."""


class Live(_View):
    """Progress: from the live attempt's heartbeats while it trains, else MLflow's latest."""

    source: Literal["heartbeats", "mlflow", "none"]
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    updated_at: datetime | None = None
    ranks_reporting: int | None = None
    loss_curve: list[tuple[int, float]] = Field(default_factory=list)
    """(step, loss) from MLflow, thinned to a few hundred points for the sparkline."""


class RankLive(_View):
    """One rank of the live attempt: what its launcher says of it, and its last log lines (the
    launcher's `logs`, the engine behind `trainyard logs --rank`)."""

    rank: int
    node: str = ""
    state: str
    """`running`, `hung`, `completed`, `killed by SIGKILL`, … (the launcher's word for it)."""
    step: int | None = None
    heartbeat_age_s: float | None = None
    log_tail: list[str] = Field(default_factory=list)


class LiveUpdate(_View):
    """What the page of a run that has not ended fetches every few seconds (`…/live.json`): the
    run's state, the progress and each rank — cheap to build (no checkpoint scan, no metric
    history), so polling it costs the servers little."""

    state: str
    updated_at: datetime
    """When the run's state last changed."""
    final: bool
    final_reason: str = ""
    attempt: int | None = None
    """The live attempt (None: none is running — between attempts, or the run has ended)."""
    live: Live
    ranks: list[RankLive] = Field(default_factory=list)
    waiting: str = ""
    """Why the live attempt's gang has not started, in its launcher's words ('' once it runs)."""


class CheckpointRow(_View):
    step: int
    manifest_uri: str
    created_at: datetime
    size_bytes: int
    files_ok: bool
    """Every file the manifest lists is present with its size (no re-hash: cheap per view)."""
    problem: str = ""
    verified_at_commit: bool
    """The checkpoint watcher hashed and recorded it in MLflow when it was committed."""
    resume_pick: bool = False
    """The checkpoint a resume would restore now: the newest one whose files are all there."""
    quarantined: str = ""
    """Why it may never be restored again ('' when it may)."""


class AttemptView(_View):
    """One attempt of the run, as its recovery timeline shows it."""

    attempt: int
    dag_run_id: str
    """The Airflow DAG run (its id within the DAG, without the DAG id)."""
    state: str
    started_at: datetime
    ended_at: datetime | None = None
    outcome: str = ""
    reason: str = ""
    action: str = ""
    action_reason: str = ""
    step: int | None = None
    resume_step: int | None = None
    restarts_in_place: int = 0
    """torchrun's own restarts inside this attempt (the fast path), counted against the budget."""
    nodes: list[str] = Field(default_factory=list)
    timing: RecoveryTiming | None = None
    """The recovery after this attempt (None when it completed or nothing followed)."""
    dag_run_url: str = ""


class RunView(_View):
    """One training run of a job, all attempts."""

    job: str
    run: str
    dag_id: str
    state: str
    team: str = ""
    project: str = ""
    created_at: datetime
    updated_at: datetime
    final_reason: str = ""
    plan: PlanView | None = None
    placement: PlacementView | None = None
    live: Live
    ranks: list[RankLive] = Field(default_factory=list)
    """Each rank of the live attempt (empty once no attempt runs)."""
    waiting: str = ""
    """Why the live attempt's gang has not started, in its launcher's words — on Kueue the
    queue's own reason (its quota) — '' once it runs or when no attempt is live."""
    checkpoints: list[CheckpointRow] = Field(default_factory=list)
    checkpoint_root: str = ""
    checkpoint_problem: str = ""
    """Why the checkpoints could not be listed ('' when they were)."""
    attempts: list[AttemptView] = Field(default_factory=list)
    mlflow_run_id: str = ""
    mlflow_url: str = ""
    notes: list[str] = Field(default_factory=list)
    """What could not be read and why (MLflow down, spec gone): said, never hidden."""


class RunSummary(_View):
    """One line of the runs list (`runs_list.py`)."""

    job: str
    run: str
    team: str = ""
    state: str
    attempts: int
    last_cause: str = ""
    outcome: str = ""
    """The one-line outcome of a run that is over (`recovery.outcome`), '' while it is live."""
    created_at: datetime
    updated_at: datetime
    duration_s: float | None = None
    """Opened to now (live) or to its last change (over)."""
    steps: int | None = None
    """The last step of its `loss` series in MLflow."""
    final_loss: float | None = None
    cost_usd: float | None = None
    """MLflow's `total_cost_usd` (written when the run closes)."""
    view_url: str
    job_url: str = ""
    """The runs of this run's job (relative to the app's root)."""
