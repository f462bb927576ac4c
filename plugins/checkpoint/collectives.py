"""The checkpoint ranks' own gloo group and the few object collectives the manager needs.

Saves run in a background thread while the training loop keeps using its process group
(NCCL on GPUs): if both issued collectives on the same group, their order could differ between
ranks and deadlock. So checkpointing gets a dedicated gloo group over the same ranks, used by
DCP and by the gathers below, and by nothing else. Without torch.distributed (one process) the
collectives are identities.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

GROUP_TIMEOUT = timedelta(minutes=30)
"""How long a collective may wait for a slow rank (an upload of a big shard) before failing."""


class RankGroup:
    def __init__(self, process_group: Any, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.group = _checkpoint_group(process_group, rank, world_size)

    @property
    def distributed(self) -> bool:
        return self.group is not None

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` on rank 0 (an empty list elsewhere)."""
        if self.group is None:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, group=self.group, group_dst=0)
        return out or []

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.group is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` on every rank, in rank order."""
        if self.group is None:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out


def _checkpoint_group(process_group: Any, rank: int, world_size: int) -> Any:
    if not (dist.is_available() and dist.is_initialized()):
        if world_size != 1 or rank != 0:
            raise ValueError(f"rank {rank} of world_size {world_size} needs torch.distributed "
                             "to be initialised first (single-process use is rank 0 of 1)")
        if process_group is not None:
            raise ValueError("process_group given but torch.distributed is not initialised")
        return None
    group = process_group or dist.group.WORLD
    actual = (dist.get_rank(group), dist.get_world_size(group))
    if actual != (rank, world_size):
        raise ValueError(f"rank/world_size given as {rank}/{world_size} but the process group "
                         f"says {actual[0]}/{actual[1]}")
    return dist.new_group(ranks=dist.get_process_group_ranks(group), backend="gloo",
                          timeout=GROUP_TIMEOUT)
