"""Step time: compute (a roofline per matmul), communication per parallel dimension with the
overlap we assume, the pipeline bubble and the optimizer step.

Compute. Each matmul of a layer takes max(FLOPs / (peak·gemm_efficiency), bytes / HBM
bandwidth), its efficiency lowered for small outputs (`wave_efficiency`) and short inner
dimensions (`Hardware.gemm_k_overhead`): small micro-batches or high TP degrees make GEMMs
memory-bound and slow, which is why the search does not simply take micro-batch 1 and TP 8. Backward is twice the forward's
FLOPs (input and weight gradients). Fused attention does the causal half of its nominal FLOPs at
`attention_efficiency` (backward 2.5× forward: flash attention recomputes the scores); eager
attention does all of them and also streams the s×s scores through HBM. Norms, RoPE,
activations and residual adds are memory-bound: their bytes over the HBM bandwidth.

Communication (times from `trainyard.plugins.advisor.comm`), with the overlap we assume:
- TP: 2 all-reduces per layer in forward and 2 in backward (all-gather + reduce-scatter with
  sequence parallelism: the same bytes), 2 more when full recomputation reruns the forward.
  Not overlapped (Megatron's default; async TP would hide part of it).
- CP: ring attention passes K and V chunks (cp−1 steps), gradients back in backward;
  overlapped with the attention kernels, only the excess is exposed.
- EP: 2 all-to-alls per MoE layer forward (dispatch, combine) and 2 backward; not overlapped.
- PP: one activation send per stage boundary and micro-batch (1/tp of it per TP rank:
  Megatron's scatter/gather); the 2·(p·v − 1) hops of the fill and drain are exposed, 10 % of
  the steady-state traffic is (the rest overlaps other micro-batches' compute).
- DP: DDP all-reduces the gradients once per step, overlapped with the last micro-batch's
  backward; ZeRO-1 reduce-scatters the gradients and all-gathers the parameters once per step;
  ZeRO-2 reduce-scatters every micro-batch; ZeRO-3 all-gathers parameters in forward and in
  backward and reduce-scatters gradients, every micro-batch, layer by layer with one layer of
  prefetch (`TimeModel._zero3_per_microbatch_s`). Each is overlapped with the compute it can
  hide behind, at most `comm_overlap` of it (90 % on GPUs, none on CPU where gloo and compute
  share the cores; `comm.exposed_s`).

Pipeline: compute time (m + (p−1)/v) · t_microbatch, i.e. the bubble (p−1)/(v·m) of 1F1B and
interleaved 1F1B (Narayanan et al. 2021), on the slowest stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from trainyard.plugins.advisor.comm import (
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    exposed_s,
    group_levels,
    p2p_s,
)
from trainyard.plugins.advisor.hardware import Hardware
from trainyard.plugins.advisor.layout import Implementation, Layout
from trainyard.plugins.advisor.memory import MemoryModel
from trainyard.plugins.advisor.model import ModelProfile

STEADY_PP_EXPOSED = 0.1
NORM_PASSES_FUSED = 3
"""A fused RMSNorm reads its input and the weight, writes its output: ~3 passes of T·h·e bytes."""
NORM_PASSES_COMPOSITE = 12
"""torch's decomposed RMSNorm: upcast to fp32, square, mean, rsqrt, two multiplies, downcast —
each an HBM round trip of fp32 data: ~12 passes of T·h·e bytes (e = 2)."""
OPTIMIZER_BYTES_PER_PARAM = 30
"""Adam step traffic per parameter it updates: read the fp32 gradient (4), read and write the
fp32 master (8), m (8) and v (8), write the compute copy (2)."""


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Seconds for one layer and one micro-batch on one device."""

    forward: float
    backward: float
    elementwise_forward: float
    attention_forward: float
    alternate_matmuls_forward: float
    """wk, wo and w3: the matmuls torchtitan's op-level SAC recomputes."""
    tp_collective: float
    """One TP all-reduce (or all-gather + reduce-scatter) of the layer's activations."""
    cp_exposed: float
    ep: float


