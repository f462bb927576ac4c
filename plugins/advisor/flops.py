"""Model FLOPs per token, peak FLOP/s per device and MFU — the one definition of each.

The advisor's plan estimate, the worker's streamed `mfu` metric (`worker/session.py`) and the
cost report (`plugins/tracking/cost.py`) all divide the same numerator by the same denominator,
so a job's predicted, streamed and reported MFU are comparable.

FLOPs per token (`ModelProfile.model_flops_per_token`): 6·N + 12·L·h·s — N the matmul weights
(the output head included; neither the embedding lookup nor the norm weights do a matmul), plus
the attention scores and values (QKᵀ and AV: 2·2·s·h forward per layer and token, times 3 for
forward + backward), counting the full s×s product and not the causal half, as PaLM
(appendix B), Megatron and torchtitan do. Recomputation is not counted (that would be HFU). For
the demo model (N = 4·184,320 + 32,768 = 770,048, L 4, h 128, s 128) that is
6·770,048 + 12·4·128·128 = 5,406,720 FLOPs per token. With only a parameter count, 6·N (the
seed's §7 formula; it omits the attention term, ~3 % at s = 4096, h = 12288).

Peak FLOP/s per device: the dense bf16 figure of the hardware catalog, or the fp32 one (TF32
tensor cores) when the job trains in fp32; a cluster's `peakTflops` (dense bf16) overrides the
catalog and scales the fp32 figure with it (`hardware.with_peak`, what `hardware_for` does).
The CPU entry is a nominal 0.1 TFLOP/s per slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainyard.plugins.advisor.hardware import CATALOG, gpu_spec, with_peak

if TYPE_CHECKING:
    from trainyard.config.cluster import Cluster
    from trainyard.config.spec import ModelHints, Precision


def flops_per_token(hints: ModelHints) -> float:
    """Training FLOPs per token of the model the hints describe (see the module docstring)."""
    from trainyard.plugins.advisor.model import ModelProfile

    return ModelProfile.from_hints(hints).model_flops_per_token()


def flops_per_token_6n(num_parameters: float) -> float:
    """6·N: forward 2·N, backward 4·N (the seed's §7 approximation)."""
    return 6.0 * num_parameters


def peak_flops_per_device(gpu_type: str, precision: Precision | str = "bf16",
                          cluster: Cluster | None = None) -> float:
    """Dense peak FLOP/s of one device of `gpu_type` at the training precision. Raises
    `ValueError` for a type neither the catalog nor the cluster gives a peak for."""
    accel = cluster.spec.accelerators.get(gpu_type) if cluster is not None else None
    override = float(accel.peak_tflops) * 1e12 if accel is not None and accel.peak_tflops else None
    try:
        gpu = gpu_spec(gpu_type)
    except ValueError as e:
        if override is None:
            raise ValueError(f"no peak FLOP/s known for accelerator type {gpu_type!r}; "
                             "set peakTflops in the cluster") from e
        gpu = CATALOG["H100"]  # an unknown type: its fp32/bf16 ratio, as `hardware_for` assumes
    if override is not None:
        gpu = with_peak(gpu, override)
    return gpu.peak_flops_at(precision)


def mfu(tokens_per_s: float, flops_per_token: float, num_devices: int, peak_flops: float) -> float:
    """Model FLOP/s utilisation: achieved model FLOP/s over the devices' peak.
    `tokens_per_s` is the whole job's throughput, `peak_flops` one device's."""
    if num_devices < 1 or peak_flops <= 0:
        raise ValueError(f"num_devices must be >= 1 and peak_flops > 0, got {num_devices}, {peak_flops}")
    return tokens_per_s * flops_per_token / (num_devices * peak_flops)
