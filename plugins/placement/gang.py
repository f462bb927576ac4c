"""Gang placement: all or nothing, topology-aware, searched rather than scored once.

Hard constraints (a candidate that breaks one is never built):
  * every node has the job's GPU type, is healthy and is not excluded;
  * every node has at least `k` free devices, `k` = ranks per node, the same on every node;
  * `k` is a multiple of `tp`, so each TP group (tp consecutive ranks, see
    `plugins/advisor/rank_layout.py`) sits on one node;
  * the whole world size is placed, or nothing is (`Unschedulable`).

Preferences (ranked by `scoring.score_candidate`): each model replica's nodes (the nodes its
TP, CP and PP groups touch, `RankLayout.replica_nodes()`) inside one rack, replicas spread over
racks, least fragmentation (best fit), fewest recent Xid errors, warm dataset cache.

The search, for each admissible `k` (largest first, so jobs use as few nodes as possible):
  1. Pool the eligible nodes per rack, best nodes first (fewest Xid errors, warm cache,
     partially used before wholly free so small jobs fill holes).
  2. A replica needs the `m` nodes of one `replica_nodes()` set (the worker's mesh puts PP
     outermost, so with `k` dividing dp·cp·tp that is `pp` nodes spaced dp·cp·tp/k apart in
     rank order). Build candidates by assigning replica sets ("pipelines") to racks:
       - `spread`: best-fit over racks this job does not use yet, then over all racks;
       - `pack`:   best-fit over all racks (fills one rack before the next).
     A pipeline no rack can hold whole is split over the fewest racks (largest first).
  3. Put each unit's nodes at its set's positions in rank order (`_in_rank_order`), score each
     candidate, keep the best.
If no `k` has enough free nodes, `Unschedulable` explains the shortfall in numbers, for the
preferred `k`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from trainyard.config.cluster import Node
from trainyard.plugins.advisor.rank_layout import GroupKind, RankLayout
from trainyard.plugins.placement.inventory import Inventory, TypeIndex
from trainyard.plugins.placement.model import (
    GangRequest,
    Group,
    PendingReason,
    PlacedNode,
    Placement,
    Unschedulable,
)
from trainyard.plugins.placement.scoring import ScoreWeights, score_candidate

STRATEGIES: tuple[str, ...] = ("spread", "pack")


@dataclass
class _Pools:
    """Eligible nodes per rack and why the others are not eligible.

    `counts[r]` is how many eligible nodes rack `r` (its `rack_order`) holds; the nodes
    themselves, best first, are sorted only for the racks the search takes from (`nodes`).
    """

    index: TypeIndex
    eligible: np.ndarray
    free_rows: np.ndarray
    dataset: str | None
    counts: np.ndarray
    total: int
    unhealthy: int
    excluded: int
    busy: int
    _sorted: dict[int, list[Node]] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return int(self.counts.sum())

    @property
    def largest_block(self) -> int:
        return int(self.counts.max(initial=0))

    def pipelines_in_racks(self, m: int) -> int:
        return int((self.counts // m).sum())

    def nodes(self, rack: int) -> list[Node]:
        """Rack `rack`'s eligible nodes, best first: fewest Xid errors, warm cache, fewest free
        devices (partially used before wholly free, so small jobs fill holes), rack position."""
        pool = self._sorted.get(rack)
        if pool is None:
            index, dataset = self.index, self.dataset
            keyed = []
            for row in range(int(index.rack_start[rack]), int(index.rack_start[rack + 1])):
                if self.eligible[row]:
                    node = index.nodes[row]
                    warm = 0 if dataset and dataset in node.cached_datasets else 1
                    keyed.append(((node.xid_errors_7d, warm, int(self.free_rows[row]),
                                   int(index.position[row])), node))
            keyed.sort(key=lambda item: item[0])
            pool = self._sorted[rack] = [node for _, node in keyed]
        return pool


def place_gang(
    request: GangRequest,
    inventory: Inventory,
    free: Mapping[str, int] | None = None,
    *,
    weights: ScoreWeights | None = None,
    strategies: Sequence[str] = STRATEGIES,
) -> Placement:
    """Place `request` on `inventory` given free devices per node (default: all free).

    Raises `Unschedulable` (with a `PendingReason` in numbers) when it cannot be placed now.
    """
    weights = weights or ScoreWeights()
    free = inventory.free_map() if free is None else free
    per_node = inventory.gpus_per_node(request.gpu_type)
    _check_feasible_at_all(request, inventory, per_node)
    first_reason: PendingReason | None = None
    index = inventory.of_type(request.gpu_type)
    free_rows = inventory.free_rows(request.gpu_type, free)
    for k in slots_per_node_options(request, per_node):
        layout = _shared(request.layout.with_ranks_per_node(k))
        pools = _eligible(request, index, free_rows, k)
        m = layout.nodes_per_pipeline()
        units = layout.num_nodes // m
        short = pools.free < layout.num_nodes
        if short or (request.require_pp_in_rack and pools.pipelines_in_racks(m) < units):
            first_reason = first_reason or _shortfall(request, layout, pools)
            continue
        best: tuple[float, dict[str, float], list[Node], str] | None = None
        for strategy in strategies:
            chosen = _in_rank_order(layout, _assign(strategy, pools, m, units,
                                                    strict=request.require_pp_in_rack))
            score, breakdown = _score(request, layout, chosen, inventory, free, weights)
            if best is None or score > best[0]:
                best = (score, breakdown, chosen, strategy)
        if best is None:
            raise ValueError("no placement strategies given; use STRATEGIES or a subset of it")
        return _placement(request, layout, best[2], best[0], best[1], best[3])
    if first_reason is None:  # slots_per_node_options always yields tp itself
        raise RuntimeError(f"no ranks-per-node option for {request!r}")
    too_big = request.layout.world_size > inventory.total_gpus(request.gpu_type)
    raise Unschedulable.of(first_reason.model_copy(update={"permanent": too_big}))


def slots_per_node_options(request: GangRequest, per_node: int) -> list[int]:
    """Admissible ranks-per-node values, preferred first.

    `k` must divide the world size, be a multiple of `tp` (TP inside a node), fit a node, and
    cut the replicas into node sets of one size (`RankLayout.replicas_tile_nodes`, so they can
    be placed as interchangeable units). `tp` itself always qualifies (it divides dp·cp·tp, the
    PP stride). A valid `nodesPreferred` hint goes first; then the largest `k` (fewest nodes).
    """
    world, tp = request.layout.world_size, request.layout.tp
    options = [k for k in range(min(per_node, world), tp - 1, -1)
               if k % tp == 0 and world % k == 0
               and _shared(request.layout.with_ranks_per_node(k)).replicas_tile_nodes()]
    if request.nodes_preferred and world % request.nodes_preferred == 0:
        hinted = world // request.nodes_preferred
        if hinted in options:
            options.remove(hinted)
            options.insert(0, hinted)
    return options


@lru_cache(maxsize=256)
def _shared(layout: RankLayout) -> RankLayout:
    """One instance per distinct layout, so its cached node sets (`RankLayout._replica_nodes`,
    a union-find over every rank) are computed once per shape, not once per request."""
    return layout


def _check_feasible_at_all(request: GangRequest, inventory: Inventory, per_node: int) -> None:
    if per_node == 0:
        types = sorted({n.gpu_type for n in inventory.nodes})
        raise Unschedulable.of(PendingReason(
            code="no_gpu_type", gpu_type=request.gpu_type, permanent=True,
            message=f"no {request.gpu_type} nodes in this cluster (it has: {', '.join(types)})"))
    if request.layout.tp > per_node:
        raise Unschedulable.of(PendingReason(
            code="tp_exceeds_node", gpu_type=request.gpu_type, permanent=True,
            message=f"TP degree {request.layout.tp} exceeds the {per_node} {request.gpu_type} devices of the "
                    f"largest node; a TP group must sit inside one node"))


def _eligible(request: GangRequest, index: TypeIndex, free_rows: np.ndarray, k: int) -> _Pools:
    """Which of the type's nodes can take `k` ranks: healthy, not excluded, `k` devices free."""
    excluded = np.zeros(len(index.nodes), dtype=bool)
    excluded[index.rows(request.exclude)] = True
    usable = index.healthy & ~excluded
    eligible = usable & (free_rows >= k)
    counts = np.bincount(index.rack[eligible], minlength=len(index.rack_start) - 1)
    return _Pools(index=index, eligible=eligible, free_rows=free_rows, dataset=request.dataset,
                  counts=counts, total=len(index.nodes), unhealthy=int((~index.healthy).sum()),
                  excluded=int((index.healthy & excluded).sum()), busy=int((usable & ~eligible).sum()))


