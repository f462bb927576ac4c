"""Tensor parallelism for the Llama model with DTensor (`parallelize_module`), Megatron-style.

In every block, the projections that fan out (wq, wk, wv; the SwiGLU gate w1 and up w3) are
split by output columns and the projections that fan back in (wo, w2) by input rows, so each
block needs one all-reduce in forward and one in backward per sub-layer — the attention heads
and the FFN's hidden units stay local to a rank. With sequence parallelism the all-reduce
becomes a reduce-scatter onto sequence shards: the norms (and the residual stream between
blocks) run on 1/tp of the sequence, and an all-gather restores the full sequence before the
next column-parallel matmul. The output head is column-parallel and gathers its logits
(Replicate), so the loss is the plain cross-entropy on every rank.

Head counts must divide by tp: each rank computes `num_heads/tp` query heads and
`num_kv_heads/tp` K/V heads (the model views its projections with `-1` heads for this).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from trainyard.worker.models.llama import LlamaConfig


def check_tp_degree(config: LlamaConfig, tp: int) -> None:
    """Raise when the model cannot be split `tp` ways."""
    for name, value in (("num_heads", config.num_heads), ("num_kv_heads", config.num_kv_heads),
                        ("ffn_hidden_size", config.ffn_hidden_size), ("vocab_size", config.vocab_size)):
        if value % tp:
            raise ValueError(f"tensor parallelism tp({tp}) does not divide {name}({value})")
    if config.tie_embeddings and tp > 1:
        raise ValueError("tied embeddings are not supported with tensor parallelism; "
                         f"tp is {tp}: set tieEmbeddings false")


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Shard `model` (a whole Llama or a pipeline stage of one) over `tp_mesh`, in place."""
    # Between blocks the residual stream is sharded on the sequence (SP) or replicated.
    stream = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, object] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
    if getattr(model, "norm", None) is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        top["output"] = ColwiseParallel(input_layouts=stream, output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)  # type: ignore[arg-type]

    for block in model.layers.values():  # type: ignore[union-attr]
        plan: dict[str, object] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=stream),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=stream),
        }
        if sequence_parallel:
            plan.update({
                "attention_norm": SequenceParallel(),
                "ffn_norm": SequenceParallel(),
                # All-gather the sequence before the column-parallel projections.
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                desired_input_layouts=(Replicate(), None, None)),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                                   desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)  # type: ignore[arg-type]
