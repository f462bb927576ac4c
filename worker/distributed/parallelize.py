"""`parallelize(model, plan, mesh)`: apply an advisor `Plan` with torch's own parallelism.

Order (torchtitan's): split into pipeline stages, then for each stage tensor parallelism →
activation checkpointing → data parallelism (FSDP2 or DDP). TP must come first because FSDP2
shards the DTensors TP made (FSDP×TP gives 2-D parameters); AC wraps blocks before FSDP2 so
each block is one FSDP group whose recomputation re-gathers only that block.

The result, `ParallelModel`, is what a training step and a checkpoint need: the model parts
this rank holds (one, or one per virtual pipeline stage), the pipeline schedule if any, and
`forward_backward`, which runs one step's forward and backward over the plan's micro-batches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainyard.plugins.advisor.runtime import WORKER_RUNTIME
from trainyard.worker.distributed.activation_checkpoint import apply_ac
from trainyard.worker.distributed.data_parallel import apply_ddp, apply_fsdp
from trainyard.worker.distributed.pipeline_parallel import (
    build_schedule,
    build_stages,
    check_pipeline_plan,
)
from trainyard.worker.distributed.tensor_parallel import apply_tp, check_tp_degree
from trainyard.worker.models.llama import Llama, cross_entropy_loss

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    from trainyard.plugins.advisor.plan import Plan


def mesh_device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, torch.accelerator.current_device_index())


def compute_dtype(device_type: str, precision: str = "bf16") -> torch.dtype | None:
    """The dtype matmuls run in: bf16 on accelerators unless the job trains in fp32; on CPU
    always the parameters' fp32 (CPU bf16 matmuls are slow, and tests compare exact numbers)."""
    if device_type == "cpu" or precision == "fp32":
        return None
    if precision not in WORKER_RUNTIME.precisions:
        raise ValueError(f"{precision} training is not supported by the worker runtime (fp16 needs "
                         "loss scaling, which it does not do); use mixedPrecision bf16 (same "
                         "memory, no scaler needed) or fp32")
    return torch.bfloat16


def check_plan(plan: Plan, model: Llama) -> None:
    """Raise `ValueError` when `plan` cannot be applied to `model` (before any collective).
    What the runtime supports at all is `WORKER_RUNTIME`, which the advisor and the dry run
    honour too; the rest depends on the model's shape."""
    d = plan.layout
    refused = WORKER_RUNTIME.refusals(cp=d.cp, ep=plan.ep, tp=d.tp, pp=d.pp,
                                      tie_embeddings=model.config.tie_embeddings)
    if refused:
        raise ValueError("; ".join(refused))
    check_tp_degree(model.config, plan.layout.tp)
    check_pipeline_plan(plan, model.config.num_layers)
    if plan.sequence_parallel and plan.sequence_length and plan.sequence_length % plan.layout.tp:
        raise ValueError(f"sequence parallelism needs sequence_length ({plan.sequence_length}) "
                         f"divisible by tp ({plan.layout.tp})")