def peak_flops(model: ModelProfile, hw: Hardware) -> float:
    return hw.gpu.peak_flops_at(model.precision)


GEMM_TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
"""Output tile shapes cuBLAS/CUTLASS choose among for bf16 GEMMs on Ampere and Hopper (NVIDIA,
"Matrix Multiplication Background User's Guide": tile and wave quantization)."""


@lru_cache(maxsize=65536)
def wave_efficiency(m: int, n: int, sm_count: int | None) -> float:
    """Fraction of the SMs' time an m×n GEMM output keeps busy, for the best tile shape.

    A GEMM is cut into ⌈m/tm⌉·⌈n/tn⌉ output tiles, run in waves of one tile per SM; the last
    wave and the tiles' padding do no useful work, so the efficiency is
    m·n / (⌈tiles/SMs⌉ · SMs · tm·tn) (NVIDIA's tile and wave quantization). Large GEMMs are
    close to 1 whatever the tile; small ones (a micro-batch of a few hundred tokens, a narrow
    matrix split 8 ways by TP) fill only part of a wave — the small-GEMM inefficiency one
    constant cannot express. Smaller tiles quantise better; we take the best shape and do not
    charge them their lower data reuse (the roofline's bytes term covers bandwidth)."""
    if sm_count is None:
        return 1.0
    best = 0.0
    for tm, tn in GEMM_TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(tiles / sm_count)
        best = max(best, m * n / (waves * sm_count * tm * tn))
    return best


def _gemm_s(hw: Hardware, peak: float, e: int, m: float, k: float, n: float,
            weight_copies: float = 1.0) -> float:
    """One matmul (m×k)·(k×n): a roofline of its FLOPs at the GEMM efficiency of its size
    (`gemm_efficiency` × `wave_efficiency` × k / (k + `gemm_k_overhead`)) and of its bytes at
    the HBM bandwidth."""
    flops = 2 * m * k * n
    traffic = e * (m * k + k * n * weight_copies + m * n)
    efficiency = (hw.gpu.gemm_efficiency * k / (k + hw.gpu.gemm_k_overhead)
                  * wave_efficiency(max(1, round(m)), max(1, round(n)), hw.gpu.sm_count))
    return max(flops / (peak * efficiency), traffic / hw.gpu.memory_bandwidth)


