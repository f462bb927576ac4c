"""`RankLayout`: which global rank holds which (pp, dp, cp, tp) coordinate — the one rank order.

The worker's device mesh (`worker/distributed/mesh.py`, `init_device_mesh` over `MESH_DIMS`),
the placer (`plugins/placement/`) and the advisor's communication model all read the order from
here, so the ranks the placer keeps together in a rack are the ranks the worker pairs up. It is
torchtitan's `ParallelDims` habit: a plain validated object, no `torch.distributed`, so every
property of the order is testable without processes.

Order, outermost first: `pp, dp, cp, tp` (torchtitan's and Megatron's):

    rank = ((pp_idx * dp + dp_idx) * cp + cp_idx) * tp + tp_idx

TP is innermost: a TP group is `tp` consecutive ranks and sits inside one node whenever the
ranks per node are a multiple of `tp`. A DP group's stride is `cp·tp`, a PP group's stride is
`dp·cp·tp`: one pipeline stage of every replica is a contiguous block, and a pipeline's stages
are spread over the job. One model replica (a fixed `dp_idx`) therefore touches, in node
terms, `pp` nodes spaced `dp·cp·tp / k` apart — `replica_nodes()` lists them, and the placer
keeps each such set in one rack.

Nodes are filled in rank order (torchrun): node `i` of a placement holds ranks
`[i*k, (i+1)*k)`, `k` = ranks per node (`--nproc-per-node`).

It is also the one carrier of the degrees (#59): a `Plan`, an advisor `Layout`, a `GangRequest`,
a `Placement` and the control room's `PlanView` each hold a `RankLayout` instead of four ints of
their own, so `world_size` is computed here and nowhere else. Contracts written before that
(flat `tp`/`pp`/`dp`/`cp` keys in XCom, the platform state, a run folder) are lifted into the
nested form by `lift_flat_degrees`, the `model_validator(mode="before")` of those models.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal, NamedTuple

GroupKind = Literal["pp", "dp", "cp", "tp"]
MESH_DIMS: tuple[GroupKind, ...] = ("pp", "dp", "cp", "tp")
"""The mesh's dimension names, outermost (slowest-varying rank) first."""


class Coords(NamedTuple):
    """A rank's coordinate on each mesh dimension, in `MESH_DIMS` order."""

    pp: int
    dp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class RankLayout:
    """The four degrees and the ranks per node; pure arithmetic, no I/O."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ranks_per_node: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ranks_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
        if self.world_size % self.ranks_per_node:
            raise ValueError(
                f"world size {self.world_size} (pp({self.pp}) * dp({self.dp}) * cp({self.cp}) * "
                f"tp({self.tp})) is not divisible by ranks per node {self.ranks_per_node}")

    def with_ranks_per_node(self, ranks_per_node: int) -> RankLayout:
        """The same degrees spread `ranks_per_node` to a node: a plan knows its degrees, only a
        placement knows how many of its ranks share a node."""
        return replace(self, ranks_per_node=ranks_per_node)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """Sizes in `MESH_DIMS` order: what `init_device_mesh` is given."""
        return (self.pp, self.dp, self.cp, self.tp)

    @property
    def world_size(self) -> int:
        """Ranks in the job: the product of the four degrees — the one place it is computed."""
        return self.tp * self.pp * self.dp * self.cp

    def check_world_size(self, world_size: int) -> None:
        """Raise naming every factor when the degrees do not cover `world_size` devices
        (torchtitan's `ParallelDims` message), so the user sees which degree to change."""
        if self.world_size != world_size:
            raise ValueError(
                f"Invalid parallel dims: tp({self.tp}) * pp({self.pp}) * dp({self.dp}) * "
                f"cp({self.cp}) = {self.world_size} != WORLD_SIZE({world_size})"
            )

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def stride(self, kind: GroupKind) -> int:
        """Distance in ranks between neighbours of a `kind` group (tp 1, cp tp, dp cp·tp, …)."""
        index = self._index(kind)
        out = 1
        for size in self.shape[index + 1:]:
            out *= size
        return out

    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside [0, {self.world_size})")
        return Coords(*(rank // self.stride(d) % size for d, size in zip(MESH_DIMS, self.shape, strict=True)))

    def rank(self, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def groups(self, kind: GroupKind) -> list[list[int]]:
        """Every process group of one kind, as lists of global ranks, ordered by first rank —
        the groups `DeviceMesh[kind]` forms."""
        step, size = self.stride(kind), self.shape[self._index(kind)]
        starts = [r for r in range(self.world_size) if (r // step) % size == 0]
        return [[start + i * step for i in range(size)] for start in starts]

    def group_nodes(self, kind: GroupKind) -> list[list[int]]:
        """For each group of `kind`, the sorted node indices it touches."""
        k = self.ranks_per_node
        return [sorted({rank // k for rank in group}) for group in self.groups(kind)]

    @cached_property
    def _replica_nodes(self) -> list[list[int]]:
        parent = list(range(self.num_nodes))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for kind in ("tp", "cp", "pp"):
            for nodes in self.group_nodes(kind):  # type: ignore[arg-type]
                for other in nodes[1:]:
                    parent[find(other)] = find(nodes[0])
        sets: dict[int, list[int]] = {}
        for node in range(self.num_nodes):
            sets.setdefault(find(node), []).append(node)
        return sorted(sets.values())

    def replica_nodes(self) -> list[list[int]]:
        """The node sets model replicas occupy: nodes joined by any TP, CP or PP group (only DP
        crosses between sets), sorted by first node. Each set is what the placer keeps in one
        rack; several replicas share a set when a node holds ranks of several."""
        return [list(s) for s in self._replica_nodes]

    def replicas_tile_nodes(self) -> bool:
        """True when every replica node set has the same size — the placer needs that to treat
        them as interchangeable units."""
        return len({len(s) for s in self._replica_nodes}) == 1

    def nodes_per_pipeline(self) -> int:
        """Nodes one replica node set spans (1 when TP, CP and PP all stay inside a node)."""
        return len(self._replica_nodes[0])

    def _index(self, kind: str) -> int:
        if kind not in MESH_DIMS:
            raise ValueError(f"unknown group kind {kind!r}; expected one of {', '.join(MESH_DIMS)}")
        return MESH_DIMS.index(kind)


DEGREES: tuple[str, ...] = ("tp", "pp", "dp", "cp")
"""The four degree names as contracts spelled them flat before #59."""


def lift_flat_degrees(data: Any, *, field: str = "layout", extra: tuple[str, ...] = ()) -> Any:
    """A `model_validator(mode="before")` body: move flat `tp`, `pp`, `dp`, `cp` keys (and the
    `extra` ones, e.g. a placement's `ranks_per_node`) into the nested `field`.

    Why: plans and placements written before the degrees had one carrier sit in XCom of running
    DAGs and in the platform state; they must still load. A dict that already has `field` is
    left alone, so a document carrying both forms fails `extra="forbid"` instead of one form
    silently winning."""
    if not isinstance(data, dict) or field in data:
        return data
    flat = [k for k in (*DEGREES, *extra) if k in data]
    if not flat:
        return data
    data = dict(data)
    data[field] = {k: data.pop(k) for k in flat}
    return data
