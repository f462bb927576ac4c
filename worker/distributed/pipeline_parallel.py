"""Pipeline parallelism with `torch.distributed.pipelining`: split the model into stages by
layer, then run 1F1B or interleaved 1F1B over the plan's micro-batches.

The split is manual, as in torchtitan: each stage is a copy of the model that keeps only its
own contiguous run of layers (the first stage also the embeddings, the last the final norm and
the head). Stages need not divide the layers: `trainyard.config.pipeline.stage_layer_counts` gives the
first and last stages the fewer (5 layers on PP2 run as 3 + 2; Llama 3 ran 126 on 16). `layers` is a `ModuleDict`, so the surviving layers keep their original names and
checkpoints stay addressable by the same keys whatever the pipeline layout.

With `vpp` virtual stages per rank there are `pp·vpp` stages, placed round-robin ("loop"):
rank r holds stages r, r+pp, r+2·pp, … — the layout `ScheduleInterleaved1F1B` expects.
The schedule computes the loss per micro-batch on the last stage and scales the accumulated
gradients by 1/micro-batches, so a step's gradient is the mean over the whole local batch, as
without a pipeline.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

from trainyard.config.pipeline import stage_layer_counts

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from trainyard.plugins.advisor.plan import Plan


def stage_layer_ranges(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer indices per stage. The sizes are `trainyard.config.pipeline.stage_layer_counts`
    — the split the advisor's memory and time models assume: even when the stages divide the
    layers, otherwise the first and last stages (embedding; head and loss) get the fewer."""
    ranges, start = [], 0
    for size in stage_layer_counts(num_layers, num_stages):
        ranges.append(range(start, start + size))
        start += size
    return ranges


def check_pipeline_plan(plan: Plan, num_layers: int) -> None:
    """Raise when the plan's pipeline cannot run on this model."""
    if plan.layout.pp == 1:
        return
    stage_layer_ranges(num_layers, plan.layout.pp * plan.vpp)
    if plan.num_micro_batches < plan.layout.pp:
        raise ValueError(f"a {plan.pipeline_schedule} pipeline needs num_micro_batches "
                         f"({plan.num_micro_batches}) >= pp ({plan.layout.pp})")
    if plan.vpp > 1 and plan.num_micro_batches % plan.layout.pp:
        raise ValueError(f"interleaved 1F1B needs num_micro_batches ({plan.num_micro_batches}) "
                         f"to be a multiple of pp ({plan.layout.pp})")


def stage_indices(pp_rank: int, pp: int, vpp: int) -> list[int]:
    """The stages pipeline rank `pp_rank` holds (loop placement)."""
    return [pp_rank + v * pp for v in range(vpp)]


def split_stage(model: nn.Module, layers: range, *, first: bool, last: bool) -> nn.Module:
    """A copy of `model` holding only `layers` (plus embeddings on the first, head on the last)."""
    stage = copy.deepcopy(model)
    for name in list(stage.layers.keys()):  # type: ignore[union-attr]
        if int(name) not in layers:
            del stage.layers[name]  # type: ignore[union-attr]
    if not first:
        stage.tok_embeddings = None
    if not last:
        stage.norm = None
        stage.output = None
    return stage


def build_stages(model: nn.Module, plan: Plan, pp_mesh: DeviceMesh,
                 device: torch.device) -> tuple[list[nn.Module], list[int]]:
    """This rank's stage modules and their stage indices (not yet wrapped in `PipelineStage`)."""
    num_stages = plan.layout.pp * plan.vpp
    ranges = stage_layer_ranges(len(model.layers), num_stages)  # type: ignore[arg-type]
    indices = stage_indices(pp_mesh.get_local_rank(), plan.layout.pp, plan.vpp)
    modules = [split_stage(model, ranges[i], first=i == 0, last=i == num_stages - 1) for i in indices]
    return modules, indices


def build_schedule(parts: list[nn.Module], indices: list[int], plan: Plan, pp_mesh: DeviceMesh,
                   device: torch.device, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """Wrap the (already parallelised) stage modules in `PipelineStage`s and build the schedule."""
    num_stages = plan.layout.pp * plan.vpp
    group = pp_mesh.get_group()
    stages = [PipelineStage(part, index, num_stages, device, group=group)
              for part, index in zip(parts, indices, strict=True)]
    if plan.pipeline_schedule == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches=plan.num_micro_batches, loss_fn=loss_fn)
    return Schedule1F1B(stages[0], n_microbatches=plan.num_micro_batches, loss_fn=loss_fn)
