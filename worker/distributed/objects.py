"""Python objects across the training ranks (the default process group), and the identity in
one process — for the few small values the ranks must agree on: the shard manifest listed
once, the data state's stripe positions, the parameter digest. (Checkpoint saves use their own
gloo group, `trainyard.plugins.checkpoint.collectives`, since they run beside the training loop.)"""

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


class RankZeroFailed(RuntimeError):
    """What the other ranks raise when rank 0 could not make the value they wait for."""


def broadcast_from_rank0(make: Callable[[], T]) -> T:
    """Run `make` on global rank 0 and hand its result to every rank. When `make` raises, every
    rank raises: rank 0 its error, the others `RankZeroFailed` naming it. Left waiting in the
    broadcast, they would fail on rank 0's closed connection instead — often first, while rank 0
    was still unwinding — and the attempt's verdict would name a gloo error, not the cause."""
    if _world() == 1:
        return make()
    box: list[Any] = [None]
    error: Exception | None = None
    if dist.get_rank() == 0:
        try:
            box[0] = (True, make())
        except Exception as e:  # noqa: BLE001 - raised below, after every rank has heard of it
            error, box[0] = e, (False, f"{type(e).__name__}: {e}")
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    made, value = box[0]
    if not made:
        raise RankZeroFailed(f"rank 0 failed: {value}")
    return value
