"""Python objects across the training ranks (the default process group), and the identity in
one process — for the few small values the ranks must agree on: the shard manifest listed
once, the data state's stripe positions, the parameter digest. (Checkpoint saves use their own
gloo group, `plugins.checkpoint.collectives`, since they run beside the training loop.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def all_gather_objects(obj: T) -> list[T]:
    """Every rank's `obj`, in rank order (a collective: every rank calls it)."""
    if _world() == 1:
        return [obj]
    out: list[Any] = [None] * _world()
    dist.all_gather_object(out, obj)
    return out


def broadcast_from_rank0(make: Callable[[], T]) -> T:
    """Run `make` on global rank 0 and hand its result to every rank."""
    if _world() == 1:
        return make()
    box: list[Any] = [make() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