def _assign(strategy: str, pools: _Pools, m: int, units: int, *, strict: bool = False) -> list[Node]:
    """Nodes in rank order: `units` pipelines of `m` nodes, each in one rack when possible.

    Racks are compared by their eligible counts alone (ties: the lower `rack_order`), so each
    pipeline costs a few numpy passes over the racks, not over the nodes.
    """
    counts = pools.counts.copy()
    taken = np.zeros(len(counts), dtype=np.int64)
    used = np.zeros(len(counts), dtype=bool)
    chosen: list[Node] = []
    spread = _SPREAD[strategy]

    def take(rack: int, n: int) -> None:
        chosen.extend(pools.nodes(rack)[taken[rack]:taken[rack] + n])
        taken[rack] += n
        counts[rack] -= n
        used[rack] = True

    for _ in range(units):
        fitting = counts >= m
        if fitting.any():
            if spread and (fresh := fitting & ~used).any():
                fitting = fresh
            take(_best_fit(fitting, counts), m)
            continue
        if strict:  # callers check capacity first; reaching here is a bug
            raise RuntimeError("no rack can hold a whole pipeline")
        # Split: the fewest racks, largest first, adjacent stages kept together.
        need = m
        for rack in np.argsort(-counts, kind="stable").tolist():
            n = min(need, int(counts[rack]))
            if n == 0:
                break
            take(rack, n)
            need -= n
            if need == 0:
                break
    return chosen


