"""Model FLOPs per token and MFU, for the `mfu` metric.

FLOPs per token come from the advisor (`ModelProfile.model_flops_per_token`), the same count
the plan's MFU estimate uses, so measured and predicted MFU are comparable:
6·N + 12·L·h·s — N the matmul weights (the output head included; neither the embedding
lookup nor the norm weights do a matmul), plus the attention scores and values (QKᵀ and AV: 2·2·s·h
forward per layer and token, times 3 for forward + backward), counting the full s×s product
and not the causal half, as PaLM (appendix B), Megatron and torchtitan do. Recomputation is not
counted (that would be HFU). For the demo model (N = 4·184,320 + 32,768 = 770,048, L 4,
h 128, s 128) that is 6·770,048 + 12·4·128·128 = 5,406,720 FLOPs per token.

Peak FLOP/s per device come from the advisor's hardware catalog: the dense bf16 figure, or
the fp32 one when the job trains in fp32 (the CPU entry is a nominal 0.1 TFLOP/s per slot).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from config.spec import ModelHints


def flops_per_token(hints: ModelHints) -> float:
    """Training FLOPs per token of the model the hints describe (see the module docstring)."""
    from plugins.advisor.model import ModelProfile

    return ModelProfile.from_hints(hints).model_flops_per_token()


def peak_flops_per_device(gpu_type: str, precision: str = "bf16") -> float:
    """Dense peak FLOP/s of one device of `gpu_type` at the training precision."""
    from plugins.advisor.hardware import gpu_spec

    spec = gpu_spec(gpu_type)
    return float(spec.peak_flops_fp32 if precision == "fp32" else spec.peak_flops)


def mfu(tokens_per_s: float, flops_per_token: float, num_devices: int, peak_flops: float) -> float:
    """Model FLOP/s utilisation: achieved model FLOP/s over the devices' peak.
    `tokens_per_s` is the whole job's throughput, `peak_flops` one device's."""
    if num_devices < 1 or peak_flops <= 0:
        raise ValueError(f"num_devices must be >= 1 and peak_flops > 0, got {num_devices}, {peak_flops}")
    return tokens_per_s * flops_per_token / (num_devices * peak_flops)
