"""Rank layout: which global rank holds which TP / CP / PP / DP coordinate.

The convention (documented once, used by the placer, the launcher and the worker runtime):

    rank = ((dp_idx * pp + pp_idx) * cp + cp_idx) * tp + tp_idx

TP is innermost, so a TP group is `tp` consecutive ranks and lands on one node whenever the
ranks per node are a multiple of `tp`. DP is outermost, so one data-parallel replica (one full
pipeline: `pp * cp * tp` ranks) is a contiguous block of ranks — a contiguous block of nodes —
which is what lets the placer keep each pipeline inside one rack. With `cp == 1` this is the
brief's `rank = ((dp_idx * pp + pp_idx) * tp + tp_idx)`.

Nodes are filled in rank order: node `i` of a placement holds ranks `[i*k, (i+1)*k)`, where `k`
is the number of ranks per node (torchrun's `--nproc-per-node`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GroupKind = Literal["tp", "cp", "pp", "dp"]


@dataclass(frozen=True)
class RankLayout:
    """The four degrees and the ranks per node; pure arithmetic, no I/O."""

    tp: int
    pp: int
    dp: int
    cp: int = 1
    ranks_per_node: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ranks_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.world_size % self.ranks_per_node:
            raise ValueError(
                f"world size {self.world_size} (tp({self.tp}) * pp({self.pp}) * dp({self.dp}) * "
                f"cp({self.cp})) is not divisible by ranks per node {self.ranks_per_node}"
            )

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def replica_size(self) -> int:
        """Ranks in one data-parallel replica (one whole pipeline)."""
        return self.pp * self.cp * self.tp

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(dp_idx, pp_idx, cp_idx, tp_idx) of a global rank."""
        tp_idx = rank % self.tp
        cp_idx = (rank // self.tp) % self.cp
        pp_idx = (rank // (self.tp * self.cp)) % self.pp
        dp_idx = rank // self.replica_size
        return dp_idx, pp_idx, cp_idx, tp_idx

    def rank(self, dp_idx: int, pp_idx: int, cp_idx: int, tp_idx: int) -> int:
        return ((dp_idx * self.pp + pp_idx) * self.cp + cp_idx) * self.tp + tp_idx

    def groups(self, kind: GroupKind) -> list[list[int]]:
        """Every process group of one kind, as lists of global ranks, in a stable order.

        tp: same (dp, pp, cp); cp: same (dp, pp, tp); pp: same (dp, cp, tp); dp: same (pp, cp, tp).
        """
        tp, pp, dp, cp = self.tp, self.pp, self.dp, self.cp
        r = self.rank
        if kind == "tp":
            return [[r(d, p, c, t) for t in range(tp)] for d in range(dp) for p in range(pp) for c in range(cp)]
        if kind == "cp":
            return [[r(d, p, c, t) for c in range(cp)] for d in range(dp) for p in range(pp) for t in range(tp)]
        if kind == "pp":
            return [[r(d, p, c, t) for p in range(pp)] for d in range(dp) for c in range(cp) for t in range(tp)]
        if kind == "dp":
            return [[r(d, p, c, t) for d in range(dp)] for p in range(pp) for c in range(cp) for t in range(tp)]
        raise ValueError(f"unknown group kind {kind!r}; expected one of tp, cp, pp, dp")

    def group_nodes(self, kind: GroupKind) -> list[list[int]]:
        """For each group of `kind`, the sorted node indices it touches."""
        k = self.ranks_per_node
        return [sorted({rank // k for rank in group}) for group in self.groups(kind)]

    def nodes_per_pipeline(self) -> int:
        """Nodes one data-parallel replica spans (1 when several replicas share a node)."""
        return max(self.replica_size // self.ranks_per_node, 1)
