from __future__ import annotations

import pytest

from tests.unit.placement.placement_fixtures import busy, inventory
from trainyard.config.cluster import load_cluster
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.placement.baseline import place_first_fit
from trainyard.plugins.placement.constraints import hard_violations
from trainyard.plugins.placement.gang import place_gang, slots_per_node_options
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest, Placement, Unschedulable


@pytest.fixture(scope="module")
def fleet() -> Inventory:
    return Inventory.from_cluster(load_cluster("h100-fleet"))


def seed_job(**kw: object) -> GangRequest:
    values: dict[str, object] = dict(job="gpt-200b", gpu_type="H100", layout=RankLayout(tp=8, pp=4, dp=8))
    values.update(kw)
    return GangRequest.model_validate(values)


def test_seed_200b_job_keeps_every_pipeline_in_a_rack_and_spreads_replicas(fleet: Inventory) -> None:
    request = seed_job()
    free = fleet.free_map()
    placement = place_gang(request, fleet, free)
    assert hard_violations(placement, request, fleet, free) == []
    assert len(placement.nodes) == 32 and placement.layout.ranks_per_node == 8
    assert placement.pp_groups_in_one_rack() == (64, 64)
    # DP replicas spread: 8 replicas of 4 nodes, each in its own rack.
    racks_of_replica = {d: {n.rack for n in placement.nodes if d in n.dp_replicas} for d in range(8)}
    assert all(len(r) == 1 for r in racks_of_replica.values())
    assert len({next(iter(r)) for r in racks_of_replica.values()}) == 8
    # Unhealthy nodes of the fleet file are never used.
    assert {"rack-007-n3", "rack-101-n2"}.isdisjoint(placement.node_names)


def test_group_map_matches_rank_layout(fleet: Inventory) -> None:
    placement = place_gang(seed_job(), fleet)
    names = placement.node_names
    tp = placement.groups_of("tp")
    assert len(tp) == 32 and all(g.nodes == [names[g.index]] for g in tp)
    pp = placement.groups_of("pp")
    # The worker's mesh order (pp, dp, cp, tp): a pipeline's stages are dp·tp = 64 ranks apart.
    assert pp[0].ranks == [0, 64, 128, 192] and pp[0].nodes == names[0:32:8]
    assert len(pp[0].racks) == 1
    dp = placement.groups_of("dp")
    assert dp[0].ranks == [0, 8, 16, 24, 32, 40, 48, 56]
    assert len(dp[0].racks) == 8
    node = placement.nodes[5]
    assert (node.first_rank, node.pp_stages, node.dp_replicas, node.tp_groups) == (40, [0], [5], [5])


def test_placement_json_round_trips(fleet: Inventory) -> None:
    placement = place_gang(seed_job(), fleet)
    assert Placement.model_validate_json(placement.model_dump_json()) == placement


def test_excluded_unhealthy_and_other_types_are_never_used() -> None:
    inv = inventory([(4, 8, "H100"), (4, 8, "A100_80GB"), (4, 8, "H100")], health={"r0-n1": {"healthy": False}})
    request = GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8, dp=6), exclude=frozenset({"r2-n0"}))
    placement = place_gang(request, inv)
    assert hard_violations(placement, request, inv, inv.free_map()) == []
    used = set(placement.node_names)
    assert used == {"r0-n0", "r0-n2", "r0-n3", "r2-n1", "r2-n2", "r2-n3"}


def test_tp_group_never_split_across_nodes_even_when_only_halves_are_free() -> None:
    inv = inventory([(4, 8, "H100")])
    free = busy(inv, {n.name: 4 for n in inv.nodes})  # every node half full
    with pytest.raises(Unschedulable) as e:
        place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8)), inv, free)
    assert e.value.reason.code == "not_enough_nodes"
    # tp=4 fits in the halves: two nodes × 4 ranks.
    placement = place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=4, dp=2)), inv, free)
    assert placement.layout.ranks_per_node == 4 and len(placement.nodes) == 2


def test_smaller_ranks_per_node_only_when_whole_nodes_are_missing() -> None:
    inv = inventory([(4, 8, "H100")])
    request = GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=2, dp=8))
    assert slots_per_node_options(request, 8) == [8, 4, 2]
    assert place_gang(request, inv).layout.ranks_per_node == 8
    half = busy(inv, {n.name: 4 for n in inv.nodes})
    assert place_gang(request, inv, half).layout.ranks_per_node == 4


def test_nodes_preferred_hint_sets_ranks_per_node() -> None:
    inv = Inventory.from_cluster(load_cluster("local"))
    two = place_gang(GangRequest(job="j", gpu_type="cpu", layout=RankLayout(dp=2), nodes_preferred=2), inv)
    assert two.node_names == ["local-0", "local-1"] and two.layout.ranks_per_node == 1
    one = place_gang(GangRequest(job="j", gpu_type="cpu", layout=RankLayout(dp=2)), inv)
    assert len(one.nodes) == 1 and one.layout.ranks_per_node == 2


