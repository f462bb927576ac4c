"""Fair share and preemption (seed §4).

Effective priority = base priority − over-share penalty + starvation bonus:

    base       critical 1000, high 800, normal 500, low 200, preemptible 50
    penalty    (usage / guaranteed − 1) · 1000 when a team is above its guaranteed share
               (each 10 % over share costs 100 — a borrowed `normal` job drops below `low`
               once its team is 30 % over)
    bonus      min(hours waiting · 20, 200) — a job never starves forever

`usage` is what the team would hold once the pending gang is admitted: its current devices plus
the request for the pending gang's team, the current devices for every other team. So a request
that pushes its team over its share is ranked as the borrowing it would be, and a pending gang
and a running gang of the same team carry the same penalty — within a team only the base
priority (and waiting time) decides, as seed §4 wants ("critical jobs preempt others within
team"). Priorities are rounded to 1e-6 so float noise never makes a tie look like "lower".

Preemption evicts whole gangs only, lowest effective priority first, then those that lose the
least work (most recent checkpoint), and only gangs strictly below the pending job's effective
priority. It adds victims until the pending gang can be placed, then drops any victim the
placement turns out not to need, and returns the victims so the caller can checkpoint them
before evicting (seed §4: "the platform triggers a checkpoint before evicting").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

from trainyard.config.teams import Teams
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest, PendingReason, Placement, Unschedulable
from trainyard.plugins.placement.scoring import ScoreWeights

BASE_PRIORITY: dict[str, float] = {
    "critical": 1000.0, "high": 800.0, "normal": 500.0, "low": 200.0, "preemptible": 50.0,
}
OVER_SHARE_PENALTY = 1000.0
"""Priority lost per 100 % of usage above the guaranteed share."""
STARVATION_BONUS_PER_HOUR = 20.0
STARVATION_BONUS_MAX = 200.0


def effective_priority(
    priority: str,
    team_gpus: int,
    guaranteed_gpus: float,
    *,
    waiting_s: float = 0.0,
) -> float:
    """Seed §4's `compute_effective_priority`. A team with no guaranteed share is treated as
    guaranteed one device, so any usage is borrowing and is penalised accordingly."""
    if priority not in BASE_PRIORITY:
        raise ValueError(f"unknown priority {priority!r}; expected one of {', '.join(BASE_PRIORITY)}")
    value = BASE_PRIORITY[priority]
    ratio = team_gpus / max(guaranteed_gpus, 1.0)
    if ratio > 1.0:
        value -= (ratio - 1.0) * OVER_SHARE_PENALTY
    bonus = min(max(waiting_s, 0.0) / 3600.0 * STARVATION_BONUS_PER_HOUR, STARVATION_BONUS_MAX)
    return round(value + bonus, 6)


class RunningGang(BaseModel):
    """A gang holding devices: what preemption may evict (always as a whole)."""

    model_config = ConfigDict(frozen=True)

    job: str
    run: str = ""
    attempt: NonNegativeInt = 0
    team: str
    priority: str = "normal"
    gpu_type: str
    nodes: dict[str, int]
    """Devices held per node."""
    started_at: datetime
    last_checkpoint_at: datetime | None = None

    @property
    def gpus(self) -> int:
        return sum(self.nodes.values())

    def work_at_risk_s(self, now: datetime) -> float:
        """Seconds of training lost if evicted now (since the last checkpoint, or the start)."""
        since = self.last_checkpoint_at or self.started_at
        return max((now - since).total_seconds(), 0.0)


class Victim(BaseModel):
    model_config = ConfigDict(frozen=True)

    job: str
    run: str = ""
    """The training run whose attempt holds the devices (with `attempt`, the reservation's key)."""
    attempt: int
    team: str
    gpus: int
    nodes: dict[str, int]
    effective_priority: float
    work_at_risk_s: float
    """Checkpoint before evicting to bring this to ~0."""


class PreemptionPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    pending_priority: float
    victims: list[Victim] = Field(default_factory=list)
    placement: Placement
    """Where the pending gang goes once the victims are gone."""


def team_usage(running: Sequence[RunningGang]) -> dict[str, int]:
    usage: dict[str, int] = {}
    for gang in running:
        usage[gang.team] = usage.get(gang.team, 0) + gang.gpus
    return usage


def guaranteed_gpus(teams: Teams, team: str, total_gpus: int) -> float:
    spec = teams.get(team)
    return (spec.share if spec else 0.0) * total_gpus


def plan_preemption(
    request: GangRequest,
    inventory: Inventory,
    free: Mapping[str, int],
    running: Sequence[RunningGang],
    teams: Teams,
    *,
    now: datetime | None = None,
    submitted_at: datetime | None = None,
    weights: ScoreWeights | None = None,
) -> PreemptionPlan:
    """Place `request`, evicting whole lower-priority gangs if it does not fit as things stand.

    Returns a plan with no victims when it fits already. Raises `Unschedulable` when even
    evicting every eligible gang would not make room (then nothing should be evicted).
    """
    now = now or datetime.now(UTC)
    total = inventory.total_gpus()
    usage = team_usage(running)
    usage[request.team] = usage.get(request.team, 0) + request.layout.world_size  # once admitted
    pending = effective_priority(
        request.priority, usage[request.team],
        guaranteed_gpus(teams, request.team, total),
        waiting_s=(now - submitted_at).total_seconds() if submitted_at else 0.0)
    try:
        return PreemptionPlan(pending_priority=pending,
                              placement=place_gang(request, inventory, free, weights=weights))
    except Unschedulable as first:
        blocked = first.reason
    ranked = sorted(
        ((effective_priority(g.priority, usage.get(g.team, 0), guaranteed_gpus(teams, g.team, total)), g)
         for g in running if g.job != request.job and g.gpu_type == request.gpu_type),
        key=lambda pair: (pair[0], pair[1].work_at_risk_s(now), -pair[1].gpus, pair[1].job),
    )
    candidates = [(prio, gang) for prio, gang in ranked if prio < pending]
    chosen: list[tuple[float, RunningGang]] = []
    placement: Placement | None = None
    for candidate in candidates:
        chosen.append(candidate)
        placement = _try_place(request, inventory, free, [g for _, g in chosen], weights)
        if placement is not None:
            break
    if placement is None:
        raise Unschedulable.of(_no_room(blocked, candidates, pending))
    # Drop victims the placement does not need, most valuable first.
    for candidate in sorted(chosen, key=lambda pair: (-pair[0], -pair[1].work_at_risk_s(now))):
        rest = [g for p, g in chosen if (p, g) != candidate]
        attempt = _try_place(request, inventory, free, rest, weights)
        if attempt is not None:
            chosen.remove(candidate)
            placement = attempt
    victims = [Victim(job=g.job, run=g.run, attempt=g.attempt, team=g.team, gpus=g.gpus, nodes=dict(g.nodes),
                      effective_priority=round(p, 3), work_at_risk_s=round(g.work_at_risk_s(now), 3))
               for p, g in chosen]
    return PreemptionPlan(pending_priority=round(pending, 3), victims=victims, placement=placement)


def _try_place(request: GangRequest, inventory: Inventory, free: Mapping[str, int],
               evicted: Sequence[RunningGang], weights: ScoreWeights | None) -> Placement | None:
    freed = dict(free)
    for gang in evicted:
        for node, gpus in gang.nodes.items():
            freed[node] = freed.get(node, 0) + gpus
    try:
        return place_gang(request, inventory, freed, weights=weights)
    except Unschedulable:
        return None


def _no_room(blocked: PendingReason, candidates: Sequence[tuple[float, RunningGang]],
             pending: float) -> PendingReason:
    gpus = sum(g.gpus for _, g in candidates)
    extra = (f"; preempting all {len(candidates)} lower-priority gangs ({gpus} devices, effective "
             f"priority < {pending:.0f}) would not make room" if candidates
             else f"; no running gang has a lower effective priority than {pending:.0f}")
    return blocked.model_copy(update={"message": blocked.message + extra})