@lru_cache(maxsize=65536)
def layer_cost(model: ModelProfile, hw: Hardware, impl: Implementation, micro_batch: int,
               tp: int, cp: int, sp: bool, ep: int) -> LayerCost:
    e = model.bytes_per_element
    peak = peak_flops(model, hw)
    h, s, a = model.hidden_size, model.sequence_length, model.num_heads
    tokens = micro_batch * s / cp
    ffn = model.ffn_hidden_size
    k_top = model.experts_per_token
    q = _gemm_s(hw, peak, e, tokens, h, h / tp)
    kv = _gemm_s(hw, peak, e, tokens, h, model.kv_dim / tp)
    o = _gemm_s(hw, peak, e, tokens, h / tp, h)
    local_experts = (model.num_experts or 1) / ep if model.is_moe else 1
    routed = tokens * k_top
    up = _gemm_s(hw, peak, e, routed, h, ffn / tp, local_experts)
    down = _gemm_s(hw, peak, e, routed, ffn / tp, h, local_experts)
    gemms = q + 2 * kv + o + (model.mlp_matrices - 1) * up + down
    alternate = kv + o + (up if model.mlp_matrices == 3 else 0.0)
    # Attention core: causal half of 4·T·s·h/tp FLOPs when fused; eager does all and streams scores.
    attn_flops = 4 * tokens * s * h / tp
    if impl.flash_attention:
        attn_fwd = 0.5 * attn_flops / (peak * hw.gpu.attention_efficiency)
        attn_bwd = 2.5 * attn_fwd
    else:
        scores_bytes = micro_batch * (a / tp) * (s / cp) * s * e
        attn_fwd = attn_flops / (peak * hw.gpu.gemm_efficiency) + 4 * scores_bytes / hw.gpu.memory_bandwidth
        attn_bwd = 2 * attn_fwd
    outside = tp if sp else 1
    kv_copy = 2 * (1 - model.kv_ratio) if impl.kv_expanded else 0.0
    act_passes = (5 if model.activation == "swiglu" else 2) * model.ffn_ratio * k_top
    norm_passes = 2 * (NORM_PASSES_COMPOSITE if impl.composite_norm else NORM_PASSES_FUSED)
    outside_passes = norm_passes + 6  # two norms, two residual adds (read 2, write 1)
    elem_bytes = tokens * h * e * (outside_passes / outside
                                   + (2 * (1 + model.kv_ratio) + kv_copy + act_passes) / tp)
    elem_fwd = elem_bytes / hw.gpu.memory_bandwidth
    overhead = hw.gpu.layer_overhead_s
    forward = gemms + attn_fwd + elem_fwd + overhead / 3
    backward = 2 * gemms + attn_bwd + 2 * elem_fwd + 2 * overhead / 3
    tp_levels = group_levels(hw, ((tp, 1),))
    tp_coll = all_reduce_s(tp_levels, tokens * h * e) if tp > 1 else 0.0
    cp_exposed = 0.0
    if cp > 1:
        cp_levels = group_levels(hw, ((cp, tp),))
        kv_bytes = 2 * micro_batch * (s / cp) * model.kv_dim / tp * e
        ring = (cp - 1) * sum(kv_bytes / lv.bandwidth + lv.latency for lv in cp_levels[-1:])
        cp_exposed = max(ring - attn_fwd, 0.0) + max(2 * ring - attn_bwd, 0.0)
    ep_s = 0.0
    if ep > 1:
        ep_levels = group_levels(hw, ((ep, tp * cp),))
        ep_s = 4 * all_to_all_s(ep_levels, routed * h * e / (tp if sp else 1))
    return LayerCost(forward=forward, backward=backward, elementwise_forward=elem_fwd,
                     attention_forward=attn_fwd, alternate_matmuls_forward=alternate,
                     tp_collective=tp_coll, cp_exposed=cp_exposed,
                     ep=ep_s)


@dataclass(frozen=True, slots=True)
class StepTime:
    step_s: float
    compute_s: float
    """Pipeline compute including the bubble and the exposed per-micro-batch communication."""
    microbatch_s: float
    """One micro-batch's forward + backward on the slowest stage."""
    bubble_fraction: float
    optimizer_s: float
    communication_s: dict[str, float]
    """Exposed seconds per step, per dimension (tp, cp, ep, pp, dp)."""


def _recompute_s(cost: LayerCost, recompute: str, impl: Implementation) -> tuple[float, int]:
    """(extra seconds, extra TP collectives) recomputation adds to one layer's backward."""
    if recompute == "full":
        return cost.forward, 2
    if recompute == "selective":
        if impl.selective_policy == "core_attention":
            return cost.attention_forward, 0
        extra = cost.elementwise_forward + (0.0 if impl.flash_attention else cost.attention_forward)
        if impl.selective_policy == "alternate_matmuls":
            extra += cost.alternate_matmuls_forward
        return extra, 0
    return 0.0, 0


