"""Score a candidate placement (seed §4's scoring function, made explicit and weighted).

The search (`plugins/placement/gang.py`) builds candidates that already satisfy the hard
constraints; this module ranks them. Terms, each kept in the breakdown so `trainyard place`
can explain a choice:

- `tp_in_node`     +100 per TP group (tp > 1; always all of them: TP inside a node is hard).
- `pp_in_rack`     +50 per PP group (pp > 1) whose stages share one rack; −20 per extra rack
                   for one that spans racks (stage-to-stage traffic crosses the spine).
- `dp_spread`      +10 per distinct rack used (fault isolation: a rack loss takes fewer replicas),
                   for pipelines of two or more nodes only. Scattering one-node replicas over many
                   racks isolates nothing a node boundary does not already, breaks a free block in
                   every rack it touches and stretches the DP all-reduce ring over the spine.
- `fragmentation`  −w·Δ(Σ_racks f²), f = wholly free nodes in a rack. Σf² rewards free capacity
                   concentrated in few racks (it is what lets the next big pipeline fit in one
                   rack). Taking m nodes from a rack with f free costs 2fm − m², increasing in f,
                   so minimising it is best-fit over racks. The seed instead adds 5·(largest free
                   block) of each used rack, which rewards taking from the emptiest rack
                   (worst-fit); we keep the seed's intent ("reduce fragmentation") and not its
                   formula. With w = 0.25 spreading 8 pipelines of 4 nodes over 8 empty racks
                   (+80 spread, −96 fragmentation) still beats packing them into 4 (+40, −64).
- `xid`            −2 per Xid error in the last 7 days on a chosen node.
- `cache`          +3 per chosen node whose dataset cache is warm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from trainyard.config.cluster import Node
from trainyard.plugins.advisor.rank_layout import RankLayout


class ScoreWeights(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tp_in_node: float = 100.0
    pp_in_rack: float = 50.0
    pp_extra_rack: float = 20.0
    dp_rack: float = 10.0
    fragmentation: float = 0.25
    xid_error: float = 2.0
    warm_cache: float = 3.0


def score_candidate(
    nodes: Sequence[Node],
    layout: RankLayout,
    *,
    whole_free_before: Mapping[str, int],
    whole_taken: Mapping[str, int],
    dataset: str | None,
    weights: ScoreWeights,
) -> tuple[float, dict[str, float]]:
    """Score `nodes` (in rank order).

    `whole_free_before`: wholly free nodes per rack before this placement; `whole_taken`: how
    many of them this candidate takes, per rack (both for the fragmentation term).
    Returns (score, breakdown).
    """
    racks = [n.rack for n in nodes]
    pp_in_rack = 0
    pp_extra = 0
    for group in layout.group_nodes("pp") if layout.pp > 1 else ():
        spanned = len({racks[i] for i in group})
        if spanned == 1:
            pp_in_rack += 1
        else:
            pp_extra += spanned - 1
    loss = 0
    for rack, taken in whole_taken.items():
        f = whole_free_before.get(rack, 0)
        loss += f * f - max(f - taken, 0) ** 2
    breakdown = {
        "tp_in_node": weights.tp_in_node * (layout.world_size // layout.tp) if layout.tp > 1 else 0.0,
        "pp_in_rack": weights.pp_in_rack * pp_in_rack - weights.pp_extra_rack * pp_extra,
        "dp_spread": weights.dp_rack * len(set(racks)) if layout.nodes_per_pipeline() > 1 else 0.0,
        "fragmentation": -weights.fragmentation * loss,
        "xid": -weights.xid_error * sum(n.xid_errors_7d for n in nodes),
        "cache": weights.warm_cache * sum(1 for n in nodes if dataset and dataset in n.cached_datasets),
    }
    return sum(breakdown.values()), breakdown