def _best_fit(fitting: np.ndarray, counts: np.ndarray) -> int:
    """The fitting rack with the fewest eligible nodes (argmin keeps the lowest rack order)."""
    return int(np.where(fitting, counts, np.iinfo(np.int64).max).argmin())


_SPREAD: dict[str, bool] = {"spread": True, "pack": False}
"""`spread`: best-fit over racks this job does not use yet, then over all racks; `pack`:
best-fit over all racks (fills one rack before the next)."""


def _in_rank_order(layout: RankLayout, chosen: Sequence[Node]) -> list[Node]:
    """`chosen` holds the units one after another (`m` nodes each); return the nodes in rank
    order, unit `u` at the positions of the layout's `u`-th replica node set."""
    ordered: list[Node | None] = [None] * len(chosen)
    position = iter(chosen)
    for unit in layout.replica_nodes():
        for index in unit:
            ordered[index] = next(position)
    return [node for node in ordered if node is not None]


def build_placement(
    request: GangRequest,
    layout: RankLayout,
    nodes: Sequence[Node],
    inventory: Inventory,
    free: Mapping[str, int],
    *,
    weights: ScoreWeights,
    strategy: str,
) -> Placement:
    """Turn nodes in rank order into a scored `Placement` with its group → node map."""
    score, breakdown = _score(request, layout, nodes, inventory, free, weights)
    return _placement(request, layout, nodes, score, breakdown, strategy)


def _score(request: GangRequest, layout: RankLayout, nodes: Sequence[Node], inventory: Inventory,
           free: Mapping[str, int], weights: ScoreWeights) -> tuple[float, dict[str, float]]:
    """A candidate's score (rounded as the `Placement` keeps it) and its breakdown; the search
    scores every candidate but builds the `Placement` of the winner only."""
    whole_before: dict[str, int] = {}
    whole_taken: dict[str, int] = {}
    for rack in {n.rack for n in nodes}:
        whole_before[rack] = sum(1 for n in inventory.racks[rack]
                                 if n.healthy and int(free.get(n.name, 0)) >= n.gpus)
    for node in nodes:
        if int(free.get(node.name, 0)) >= node.gpus:
            whole_taken[node.rack] = whole_taken.get(node.rack, 0) + 1
    score, breakdown = score_candidate(nodes, layout, whole_free_before=whole_before,
                                       whole_taken=whole_taken, dataset=request.dataset, weights=weights)
    return round(score, 3), breakdown