class TimeModel:
    """Step times of layouts of one model on one device type (shapes cached, as `MemoryModel`)."""

    def __init__(self, model: ModelProfile, hw: Hardware, impl: Implementation,
                 memory: MemoryModel | None = None) -> None:
        self.model, self.hw, self.impl = model, hw, impl
        self.memory = memory or MemoryModel(model, hw, impl)
        self.e = model.bytes_per_element
        self.peak = peak_flops(model, hw)
        self._head: dict[tuple, float] = {}

    def head_s(self, layout: Layout) -> float:
        """Output head forward and backward plus the loss, for one micro-batch."""
        key = (layout.micro_batch_size, layout.degrees.tp, layout.degrees.cp)
        hit = self._head.get(key)
        if hit is None:
            model, hw, e = self.model, self.hw, self.e
            tokens = layout.micro_batch_size * model.sequence_length / layout.degrees.cp
            fwd = _gemm_s(hw, self.peak, e, tokens, model.hidden_size, model.vocab_size / layout.degrees.tp)
            loss = tokens * model.vocab_size / layout.degrees.tp * (e + 12) / hw.gpu.memory_bandwidth
            hit = self._head[key] = 3 * fwd + loss
        return hit

    def step(self, layout: Layout) -> StepTime:
        model, hw, impl, e = self.model, self.hw, self.impl, self.e
        tp, cp, pp = layout.degrees.tp, layout.degrees.cp, layout.degrees.pp
        v, m = layout.vpp, layout.num_micro_batches
        cost = layer_cost(model, hw, impl, layout.micro_batch_size, tp, cp,
                          layout.sequence_parallel, layout.ep)
        extra, extra_coll = _recompute_s(cost, layout.recompute, impl)
        tp_per_layer = (4 + extra_coll) * cost.tp_collective
        layer_s = cost.forward + cost.backward + extra + tp_per_layer + cost.cp_exposed + cost.ep
        counts = self.memory.stage_counts(pp, v)
        stages = {0: counts[0] * layer_s, pp - 1: counts[-1] * layer_s + self.head_s(layout)}
        if pp > 2:  # the busiest middle rank: an uneven split runs at its pace
            stages[max(range(1, pp - 1), key=lambda i: counts[i])] = max(counts[1:-1]) * layer_s
        slow_stage = max(stages, key=lambda i: stages[i])
        mb_s = stages[slow_stage]
        layers = counts[slow_stage]
        fwd_window = layers * (cost.forward + 2 * cost.tp_collective)
        bwd_window = layers * (cost.backward + extra)

        # Data parallelism over the dp·cp ranks that hold the same parameters.
        params = self.memory.stage_params(layout, slow_stage, layers)
        n_params = params.dense + params.experts
        per_mb_dp = step_dp = 0.0
        if layout.shard_group > 1:
            per_mb_dp, step_dp = self._data_parallel_s(layout, n_params, layers, fwd_window, bwd_window)
        mb_total = mb_s + per_mb_dp
        bubble = (pp - 1) / (v * m) if pp > 1 else 0.0
        compute = (m + (pp - 1) / v) * mb_total if pp > 1 else m * mb_total
        pp_s = 0.0
        if pp > 1:
            hop = p2p_s(hw, stride=impl.strides(layout)[1], size=pp,
                        nbytes=layout.micro_batch_size * model.sequence_length / cp
                        * model.hidden_size * e / tp)
            pp_s = hop * (2 * (pp * v - 1) + STEADY_PP_EXPOSED * 2 * m * v)
        shard = layout.shard_group if layout.zero_stage >= 1 else 1
        optimizer = OPTIMIZER_BYTES_PER_PARAM * n_params / shard / hw.gpu.memory_bandwidth
        layer_steps = m * layers
        communication = {
            "tp": layer_steps * tp_per_layer,
            "cp": layer_steps * cost.cp_exposed,
            "ep": layer_steps * cost.ep,
            "pp": pp_s,
            "dp": step_dp + m * per_mb_dp,
        }
        return StepTime(step_s=compute + pp_s + step_dp + optimizer, compute_s=compute,
                        microbatch_s=mb_total, bubble_fraction=bubble, optimizer_s=optimizer,
                        communication_s=communication)

    def _data_parallel_s(self, layout: Layout, n_params: float, layers: int, fwd_window: float,
                         bwd_window: float) -> tuple[float, float]:
        """(exposed seconds per micro-batch, exposed seconds once per step)."""
        hw, overlap = self.hw, self.hw.gpu.comm_overlap
        d = layout.degrees
        levels = group_levels(hw, ((d.cp, d.tp), (d.dp, self.impl.strides(layout)[0])))
        zero = self.impl.effective_zero(layout.zero_stage)
        if zero == 3:
            return self._zero3_per_microbatch_s(layout, levels, n_params, layers, fwd_window / layers,
                                                bwd_window / layers), 0.0
        grads_bytes, weight_bytes = self.memory.g * n_params, self.e * n_params
        units = layers * self.impl.collectives_per_layer + 1  # + the root (embedding, head)
        hier = self.impl.hierarchical_collectives
        reduce_s = all_gather_s(levels, grads_bytes, count=units, hierarchical=hier)
        gather_s = all_gather_s(levels, weight_bytes, count=units, hierarchical=hier)
        if zero == 0:
            buckets = max(1, math.ceil(grads_bytes / self.impl.ddp_bucket_bytes))
            return 0.0, exposed_s(all_reduce_s(levels, grads_bytes, count=buckets, hierarchical=hier),
                                  bwd_window, overlap=overlap)
        if zero == 1:
            return 0.0, (exposed_s(reduce_s, bwd_window, overlap=overlap)
                         + exposed_s(gather_s, fwd_window, overlap=overlap))
        return (exposed_s(reduce_s, bwd_window, overlap=overlap),  # ZeRO-2
                exposed_s(gather_s, fwd_window, overlap=overlap))

    def _zero3_per_microbatch_s(self, layout: Layout, levels: tuple, n_params: float, layers: int,
                                fwd_layer: float, bwd_layer: float) -> float:
        """ZeRO-3 / FSDP communication left exposed in one micro-batch, layer by layer.

        FSDP gathers each layer's parameters just before it runs and prefetches one ahead
        (FSDP2's implicit prefetch, DeepSpeed's prefetch bucket): layer i+1's all-gather hides
        behind layer i's compute, so per layer only max(g − f, (1 − overlap)·g) is exposed, and
        the first gather of each pass is not hidden at all. Backward gathers again (parameters
        were resharded after forward) and reduce-scatters each layer's gradients behind the next
        layer's backward; the last reduce-scatter is exposed. With g = α·(p − 1)·c + bytes/bw per
        layer (c collectives per layer, `comm.all_gather_s`), the latency term grows with the
        data-parallel group while the compute per layer shrinks with the micro-batch: once
        g > f the step is communication-bound, which is how ZeRO-3 throughput falls with scale.

            forward  = g + (L − 1)·exposed(g, f)
            backward = g + (L − 1)·exposed(g + r, b) + r
        plus the embedding and head (one unit each way, hidden like a layer).
        """
        overlap, per = self.hw.gpu.comm_overlap, self.impl.collectives_per_layer
        hier = self.impl.hierarchical_collectives
        layer_params = (self.memory.layer_dense + self.memory.layer_experts / layout.ep) / layout.degrees.tp
        root = max(n_params - layers * layer_params, 0.0)
        gather = all_gather_s(levels, self.e * layer_params, count=per, hierarchical=hier)
        reduce = all_gather_s(levels, self.memory.g * layer_params, count=per, hierarchical=hier)
        forward = gather + (layers - 1) * exposed_s(gather, fwd_layer, overlap=overlap)
        backward = gather + (layers - 1) * exposed_s(gather + reduce, bwd_layer, overlap=overlap) + reduce
        if root:
            root_gather = all_gather_s(levels, self.e * root, hierarchical=hier)
            root_reduce = all_gather_s(levels, self.memory.g * root, hierarchical=hier)
            forward += exposed_s(root_gather, fwd_layer, overlap=overlap)
            backward += exposed_s(root_gather + root_reduce, bwd_layer, overlap=overlap)
        return forward + backward
