"""Activation checkpointing (recomputation) per transformer block.

- `full`: keep only each block's input; recompute the whole block in backward (the seed
  document's "~2·seq·batch·hidden bytes per layer").
- `selective`: keep the outputs of the expensive ops (matmuls, attention) and recompute the
  cheap, memory-hungry ones (norms, SwiGLU activation, RoPE, softmax inputs, elementwise) —
  Megatron's selective recomputation in spirit, done with torch's selective activation
  checkpointing (`create_selective_checkpoint_contexts`) as torchtitan's op-level SAC does.

Recomputation is exact: the recomputed ops are deterministic, so gradients with and without
checkpointing are identical (the unit tests compare them).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

if TYPE_CHECKING:
    from torch import nn

    from trainyard.config.spec import Recompute

_SAVE_OPS = frozenset({
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
})
"""Ops whose outputs selective checkpointing keeps: the FLOP-heavy ones."""


def _selective_policy(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context() -> tuple[object, object]:
    return create_selective_checkpoint_contexts(_selective_policy)


def apply_ac(model: nn.Module, mode: Recompute) -> None:
    """Wrap every block of `model.layers` (in place) according to `mode`."""
    if mode == "none":
        return
    if mode not in ("selective", "full"):
        raise ValueError(f"activation_checkpointing must be none, selective or full, got {mode!r}")
    layers = model.layers  # type: ignore[union-attr]
    for name, block in list(layers.named_children()):
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False,
                                         context_fn=partial(_selective_context))
        layers.register_module(name, wrapped)
