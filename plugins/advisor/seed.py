"""The seed document's simplified arithmetic (seed §3), reproduced so it can be checked and
compared with the advisor's model (`docs/advisor.md` explains every disagreement).

Seed assumptions: 16 bytes per parameter of model state (bf16 weights 2, bf16 gradients 2,
fp32 master + Adam moments 12); with activation checkpointing, 2·s·b·h elements of bf16 per
layer (the layer input), divided by TP; no embedding, logits, buffers or framework memory; GB
means 10⁹ bytes (except where the seed itself mixes in MiB).

`seed_greedy_plan` is the seed's `compute_parallelism_plan` heuristic (phases 1–3, 4 in part),
kept to show its known mistakes: it raises TP only while a single layer does not fit, so TP
stays 1 for every model up to ~1T parameters, and PP then has to absorb the whole model state.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainyard.plugins.advisor.rank_layout import RankLayout

SEED_BYTES_PER_PARAM = 16
SEED_OPTIMIZER_BYTES = 12


def seed_checkpointed_activation_bytes(*, seq: int, micro_batch: int, hidden: int, layers: int,
                                       tp: int = 1) -> float:
    """Seed §3: 'with activation checkpointing … ~2 · seq · batch · hidden' bf16 elements per
    layer (the worked examples multiply by 2 bytes), divided by TP in example 2."""
    return 2 * seq * micro_batch * hidden * 2 * layers / tp


def seed_memory_per_gpu(*, params: float, shard: int, seq: int, micro_batch: int, hidden: int,
                        layers_per_gpu: int, tp: int = 1) -> dict[str, float]:
    """Per-GPU bytes by the seed's formulas: model state divided over `shard` devices (TP·PP,
    or the FSDP group), checkpointed activations of the layers this GPU holds."""
    per_gpu = params / shard
    return {
        "weights": 2 * per_gpu,
        "gradients": 2 * per_gpu,
        "optimizer": SEED_OPTIMIZER_BYTES * per_gpu,
        "activations": seed_checkpointed_activation_bytes(
            seq=seq, micro_batch=micro_batch, hidden=hidden, layers=layers_per_gpu, tp=tp),
    }


def seed_example_1() -> dict[str, float]:
    """7B (6.7e9) with FSDP over 8 H100, seq 4096, micro-batch 2, checkpointing: 17.5 GB."""
    return seed_memory_per_gpu(params=6.7e9, shard=8, seq=4096, micro_batch=2, hidden=4096,
                               layers_per_gpu=32)


def seed_example_2() -> dict[str, float]:
    """200B with TP=8, PP=4 (24 layers per stage), DP=8 replicas, micro-batch 4: the seed
    prints ~51.4 GB, but its own formulas give twice the model state (see docs/advisor.md)."""
    return seed_memory_per_gpu(params=200e9, shard=8 * 4, seq=4096, micro_batch=4, hidden=12288,
                               layers_per_gpu=24, tp=8)


SEED_EXAMPLE_2_PRINTED = {"weights": 6.25e9, "gradients": 6.25e9, "optimizer": 37.5e9,
                          "activations": 1.15e9}
"""What seed §3 prints for example 2 (total '~51.4 GB'; the items sum to 51.15 GB)."""


def seed_layer_params(hidden: int, ffn: int) -> int:
    """Seed's `estimate_layer_params`: 4h² + 3·h·ffn + 2h (a SwiGLU MLP, even for GELU models)."""
    return 4 * hidden**2 + 3 * hidden * ffn + 2 * hidden


@dataclass(frozen=True)
class SeedPlan:
    degrees: RankLayout
    """tp, pp, dp as the seed picks them (it has no context parallelism)."""
    micro_batch_size: int
    num_micro_batches: int
    fsdp: bool
    bubble: float


def seed_greedy_plan(*, params: float, hidden: int, layers: int, ffn: int, seq: int,
                     global_batch: int, gpus: int, gpus_per_node: int = 8,
                     gpu_memory_gb: float = 80) -> SeedPlan:
    """The seed's greedy heuristic, line by line (bf16). Raises ValueError as the seed does
    when PP would exceed 32."""
    budget = gpu_memory_gb * 1e9 * 0.85
    total_state = params * SEED_BYTES_PER_PARAM
    tp = 1
    while tp <= gpus_per_node:  # phase 1: TP until one layer (+ its activations) fits
        layer_mem = seed_layer_params(hidden, ffn) * SEED_BYTES_PER_PARAM / tp
        act = 2 * seq * 4 * hidden * 2 / tp
        if layer_mem + act < budget:
            break
        tp *= 2
    tp = min(tp, gpus_per_node)
    pp = 1
    while True:  # phase 2: PP until the model state fits
        per_gpu = total_state / (tp * pp) + (layers // pp) * 2 * seq * 4 * hidden * 2 / tp
        if per_gpu < budget:
            break
        pp *= 2
        if pp > 32:
            raise ValueError("Model too large for available GPU memory even with PP=32")
    dp = gpus // (tp * pp)  # phase 3
    if dp < 1:
        raise ValueError(f"Need {tp * pp} GPUs per replica but only {gpus} available")
    micro_batches = max(pp * 4, 8)  # phase 4: fixed micro-batch 4, ignores the global batch
    fsdp = total_state / (tp * pp) > gpu_memory_gb * 1e9 * 0.5
    return SeedPlan(RankLayout(tp=tp, pp=pp, dp=dp), micro_batch_size=4, num_micro_batches=micro_batches,
                    fsdp=fsdp, bubble=(pp - 1) / micro_batches if pp > 1 else 0.0)