@dataclass
class ParallelModel:
    """The model as this rank holds it after `parallelize`."""

    parts: list[nn.Module]
    """Model chunks on this rank: one, or one per pipeline stage held (interleaved 1F1B)."""
    plan: Plan
    mesh: DeviceMesh
    device: torch.device
    schedule: Any = None
    """The `torch.distributed.pipelining` schedule, or None without pipeline parallelism."""
    is_first_stage: bool = True
    is_last_stage: bool = True
    autocast_dtype: torch.dtype | None = None
    """Set when mixed precision is not FSDP2's (DDP, TP alone, one process): forward and
    backward run under `torch.autocast` in this dtype."""
    _loss_fn: Any = field(default=cross_entropy_loss, repr=False)

    @property
    def model(self) -> nn.Module:
        """The single part (raises under pipeline parallelism with several stages per rank)."""
        if len(self.parts) != 1:
            raise ValueError(f"this rank holds {len(self.parts)} pipeline stages; use .parts")
        return self.parts[0]

    @property
    def state_module(self) -> nn.Module:
        """One module whose state dict has the model's own parameter names, whatever this rank
        holds: what a checkpoint saves and restores. With several pipeline stages per rank it
        is a view that puts the stages' layers side by side under their original names."""
        if len(self.parts) == 1:
            return self.parts[0]
        return StagesView(self.parts)

    def parameters(self) -> Iterator[nn.Parameter]:
        for part in self.parts:
            yield from part.parameters()

    @property
    def pp_group(self) -> ProcessGroup | None:
        return self.mesh["pp"].get_group() if self.plan.layout.pp > 1 else None

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Forward and backward over this replica's batch (micro_batch_size·num_micro_batches
        sequences), accumulating mean-loss gradients. Returns the batch's mean loss (detached)
        and whether this rank computed it (False on pipeline stages before the last)."""
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        if self.autocast_dtype is None:
            return self._forward_backward(inputs, targets)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype):
            return self._forward_backward(inputs, targets)

    def _forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, bool]:
        if self.schedule is not None:
            return self._pipeline_step(inputs, targets)
        model, n = self.model, self.plan.num_micro_batches
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(zip(inputs.chunk(n), targets.chunk(n), strict=True)):
            sync = i == n - 1
            ctx = model.no_sync() if (not sync and hasattr(model, "no_sync")) else contextlib.nullcontext()
            with ctx:
                loss = self._loss_fn(model(x), y) / n
                loss.backward()
            total += loss.detach()
        return total, True

    def _pipeline_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, bool]:
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.is_first_stage else ()
        kwargs: dict[str, Any] = {"target": targets, "losses": losses} if self.is_last_stage else {}
        self.schedule.step(*args, **kwargs)
        if self.is_last_stage:
            return torch.stack([loss.detach().float() for loss in losses]).mean(), True
        return torch.zeros((), device=self.device), False


class StagesView(nn.Module):
    """The pipeline stages one rank holds, seen as one model: `tok_embeddings`, `layers.<i>`,
    `norm`, `output` under their original names (each stage keeps its own layer indices), so
    `get_state_dict` names every parameter as the unsplit model does and a checkpoint written
    under one pipeline layout loads under another."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleDict()
        for part in parts:
            core = getattr(part, "module", part)  # DDP keeps the model under .module
            for name in ("tok_embeddings", "norm", "output"):
                if getattr(core, name, None) is not None:
                    setattr(self, name, getattr(core, name))
            for index, layer in core.layers.items():
                self.layers[index] = layer

    def forward(self, *args: Any) -> Any:  # pragma: no cover - a view for state dicts only
        raise RuntimeError("StagesView holds pipeline stages for checkpointing; it does not run")


def parallelize(model: Llama, plan: Plan, mesh: DeviceMesh, *, precision: str = "bf16") -> ParallelModel:
    """Apply `plan` to `model` over `mesh` (built by `trainyard.worker.distributed.mesh.build_mesh`).

    `model` must hold the same initial weights on every rank (build it after seeding the same
    way everywhere); it is moved to the mesh's device and may be consumed (pipeline stages are
    copies of it). `precision` is the job's `mixedPrecision` (see `compute_dtype`): on GPU,
    bf16 compute with fp32 master weights — through FSDP2's mixed-precision policy when the
    plan shards or replicates with FSDP2, else through autocast.
    """
    check_plan(plan, model)
    dtype = compute_dtype(mesh.device_type, precision)
    device = mesh_device(mesh)
    model.to(device)
    if plan.layout.pp > 1:
        pp_mesh = mesh["pp"]
        parts, indices = build_stages(model, plan, pp_mesh, device)
    else:
        parts, indices = [model], [0]
    parts = [_parallelize_part(part, plan, mesh, dtype) for part in parts]
    d = plan.layout
    fsdp_casts = d.dp > 1 and (plan.zero_stage > 0 or d.pp > 1 or d.tp > 1)
    pm = ParallelModel(parts=parts, plan=plan, mesh=mesh, device=device,
                       autocast_dtype=None if fsdp_casts else dtype)
    if plan.layout.pp > 1:
        num_stages = plan.layout.pp * plan.vpp
        pm.schedule = build_schedule(parts, indices, plan, mesh["pp"], device, cross_entropy_loss)
        pm.is_first_stage = 0 in indices
        pm.is_last_stage = num_stages - 1 in indices
    return pm


def _parallelize_part(part: nn.Module, plan: Plan, mesh: DeviceMesh,
                      dtype: torch.dtype | None) -> nn.Module:
    if plan.layout.tp > 1:
        apply_tp(part, mesh["tp"], sequence_parallel=plan.sequence_parallel)
    apply_ac(part, plan.activation_checkpointing)
    if plan.layout.dp > 1:
        if plan.zero_stage == 0:
            return apply_ddp(part, mesh["dp"], is_pipeline_stage=plan.layout.pp > 1,
                             param_dtype=dtype)
        apply_fsdp(part, mesh["dp"], zero_stage=plan.zero_stage, is_pipeline_stage=plan.layout.pp > 1,
                   param_dtype=dtype)
    return part
