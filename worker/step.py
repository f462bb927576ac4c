"""One optimizer step over a `ParallelModel`: forward/backward, loss agreed by every rank,
gradient clipping over the whole model, optimizer and LR-scheduler step.

The loss every rank reports is the global batch's mean loss: each rank that computed a loss
(every rank without pipelining; the last stage with it) contributes its replica's mean, the
others contribute nothing, and one all-reduce of (sum, count) over the world gives the mean.
Every rank therefore sees the same number — which the divergence detector relies on: all ranks
must decide to stop at the same step, or the ones that carry on hang in their next collective.
The same all-reduce carries the session's stop/save flags (`flags=session.flags()`), summed over
the world, so agreeing on them costs the step no collective of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from trainyard.worker.distributed.grad_norm import clip_grad_norm_

if TYPE_CHECKING:
    from trainyard.worker.distributed.parallelize import ParallelModel


@dataclass(frozen=True)
class StepStats:
    loss: float
    grad_norm: float
    flags: tuple[int, ...] = ()
    """The sum over all ranks of each of the `flags` given to `train_step`."""


def global_mean_loss(local_loss: torch.Tensor, has_loss: bool,
                     flags: Sequence[int] = ()) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The mean over every rank that computed a loss, and the sum over all ranks of each of
    `flags` — one all-reduce, identical results on all ranks."""
    values = torch.cat([local_loss.detach().float().reshape(1) * float(has_loss),
                        torch.tensor([float(has_loss), *map(float, flags)], device=local_loss.device)])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values)
    sums = tuple(int(v) for v in values[2:].tolist()) if flags else ()
    return values[0] / values[1], sums


def train_step(pm: ParallelModel, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler | None,
               inputs: torch.Tensor, targets: torch.Tensor, *, max_norm: float = 1.0,
               flags: Sequence[int] = ()) -> StepStats:
    """Run one step; the gradients are zeroed before returning. `flags`: this rank's
    `TrainingSession.flags()`, summed over the world into `StepStats.flags`."""
    local_loss, has_loss = pm.forward_backward(inputs, targets)
    loss, sums = global_mean_loss(local_loss, has_loss, flags)
    grad_norm = clip_grad_norm_(list(pm.parameters()), max_norm, pp_group=pm.pp_group)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return StepStats(loss=float(loss), grad_norm=float(grad_norm), flags=sums)