def _placement(request: GangRequest, layout: RankLayout, nodes: Sequence[Node], score: float,
               breakdown: Mapping[str, float], strategy: str) -> Placement:
    per_node, groups = _rank_map(layout)
    k = layout.ranks_per_node
    placed = [
        PlacedNode(name=node.name, rack=node.rack, address=node.address, gpu_type=node.gpu_type,
                   node_gpus=node.gpus, node_rank=i, first_rank=i * k, slots=k,
                   tp_groups=list(tp_groups), pp_stages=list(pp_stages), dp_replicas=list(dp_replicas))
        for i, (node, (tp_groups, pp_stages, dp_replicas)) in enumerate(zip(nodes, per_node, strict=True))
    ]
    return Placement(
        job=request.job, run=request.run, attempt=request.attempt, team=request.team, priority=request.priority,
        gpu_type=request.gpu_type, layout=layout, nodes=placed,
        groups=[Group(kind=kind, index=index, ranks=list(ranks), nodes=[nodes[i].name for i in members],
                      racks=sorted({nodes[i].rack for i in members}))
                for kind, index, ranks, members in groups],
        score=score, score_breakdown={key: round(v, 3) for key, v in breakdown.items()},
        strategy=strategy,
    )


_NodeRanks = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
_GroupNodes = tuple[GroupKind, int, tuple[int, ...], tuple[int, ...]]


@lru_cache(maxsize=256)
def _rank_map(layout: RankLayout) -> tuple[tuple[_NodeRanks, ...], tuple[_GroupNodes, ...]]:
    """What depends on the layout alone, computed once per shape (a fleet runs few shapes; a
    256-rank job's coordinates and groups cost milliseconds): per node index its TP groups,
    PP stages and DP replicas; per process group (kinds of degree > 1, in `tp cp pp dp` order)
    its kind, index, ranks and the node indices it touches, sorted."""
    k = layout.ranks_per_node
    per_node = []
    for i in range(layout.num_nodes):
        ranks = range(i * k, (i + 1) * k)
        coords = [layout.coords(r) for r in ranks]
        per_node.append((tuple(sorted({r // layout.tp for r in ranks})), tuple(sorted({c.pp for c in coords})),
                         tuple(sorted({c.dp for c in coords}))))
    kinds: list[GroupKind] = [kind for kind in ("tp", "cp", "pp", "dp") if getattr(layout, kind) > 1]
    groups = tuple((kind, index, tuple(ranks), tuple(sorted({r // k for r in ranks})))
                   for kind in kinds for index, ranks in enumerate(layout.groups(kind)))
    return tuple(per_node), groups


def _shortfall(request: GangRequest, layout: RankLayout, pools: _Pools) -> PendingReason:
    n, k, m = layout.num_nodes, layout.ranks_per_node, layout.nodes_per_pipeline()
    units = n // m
    what = f"needs {n} healthy {request.gpu_type} node{'s' if n != 1 else ''} with {k} free device{'s' if k != 1 else ''} each"
    if m > 1:
        what += f" and PP groups of {m} nodes in one rack"
    parts = [f"{pools.busy:,} busy"]
    if pools.unhealthy:
        parts.append(f"{pools.unhealthy:,} unhealthy")
    if pools.excluded:
        parts.append(f"{pools.excluded:,} excluded")
    message = (f"{what}; {pools.free:,} free (of {pools.total:,}: {', '.join(parts)}); "
               f"largest free block in a rack: {pools.largest_block}")
    code = "not_enough_nodes"
    if pools.free >= n:  # only the strict rack rule failed
        code = "pp_blocks"
        message += (f"; racks can hold {pools.pipelines_in_racks(m)} of the {units} pipelines "
                    f"of {m} nodes")
    return PendingReason(
        code=code, message=message, gpu_type=request.gpu_type, needed_nodes=n,
        gpus_per_node_needed=k, nodes_per_pipeline=m, free_nodes=pools.free, total_nodes=pools.total,
        busy_nodes=pools.busy, unhealthy_nodes=pools.unhealthy, excluded_nodes=pools.excluded,
        largest_free_block_in_rack=pools.largest_block, pipelines_that_fit_in_racks=pools.pipelines_in_racks(m),
    )
