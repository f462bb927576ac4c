"""The indexed search places exactly as the plain one did.

`place_gang` reads the fleet through column indexes (`TypeIndex`, and the free counts a
`FreeDevices` map keeps in step with its writes). The oracle below is the search as it was
written before those indexes (plugins/placement/gang.py at 0f143c8^): a Python loop over
`Node` objects, rack by rack. On a seeded random fleet — mixed GPU types and node sizes,
unhealthy nodes, Xid errors, warm caches — a random sequence of placements and releases must
get the same nodes in the same rank order, the same strategy and score, and the same refusals,
whether the free map is the inventory's indexed one or a plain dict.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from tests.unit.placement.placement_fixtures import make_cluster
from trainyard.config.cluster import Node
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.placement.gang import (
    STRATEGIES,
    build_placement,
    place_gang,
    slots_per_node_options,
)
from trainyard.plugins.placement.inventory import FreeDevices, Inventory
from trainyard.plugins.placement.model import GangRequest, Placement, Unschedulable
from trainyard.plugins.placement.scoring import ScoreWeights

DATASET = "s3://bucket/datasets/web/"


def plain_search(request: GangRequest, inv: Inventory, free: Mapping[str, int]) -> Placement | None:
    """The pre-index search, over `Node` objects (None where it cannot place)."""
    per_node = max((n.gpus for n in inv.nodes if n.gpu_type == request.gpu_type), default=0)
    if request.layout.tp > per_node:
        return None
    for k in slots_per_node_options(request, per_node):
        layout = request.layout.with_ranks_per_node(k)
        by_rack: dict[str, list[Node]] = {}
        for rack, members in inv.racks.items():
            keyed = [((n.xid_errors_7d, 0 if request.dataset in n.cached_datasets else 1,
                       int(free.get(n.name, 0)), position), n)
                     for position, n in enumerate(members)
                     if n.gpu_type == request.gpu_type and n.healthy and n.name not in request.exclude
                     and int(free.get(n.name, 0)) >= k]
            if keyed:
                by_rack[rack] = [n for _, n in sorted(keyed, key=lambda item: item[0])]
        m = layout.nodes_per_pipeline()
        units = layout.num_nodes // m
        if (sum(map(len, by_rack.values())) < layout.num_nodes
                or (request.require_pp_in_rack and sum(len(p) // m for p in by_rack.values()) < units)):
            continue
        best: Placement | None = None
        for strategy in STRATEGIES:
            chosen = _plain_assign(strategy, by_rack, inv.rack_order, m, units)
            ordered: list[Node] = [chosen[0]] * len(chosen)
            position = iter(chosen)
            for unit in layout.replica_nodes():
                for index in unit:
                    ordered[index] = next(position)
            candidate = build_placement(request, layout, ordered, inv, free, weights=ScoreWeights(),
                                        strategy=strategy)
            if best is None or candidate.score > best.score:
                best = candidate
        return best
    return None


def _plain_assign(strategy: str, by_rack: Mapping[str, list[Node]], order: Mapping[str, int],
                  m: int, units: int) -> list[Node]:
    pools = {rack: list(nodes) for rack, nodes in by_rack.items()}
    used: set[str] = set()
    chosen: list[Node] = []
    for _ in range(units):
        fitting = [r for r, p in pools.items() if len(p) >= m]
        if fitting:
            if strategy == "spread":
                fitting = [r for r in fitting if r not in used] or fitting
            rack = min(fitting, key=lambda r: (len(pools[r]), order[r]))
            chosen.extend(pools[rack][:m])
            del pools[rack][:m]
            used.add(rack)
            continue
        need = m
        for rack in sorted(pools, key=lambda r: (-len(pools[r]), order[r])):
            take = min(need, len(pools[rack]))
            if take:
                chosen.extend(pools[rack][:take])
                del pools[rack][:take]
                used.add(rack)
                need -= take
            if need == 0:
                break
    return chosen


def random_fleet(rng: random.Random) -> Inventory:
    racks = [(rng.randint(2, 10), rng.choice([4, 8, 8]), rng.choice(["H100", "H100", "A100_80GB"]))
             for _ in range(14)]
    names = [n.name for n in make_cluster(racks).nodes]
    health: dict[str, dict[str, object]] = {}
    for name in names:
        entry: dict[str, object] = {}
        if rng.random() < 0.08:
            entry["healthy"] = False
        if rng.random() < 0.2:
            entry["xidErrors7d"] = rng.randint(1, 3)
        if rng.random() < 0.2:
            entry["cachedDatasets"] = [DATASET]
        if entry:
            health[name] = entry
    return Inventory.from_cluster(make_cluster(racks, health))


def random_request(rng: random.Random, inv: Inventory, i: int) -> GangRequest:
    names = [n.name for n in inv.nodes]
    return GangRequest(
        job=f"j{i}", gpu_type=rng.choice(["H100", "A100_80GB"]),
        layout=RankLayout(tp=rng.choice([1, 2, 4, 8]), pp=rng.choice([1, 1, 2, 4]), dp=rng.randint(1, 6),
                          cp=rng.choice([1, 1, 1, 2])),
        nodes_preferred=rng.choice([None, None, rng.randint(1, 8)]),
        exclude=frozenset(rng.sample(names, rng.choice([0, 0, 1, 3]))),
        dataset=rng.choice([None, DATASET]), require_pp_in_rack=rng.random() < 0.2)


def _outcome(request: GangRequest, inv: Inventory, free: Mapping[str, int]) -> Placement | None:
    try:
        return place_gang(request, inv, free)
    except Unschedulable:
        return None


def _same(a: Placement | None, b: Placement | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.node_names, a.strategy, a.score, a.layout) == (b.node_names, b.strategy, b.score, b.layout)


def test_indexed_search_places_as_the_plain_search_did() -> None:
    rng = random.Random(58)
    inv = random_fleet(rng)
    indexed = inv.free_map()
    plain = dict(indexed)
    running: list[Placement] = []
    placed = refused = 0
    for i in range(400):
        if running and rng.random() < 0.3:  # a gang ends: its devices come back
            for node in running.pop(rng.randrange(len(running))).nodes:
                indexed[node.name] += node.slots
                plain[node.name] += node.slots
            continue
        request = random_request(rng, inv, i)
        expected = plain_search(request, inv, plain)
        got, got_from_dict = _outcome(request, inv, indexed), _outcome(request, inv, plain)
        assert _same(got, expected), f"request {i}: {request!r}"
        assert _same(got_from_dict, expected), f"request {i} (plain dict): {request!r}"
        if got is None:
            refused += 1
            continue
        placed += 1
        running.append(got)
        for node in got.nodes:
            indexed[node.name] -= node.slots
            plain[node.name] -= node.slots
    assert placed > 50 and refused > 20, (placed, refused)  # both paths were exercised
    assert dict(indexed) == plain
    assert all(inv.free_rows(t, indexed).tolist() == inv.of_type(t).free_counts(plain).tolist()
               for t in ("H100", "A100_80GB"))


def test_a_node_left_out_of_the_indexed_map_has_no_free_device() -> None:
    inv = Inventory.from_cluster(make_cluster([(2, 8, "H100")]))
    free = inv.free_map()
    assert isinstance(free, FreeDevices) and inv.free_rows("H100", free).tolist() == [8, 8]
    del free["r0-n0"]
    assert inv.free_rows("H100", free).tolist() == [0, 8]
    assert place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8)), inv, free).node_names == ["r0-n1"]
    other = Inventory.from_cluster(make_cluster([(2, 8, "H100")]))
    assert other.free_rows("H100", free).tolist() == [0, 8]  # another inventory reads it as a mapping
