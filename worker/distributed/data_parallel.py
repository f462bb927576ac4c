"""Data parallelism: DDP (ZeRO-0) or FSDP2 (`fully_shard`, ZeRO-1/2/3).

FSDP2 shards every transformer block as its own communication group, then the root (the
embeddings, final norm and head). ZeRO stages map onto FSDP2 as the plan contract says:
stage 3 reshards parameters after forward (all-gather again in backward: least memory);
stages 1 and 2 keep the gathered parameters from forward to backward (one all-gather per
step, like ZeRO-2, whose sharded gradients and optimizer states FSDP2 keeps as well).
With a `param_dtype` (bf16 on GPU, see `parallelize.compute_dtype`) parameters are gathered and
computed in it while gradients are reduced in fp32 and the sharded master weights stay fp32.

ZeRO-0 is `DistributedDataParallel` for plain data parallelism. Two cases cannot use DDP and
replicate with FSDP2's replicate mode instead (`replicate_with_fsdp.replicate`: parameters
replicated, gradients all-reduced once per step — what torchtitan does):
- a pipeline stage: DDP's reducer records the order gradients become ready on the first step,
  and a pipeline's several micro-batch backwards per step make it fail ("rebuilt parameter
  indices size is not same as original model parameters size");
- tensor-parallel parameters: DDP needs them turned into plain local tensors
  (`_pre_dp_module_transform`), after which gradient clipping sees only this rank's shard and
  a checkpoint saves every rank's different shard under the same name. Replicate keeps them
  DTensors (Replicate over dp, Shard over tp), which clipping and DCP understand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh


def mixed_precision(param_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """Compute in `param_dtype` with fp32 gradient reduction; None: the parameters' own dtype."""
    if param_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, *, zero_stage: int,
               is_pipeline_stage: bool = False, param_dtype: torch.dtype | None = None) -> None:
    """`fully_shard` each block, then the root, in place (`model` becomes an `FSDPModule`)."""
    if zero_stage not in (1, 2, 3):
        raise ValueError(f"FSDP2 applies ZeRO stages 1-3, got zero_stage {zero_stage}")
    policy = mixed_precision(param_dtype)
    reshard = zero_stage == 3
    blocks = list(model.layers.values())  # type: ignore[union-attr]
    for i, block in enumerate(blocks):
        # Backward needs the last block first: keeping it gathered saves one all-gather. Not in
        # a pipeline stage, whose micro-batch backwards come long after their forwards.
        keep = i == len(blocks) - 1 and not is_pipeline_stage
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard and not keep, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh, *, is_pipeline_stage: bool = False,
              param_dtype: torch.dtype | None = None) -> nn.Module:
    """Replicate `model` over `dp_mesh` (ZeRO-0); returns the module to train. Plain DDP
    computes in the parameters' dtype (the caller autocasts); replicate applies `param_dtype`."""
    if is_pipeline_stage or any(_is_dtensor(p) for p in model.parameters()):
        from torch.distributed._composable.replicate_with_fsdp import replicate

        policy = mixed_precision(param_dtype)
        for block in model.layers.values():  # type: ignore[union-attr]
            replicate(block, mesh=dp_mesh, mp_policy=policy)
        replicate(model, mesh=dp_mesh, mp_policy=policy)
        return model
    device_ids = None if dp_mesh.device_type == "cpu" else [torch.cuda.current_device()]
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), device_ids=device_ids,
                                   forward_sync_buffers=False, bucket_cap_mb=100)


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)