def test_best_fit_fills_holes_before_opening_a_free_rack() -> None:
    inv = inventory([(8, 8, "H100", 3)])
    used = {f"r0-n{i}": 8 for i in range(8)} | {f"r1-n{i}": 8 for i in range(6)}  # r1 has 2 free, r2 8
    placement = place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8)), inv, busy(inv, used))
    assert placement.nodes[0].rack == "r1"


def test_small_job_prefers_a_partly_used_node() -> None:
    inv = inventory([(2, 8, "H100")])
    free = busy(inv, {"r0-n1": 4})
    placement = place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=2, dp=2)), inv, free)
    assert placement.node_names == ["r0-n1"]


def test_prefers_nodes_without_xid_errors_and_with_warm_cache() -> None:
    inv = inventory([(4, 8, "H100")], health={
        "r0-n0": {"xidErrors7d": 5}, "r0-n1": {"cachedDatasets": ["s3://d/"]}})
    clean = place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8, dp=2)), inv)
    assert "r0-n0" not in clean.node_names
    warm = place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8), dataset="s3://d/"), inv)
    assert warm.node_names == ["r0-n1"] and warm.score_breakdown["cache"] == 3


def test_pipelines_split_only_when_no_rack_can_hold_one() -> None:
    inv = inventory([(3, 8, "H100", 4)])  # racks of 3 nodes; pipelines of 4 nodes
    request = GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8, pp=4, dp=2))
    placement = place_gang(request, inv)
    in_rack, total = placement.pp_groups_in_one_rack()
    assert (in_rack, total) == (0, 16)
    assert hard_violations(placement, request, inv, inv.free_map()) == []
    # Each pipeline spans the fewest racks possible: 2.
    assert all(len(g.racks) == 2 for g in placement.groups_of("pp"))
    with pytest.raises(Unschedulable) as e:
        place_gang(request.model_copy(update={"require_pp_in_rack": True}), inv)
    reason = e.value.reason
    assert reason.code == "pp_blocks" and reason.largest_free_block_in_rack == 3
    assert "racks can hold 0 of the 2 pipelines of 4 nodes" in reason.message


def test_unschedulable_message_carries_the_numbers() -> None:
    # 9 racks: 27 free nodes in blocks of 3 (the rest busy), one unhealthy, one excluded.
    inv = inventory([(8, 8, "H100", 9)], health={"r0-n7": {"healthy": False}})
    used = {f"r{r}-n{i}": 8 for r in range(9) for i in range(3, 7)}
    request = GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8, pp=4, dp=8), exclude=frozenset({"r1-n7"}))
    free = busy(inv, used | {f"r{r}-n7": 8 for r in range(2, 9)})
    with pytest.raises(Unschedulable) as e:
        place_gang(request, inv, free)
    reason = e.value.reason
    assert reason.message == (
        "needs 32 healthy H100 nodes with 8 free devices each and PP groups of 4 nodes in one rack; "
        "27 free (of 72: 43 busy, 1 unhealthy, 1 excluded); largest free block in a rack: 3")
    assert (reason.needed_nodes, reason.free_nodes, reason.largest_free_block_in_rack) == (32, 27, 3)


def test_unknown_type_and_oversized_tp_are_explained() -> None:
    inv = inventory([(2, 8, "H100")])
    with pytest.raises(Unschedulable, match=r"no A100_80GB nodes in this cluster \(it has: H100\)"):
        place_gang(GangRequest(job="j", gpu_type="A100_80GB"), inv)
    with pytest.raises(Unschedulable, match="TP degree 16 exceeds the 8 H100 devices"):
        place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=16)), inv)


def test_topology_aware_search_beats_first_fit_on_a_fragmented_fleet() -> None:
    inv = inventory([(8, 8, "H100", 6)])
    # Every rack has its first two nodes taken: first fit straddles racks, the search does not.
    free = busy(inv, {f"r{r}-n{i}": 8 for r in range(6) for i in range(2)})
    request = GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8, pp=4, dp=3))
    searched = place_gang(request, inv, free)
    first = place_first_fit(request, inv, free)
    assert searched.pp_groups_in_one_rack() == (24, 24)
    assert first.pp_groups_in_one_rack()[0] < 24
    assert hard_violations(first, request, inv, free) == []


def test_for_job_builds_the_request_from_spec_and_plan() -> None:
    from trainyard.config.loader import load_spec_file
    from trainyard.plugins.advisor.plan import Plan

    job = load_spec_file("config/jobs/demo-tiny-lm.yaml")
    request = GangRequest.for_job(job, Plan(layout=RankLayout(dp=2)), attempt=3, exclude={"local-1"})
    assert (request.job, request.team, request.gpu_type, request.layout.dp, request.attempt) == (
        "demo-tiny-lm", "demo", "cpu", 2, 3)
    assert request.exclude == frozenset({"local-1"}) and request.dataset == "datasets/pydoc-topics/"
    with pytest.raises(ValueError, match=r"= 4 != WORLD_SIZE\(2\)"):
        GangRequest.for_job(job, Plan(layout=RankLayout(dp=4)))
