"""Properties over random fleets, occupancies and jobs (hypothesis).

1. A placement never breaks a hard constraint (checked by the independent checker).
2. The search is complete: when some admissible ranks-per-node has enough eligible nodes, it
   places the job; when it refuses, the numbers in the reason say why.
3. Preemption evicts whole gangs only, never one of higher or equal effective priority, and
   its placement fits on the free devices plus exactly the victims' devices.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.placement.placement_fixtures import make_cluster
from trainyard.config.teams import Teams
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.placement.constraints import hard_violations
from trainyard.plugins.placement.fairshare import (
    RunningGang,
    effective_priority,
    plan_preemption,
    team_usage,
)
from trainyard.plugins.placement.gang import place_gang, slots_per_node_options
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest, Unschedulable

TYPES = ("H100", "A100_80GB")


@st.composite
def fleets(draw: st.DrawFn) -> tuple[Inventory, dict[str, int]]:
    racks = draw(st.lists(st.tuples(st.integers(1, 6), st.sampled_from([1, 2, 4, 8]), st.sampled_from(TYPES)),
                          min_size=1, max_size=6))
    cluster = make_cluster(racks)
    names = [n.name for n in cluster.nodes]
    unhealthy = draw(st.sets(st.sampled_from(names), max_size=len(names) // 3))
    inv = Inventory.from_cluster(make_cluster(racks, {n: {"healthy": False} for n in unhealthy}))
    free = {n.name: draw(st.integers(0, n.gpus)) for n in inv.nodes}
    return inv, free


@st.composite
def requests(draw: st.DrawFn, inv: Inventory) -> GangRequest:
    names = [n.name for n in inv.nodes]
    return GangRequest(
        job="j", gpu_type=draw(st.sampled_from(TYPES)), layout=RankLayout(tp=draw(st.sampled_from([1, 2, 4, 8])), pp=draw(st.integers(1, 4)), dp=draw(st.integers(1, 6)), cp=draw(st.sampled_from([1, 1, 2]))),
        nodes_preferred=draw(st.none() | st.integers(1, 8)),
        exclude=frozenset(draw(st.sets(st.sampled_from(names), max_size=3))),
        require_pp_in_rack=draw(st.booleans()),)


def eligible_count(inv: Inventory, request: GangRequest, free: dict[str, int], k: int) -> int:
    return sum(1 for n in inv.nodes if n.gpu_type == request.gpu_type and n.healthy
               and n.name not in request.exclude and free[n.name] >= k)


def test_hard_constraints_hold_and_search_is_complete() -> None:
    """Every placement keeps the hard constraints; every refusal is justified. A property test
    whose examples were all refusals would prove nothing about placements: count them."""
    outcomes: Counter[str] = Counter()
    _placements_hold(outcomes)
    assert outcomes["placed"] >= 10, f"too few examples were placed to test anything: {dict(outcomes)}"
    assert outcomes["refused"] >= 1, dict(outcomes)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def _placements_hold(outcomes: Counter[str], data: st.DataObject) -> None:
    inv, free = data.draw(fleets())
    request = data.draw(requests(inv))
    per_node = inv.gpus_per_node(request.gpu_type)
    try:
        placement = place_gang(request, inv, free)
    except Unschedulable as e:
        reason = e.reason
        if reason.code == "no_gpu_type":
            assert per_node == 0
        elif reason.code == "tp_exceeds_node":
            assert request.layout.tp > per_node
        else:
            assert per_node > 0 and request.layout.tp <= per_node
            for k in slots_per_node_options(request, per_node):
                nodes = request.layout.world_size // k
                if not request.require_pp_in_rack:
                    assert eligible_count(inv, request, free, k) < nodes, f"k={k} had room"
            if reason.code == "not_enough_nodes":
                assert reason.free_nodes < reason.needed_nodes
            else:
                assert reason.code == "pp_blocks" and request.require_pp_in_rack
        outcomes["refused"] += 1
        return
    outcomes["placed"] += 1
    assert hard_violations(placement, request, inv, free) == []
    ranks = sorted(r for g in placement.groups_of("tp") for r in g.ranks) if request.layout.tp > 1 else []
    assert ranks in ([], list(range(request.layout.world_size)))
    if request.require_pp_in_rack and request.layout.pp > 1:
        in_rack, total = placement.pp_groups_in_one_rack()
        assert in_rack == total


PRIORITIES = ("critical", "high", "normal", "low", "preemptible")


@st.composite
def busy_fleets(draw: st.DrawFn) -> tuple[Inventory, dict[str, int], list[RunningGang]]:
    """A one-type fleet filled (partly) by random whole-node gangs."""
    racks = draw(st.integers(1, 4))
    per_rack = draw(st.integers(2, 6))
    inv = Inventory.from_cluster(make_cluster([(per_rack, 8, "H100", racks)]))
    free = inv.free_map()
    running: list[RunningGang] = []
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(draw(st.integers(0, 8))):
        size = draw(st.integers(1, 3))
        nodes = [n.name for n in inv.nodes if free[n.name] == 8][:size]
        if len(nodes) < size:
            break
        for n in nodes:
            free[n] = 0
        running.append(RunningGang(
            job=f"g{i}", team=draw(st.sampled_from(["a", "b", "c"])), priority=draw(st.sampled_from(PRIORITIES)),
            gpu_type="H100", nodes=dict.fromkeys(nodes, 8), started_at=now - timedelta(hours=2),
            last_checkpoint_at=draw(st.none() | st.just(now - timedelta(minutes=draw(st.integers(0, 100)))))))
    return inv, free, running


TEAMS = Teams.model_validate({"teams": {"a": {"share": 0.5}, "b": {"share": 0.3}, "c": {"share": 0.2}}})


def test_preemption_evicts_whole_lower_priority_gangs_only() -> None:
    """Counted like the placement property: examples that placed, and among them examples that
    placed by evicting someone — else the victim checks never ran."""
    outcomes: Counter[str] = Counter()
    _preemption_holds(outcomes)
    assert outcomes["evicted"] >= 5, f"too few examples preempted anything: {dict(outcomes)}"
    assert outcomes["placed"] >= outcomes["evicted"] and outcomes["refused"] >= 1, dict(outcomes)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def _preemption_holds(outcomes: Counter[str], data: st.DataObject) -> None:
    inv, free, running = data.draw(busy_fleets())
    request = GangRequest(job="new", team=data.draw(st.sampled_from(["a", "b", "c"])),
                          priority=data.draw(st.sampled_from(PRIORITIES)), gpu_type="H100", layout=RankLayout(tp=8, dp=data.draw(st.integers(1, 4))))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    try:
        plan = plan_preemption(request, inv, free, running, TEAMS, now=now)
    except Unschedulable:
        outcomes["refused"] += 1
        return
    outcomes["placed"] += 1
    outcomes["evicted"] += bool(plan.victims)
    by_job = {g.job: g for g in running}
    usage = team_usage(running)
    usage[request.team] = usage.get(request.team, 0) + request.layout.world_size  # ranked as if admitted
    freed = dict(free)
    for victim in plan.victims:
        gang = by_job[victim.job]
        assert victim.nodes == gang.nodes  # the whole gang, every node of it
        assert victim.effective_priority < plan.pending_priority
        assert victim.effective_priority == round(effective_priority(
            gang.priority, usage[gang.team], TEAMS.teams[gang.team].share * inv.total_gpus()), 3)
        for node, gpus in gang.nodes.items():
            freed[node] += gpus
    assert hard_violations(plan.placement, request, inv, freed) == []
    assert len({v.job for v in plan.victims}) == len(plan.victims)
