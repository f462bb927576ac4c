"""Gradient-norm clipping that sees the whole model, however it is split.

`torch.nn.utils.clip_grad_norm_` only sees this rank's tensors. Under FSDP2 and TP the
gradients are DTensors: the norm of a group on one mesh is a DTensor too, and `full_tensor()`
reduces it over that mesh. Without sequence parallelism some parameters (the norms' weights)
stay plain tensors next to DTensor ones, so gradients are grouped by mesh first and the
groups' squared norms added. Under pipeline parallelism each rank holds different layers:
the squared norms are summed over the pipeline group, as torchtitan does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


def _params_by_mesh(parameters: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Parameters that have a gradient, grouped by their gradient's mesh (None: plain)."""
    groups: dict[object, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            groups.setdefault(key, []).append(p)
    return list(groups.values())


def _total_norm(groups: list[list[torch.Tensor]], pp_group: ProcessGroup | None) -> torch.Tensor:
    """The L2 norm of every gradient of the model (a plain scalar tensor, equal on all ranks)."""
    squares = []
    for params in groups:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares.append(norm.float() ** 2)
    device = squares[0].device if squares else torch.device("cpu")
    total_sq = torch.stack(squares).sum() if squares else torch.zeros((), device=device)
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(total_sq, group=pp_group)
    return total_sq.sqrt()


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, *,
                    pp_group: ProcessGroup | None = None) -> torch.Tensor:
    """Scale the gradients in place so their global norm is at most `max_norm`; return the norm
    before clipping."""
    groups = _params_by_mesh(parameters)
    norm = _total_norm(groups, pp_group)
    for params in groups:  # one foreach kernel per mesh: foreach ops refuse mixed DTensor/Tensor
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm
