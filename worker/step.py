"""One optimizer step over a `ParallelModel`: forward/backward, loss agreed by every rank,
gradient clipping over the whole model, optimizer and LR-scheduler step.

The loss every rank reports is the global batch's mean loss: each rank that computed a loss
(every rank without pipelining; the last stage with it) contributes its replica's mean, the
others contribute nothing, and one all-reduce of (sum, count) over the world gives the mean.
Every rank therefore sees the same number — which the divergence detector relies on: all ranks
must decide to stop at the same step, or the ones that carry on hang in their next collective.
"""

from __future__ import annotations

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


def global_mean_loss(local_loss: torch.Tensor, has_loss: bool) -> torch.Tensor:
    """The mean over every rank that computed a loss (identical on all ranks)."""
    pair = torch.stack([local_loss.detach().float() * float(has_loss),
                        torch.tensor(float(has_loss), device=local_loss.device)])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(pair)
    return pair[0] / pair[1]


def train_step(pm: ParallelModel, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler | None,
               inputs: torch.Tensor, targets: torch.Tensor, *, max_norm: float = 1.0) -> StepStats:
    """Run one step; the gradients are zeroed before returning."""
    local_loss, has_loss = pm.forward_backward(inputs, targets)
    loss = global_mean_loss(local_loss, has_loss)
    grad_norm = clip_grad_norm_(list(pm.parameters()), max_norm, pp_group=pm.pp_group)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return StepStats(loss=float(loss), grad_norm=float(grad_norm))
