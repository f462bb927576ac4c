"""Placement data contracts: what the placer is asked (`GangRequest`) and what it answers
(`Placement`, or `Unschedulable` carrying a `PendingReason` in numbers).

All pydantic and JSON-serialisable: a `Placement` travels through Airflow XCom from
`place_gang` to `launch_training`, and is stored in the platform state beside the reservation.
Both carry their degrees as a `RankLayout` (`layout`); a request or placement written with flat
`tp`/`pp`/`dp`/`cp` (and `ranks_per_node`) keys before #59 — in XCom of a running job, in a
reservation row — still loads (`lift_flat_degrees`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from trainyard.plugins.advisor.rank_layout import GroupKind, RankLayout, lift_flat_degrees
from trainyard.plugins.errors import FatalError, TrainyardError, TransientError

if TYPE_CHECKING:
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class GangRequest(_Model):
    """One gang to place: the job's identity, its device type and its parallel layout."""

    job: str
    run: str = ""
    """The training run (one trigger of the job); empty for a one-off placement."""
    attempt: NonNegativeInt = 0
    team: str = ""
    priority: str = "normal"
    gpu_type: str
    layout: RankLayout = Field(default_factory=RankLayout)
    """The plan's degrees (one rank per node: the placer picks the ranks per node)."""
    nodes_preferred: PositiveInt | None = None
    """Spread over exactly this many nodes (the spec's `hardware.nodesPreferred`)."""
    exclude: frozenset[str] = frozenset()
    """Nodes never to use (e.g. the node an attempt was lost on)."""
    dataset: str | None = None
    """Dataset URI, to prefer nodes whose cache is warm."""
    require_pp_in_rack: bool = False
    """Make "each pipeline inside one rack" a hard constraint instead of a preference."""

    @model_validator(mode="before")
    @classmethod
    def _lift_flat_degrees(cls, data: object) -> object:
        return lift_flat_degrees(data)

    @classmethod
    def for_job(cls, job: TrainingJob, plan: Plan, *, run: str = "", attempt: int = 0,
                exclude: frozenset[str] | set[str] = frozenset(), **overrides: object) -> GangRequest:
        """Build a request from a `TrainingJob` and a `Plan`; the plan must cover gpuCount."""
        hw = job.spec.hardware
        plan.layout.check_world_size(hw.gpu_count)
        values: dict[str, object] = dict(
            job=job.metadata.name, run=run, attempt=attempt, team=job.metadata.team,
            priority=job.metadata.priority, gpu_type=hw.gpu_type,
            layout=plan.layout,
            nodes_preferred=hw.nodes_preferred, exclude=frozenset(exclude),
            dataset=job.spec.dataset.source if job.spec.dataset else "",
        )
        values.update(overrides)
        return cls.model_validate(values)


class PlacedNode(_Model):
    """One node of a placement, in rank order."""

    name: str
    rack: str
    address: str
    gpu_type: str
    node_gpus: PositiveInt
    """The node's total devices (its capacity, for the reservation)."""
    node_rank: NonNegativeInt
    """torchrun's `--node-rank`."""
    first_rank: NonNegativeInt
    slots: PositiveInt
    """Ranks (devices) this job uses on the node: torchrun's `--nproc-per-node`."""
    devices: list[int] = Field(default_factory=list)
    """Device indices on the node, filled in by the reservation (empty before)."""
    tp_groups: list[int] = Field(default_factory=list)
    pp_stages: list[int] = Field(default_factory=list)
    dp_replicas: list[int] = Field(default_factory=list)

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.slots)


class Group(_Model):
    """One process group and the nodes it spans."""

    kind: GroupKind
    index: NonNegativeInt
    ranks: list[int]
    nodes: list[str]
    racks: list[str]


class Placement(_Model):
    """A gang placed on concrete nodes: nodes in rank order plus the group → node map."""

    job: str
    run: str = ""
    attempt: NonNegativeInt = 0
    team: str = ""
    priority: str = "normal"
    gpu_type: str
    layout: RankLayout
    """The degrees and the ranks per node (torchrun's `--nproc-per-node`): the rank order the
    nodes below follow."""
    nodes: list[PlacedNode]
    groups: list[Group] = Field(default_factory=list)
    """TP, PP and DP groups (CP too when cp > 1) with the nodes and racks each spans."""
    score: float = 0.0
    score_breakdown: dict[str, float] = Field(default_factory=dict)
    strategy: str = ""
    """Which candidate of the search won (`spread`, `pack`, …)."""

    @model_validator(mode="before")
    @classmethod
    def _lift_flat_degrees(cls, data: object) -> object:
        return lift_flat_degrees(data, extra=("ranks_per_node",))

    @model_validator(mode="after")
    def _consistent(self) -> Placement:
        layout = self.layout
        if len(self.nodes) != layout.num_nodes:
            raise ValueError(f"placement has {len(self.nodes)} nodes; world size {layout.world_size} "
                             f"at {layout.ranks_per_node} ranks per node needs {layout.num_nodes}")
        return self

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def racks(self) -> list[str]:
        return sorted({n.rack for n in self.nodes})

    def groups_of(self, kind: GroupKind) -> list[Group]:
        return [g for g in self.groups if g.kind == kind]

    def pp_groups_in_one_rack(self) -> tuple[int, int]:
        """(PP groups whose stages share one rack, all PP groups)."""
        groups = self.groups_of("pp")
        return sum(1 for g in groups if len(g.racks) == 1), len(groups)


Shortfall = Literal["no_gpu_type", "tp_exceeds_node", "not_enough_nodes", "pp_blocks", "world_size"]


class PendingReason(_Model):
    """Why a gang cannot be placed now, in numbers (what Volcano and Kueue users ask for)."""

    code: Shortfall
    message: str
    gpu_type: str
    needed_nodes: NonNegativeInt = 0
    gpus_per_node_needed: NonNegativeInt = 0
    nodes_per_pipeline: NonNegativeInt = 0
    free_nodes: NonNegativeInt = 0
    """Healthy, not excluded nodes of the type with enough free devices."""
    total_nodes: NonNegativeInt = 0
    busy_nodes: NonNegativeInt = 0
    unhealthy_nodes: NonNegativeInt = 0
    excluded_nodes: NonNegativeInt = 0
    largest_free_block_in_rack: NonNegativeInt = 0
    pipelines_that_fit_in_racks: NonNegativeInt = 0
    permanent: bool = False
    """True when waiting cannot help on this cluster (the type is missing, TP exceeds a node,
    the job wants more devices of the type than the cluster has at all, healthy or not)."""


class Unschedulable(TrainyardError):
    """The gang cannot be placed; `reason` says why, in numbers. Raise it through `of`, which
    picks the subclass that says whether waiting helps: for a gang scheduler "not now" is
    transient (devices free up, nodes heal), "never on this cluster" is fatal."""

    def __init__(self, reason: PendingReason) -> None:
        self.reason = reason
        super().__init__(reason.message)

    @staticmethod
    def of(reason: PendingReason) -> Unschedulable:
        return NeverSchedulable(reason) if reason.permanent else NotSchedulableNow(reason)


class NotSchedulableNow(Unschedulable, TransientError):
    """The devices exist but are busy, unhealthy or excluded right now: retry later."""


class NeverSchedulable(Unschedulable, FatalError):
    """This cluster can never run the gang as asked: change the spec or the cluster."""
