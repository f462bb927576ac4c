"""Memory per device, itemised: weights, gradients, optimizer state, activations, logits,
FSDP / DDP buffers and a fixed framework overhead.

Model state (Rajbhandari et al. 2019, ZeRO), per parameter held by a device:

    precision      weights  gradients  optimizer            total
    bf16 / fp16    2        4          12 (fp32 master+m+v)  18
    fp32           4        4           8 (m+v)              16

ZeRO's paper counts 2-byte gradients (16 bytes/param in mixed precision); the code people run
keeps them in fp32 (torch FSDP2 with reduce_dtype=fp32, DDP on fp32 parameters, Megatron's
main_grad), so we count 4 unless an `Implementation` says otherwise. ZeRO-1 divides the
optimizer state by the sharding group (dp·cp), ZeRO-2 the gradients too, ZeRO-3 (FSDP) the
weights too; tensor parallelism divides everything by tp, pipeline parallelism keeps only a
stage's layers (plus the embedding on the first stage, the head on the last).

Activations (Korthikanti et al. 2022) are counted per layer and micro-batch as the bytes
autograd keeps for backward — see `layer_activation_items` for the terms and how they map to
Korthikanti's `sbh(34 + 5as/h)` — then multiplied by the layers a stage holds and by the
micro-batches in flight on it: p − i on stage i under 1F1B (so the first stage holds L layers'
worth, whatever p), and Megatron's warm-up count under interleaved 1F1B (the first stage holds
L·(1 + (p−1)/(p·v)) layers' worth).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trainyard.config.pipeline import rank_layer_counts
from trainyard.plugins.advisor.hardware import Hardware
from trainyard.plugins.advisor.layout import Implementation, Layout
from trainyard.plugins.advisor.model import ModelProfile

LOGIT_BYTES_EXTRA = 8
"""Per logit beyond its compute-dtype copy: the fp32 log-probabilities cross-entropy keeps for
backward and their fp32 gradient (the worker computes the loss in fp32)."""


def layer_activation_items(model: ModelProfile, impl: Implementation, *, micro_batch: int,
                           tp: int = 1, cp: int = 1, sp: bool = False,
                           recompute: str = "none") -> dict[str, float]:
    """Bytes one layer keeps for backward for one micro-batch on one device, by item.

    With T = micro_batch·s/cp tokens, h hidden, e bytes per element, r = kv_heads/heads,
    F = ffn/h, and no recomputation (elements per T·h unless noted):

        norms          2 × (8+e)/e  composite RMSNorm (fp32 input copy, fp32 normalised, output)
                       2 × 2        fused norm (input, output)                     [/tp with SP]
        q, k, v        1 + 2r       post-RoPE, as attention keeps them (2 × 1 when K/V are
                                    repeated for GQA before attention)                     [/tp]
        attention out  1            the attention output, also the input of wo              [/tp]
        log-sum-exp    a/h · 4/e    flash attention's softmax statistics                   [/tp]
        scores         a·s/h        eager attention only: softmax output (+ dropout mask and
                                    output: Korthikanti's 5as/h in fp16)                   [/tp]
        MLP            4F           SwiGLU: gate, up, silu(gate), silu(gate)·up; 3F fused; GELU:
                                    2F (its input and output)                               [/tp]
        dropout masks  2 bytes/elem after attention and MLP, when the model has dropout  [/tp SP]

    Korthikanti's GPT layer (fused LayerNorm, eager attention with dropout, GELU MLP with
    F = 4, fp16) gives 2·2 + 3 + 1 + 8 elements + 2 mask bytes = 34 bytes·sbh, + 5as/h: their
    equation (1). Without TP the Llama-style block we train has no dropout, keeps K/V at full
    width and SwiGLU's four tensors: 2(8+e)/e + 3 + 1 + 4F elements (+ small terms).

    Recomputation keeps less:
    - `selective`, `matmul_outputs` policy (the worker's op-level SAC): the block input, the
      outputs of every matmul — q, k, v (pre-RoPE, unrepeated), wo's and w2's (full width,
      before the TP reduction), gate and up — and attention's output and log-sum-exp.
    - `selective`, `alternate_matmuls` (torchtitan's op-level SAC): as above without the
      outputs of every second matmul (wk, wo, w3), which are recomputed.
    - `selective`, `core_attention` policy (Korthikanti): everything but the scores.
    - `full`: the block input only (/tp with SP, else replicated: Korthikanti's 2sbh).
    """
    e = model.bytes_per_element
    h, a, s = model.hidden_size, model.num_heads, model.sequence_length
    tokens = micro_batch * s / cp
    th = tokens * h
    outside = tp if sp else 1
    k_top = model.experts_per_token
    F = model.ffn_ratio
    if model.activation == "swiglu":
        mlp_kept_none = (3 if impl.fused_swiglu else 4) * F
        mlp_kept_matmul = 2 * F
    else:
        mlp_kept_none = 2 * F
        mlp_kept_matmul = F
    if recompute == "full":
        return {"layer_input": th * e / outside}
    if recompute == "selective" and impl.selective_policy == "alternate_matmuls":
        # Saved: wq (1st matmul), wv (3rd), w1 (5th), w2 (7th), attention; recomputed: wk, wo, w3.
        return {
            "layer_input": th * e / outside,
            "qkv": (1 + model.kv_ratio) * th * e / tp,
            "attention_out": th * e / tp,
            "attention_lse": tokens * a * 4 / tp,
            "mlp": k_top * (mlp_kept_matmul / 2) * th * e / tp,
            "w2_out": k_top * th * e,
        }
    if recompute == "selective" and impl.selective_policy == "matmul_outputs":
        items = {
            "layer_input": th * e / outside,
            "qkv": (1 + 2 * model.kv_ratio) * th * e / tp,
            "attention_out": th * e / tp,
            "attention_lse": tokens * a * 4 / tp,
            "wo_out": th * e,
            "mlp": k_top * mlp_kept_matmul * th * e / tp,
            "w2_out": k_top * th * e,
        }
        if not impl.flash_attention:
            items.pop("attention_lse")
        return items
    kv_width = 1.0 if impl.kv_expanded else model.kv_ratio
    norm_bytes = ((8 + e if impl.norm_keeps_fp32_normalised else 4 + 2 * e) if impl.composite_norm
                  else 2 * e)
    items = {
        "norms": 2 * norm_bytes * th / outside,
        "norm_stats": 2 * tokens * 4 / outside,
        "qkv": (1 + 2 * kv_width) * th * e / tp,
        "attention_out": th * e / tp,
        "mlp": k_top * mlp_kept_none * th * e / tp,
    }
    if model.is_moe:
        items["router"] = tokens * model.num_experts * 4
    if impl.flash_attention:
        items["attention_lse"] = tokens * a * 4 / tp
    elif not (recompute == "selective" and impl.selective_policy == "core_attention"):
        scores = micro_batch * (a / tp) * (s / cp) * s
        items["attention_scores"] = scores * e
        if impl.dropout:
            items["attention_dropout"] = scores * (1 + e)
    if impl.dropout:
        items["dropout_masks"] = 2 * th * 1 / outside
    return items


@lru_cache(maxsize=65536)
def layer_activation_bytes(model: ModelProfile, impl: Implementation, micro_batch: int, tp: int,
                           cp: int, sp: bool, recompute: str) -> tuple[float, float]:
    """(kept, transient): bytes one layer keeps per micro-batch, and the extra bytes of the one
    layer being recomputed during backward (its full activations minus what it kept)."""
    kept = sum(layer_activation_items(model, impl, micro_batch=micro_batch, tp=tp, cp=cp, sp=sp,
                                      recompute=recompute).values())
    if recompute == "none":
        return kept, 0.0
    full = sum(layer_activation_items(model, impl, micro_batch=micro_batch, tp=tp, cp=cp, sp=sp,
                                      recompute="none").values())
    return kept, max(full - kept, 0.0)


def inflight_layer_microbatches(layers: int, stage: int, layout: Layout) -> float:
    """Layer-micro-batches of activations stage `stage` holds at its peak."""
    p, v, m = layout.degrees.pp, layout.vpp, layout.num_micro_batches
    if p == 1:
        return float(layers)
    if v == 1:
        return float(layers * min(p - stage, m))
    chunks = min(m * v, (p - stage - 1) * 2 + (v - 1) * p + 1)
    return layers / v * chunks


def state_bytes_per_param(model: ModelProfile, impl: Implementation) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter before any sharding."""
    if model.precision == "fp32":
        return 4, 4, 8
    return 2, (4 if impl.fp32_grads else 2), 12


@dataclass(frozen=True, slots=True)
class StageParams:
    """Parameters one device of a stage holds, before ZeRO sharding."""

    dense: float
    """Split by tp only; sharded by ZeRO over dp·cp."""
    experts: float
    """Split by tp·ep; sharded by ZeRO over dp·cp/ep."""
    largest_unit: float
    """Largest FSDP unit (a layer, or the embedding/head) on this device, for ZeRO-3 buffers."""


class MemoryModel:
    """Memory of layouts of one model on one device type, with the per-shape work cached (the
    search asks for tens of thousands of layouts that share a few dozen shapes)."""

    def __init__(self, model: ModelProfile, hw: Hardware, impl: Implementation) -> None:
        self.model, self.hw, self.impl = model, hw, impl
        self.e = model.bytes_per_element
        self.w, self.g, self.o = state_bytes_per_param(model, impl)
        self.layer_dense = model.layer_dense_parameters()
        self.layer_experts = model.layer_expert_parameters()
        self.embedding = model.embedding_parameters()
        self.head = model.head_parameters()
        self._activations: dict[tuple, tuple[float, float]] = {}
        self._params: dict[tuple, StageParams] = {}
        self._counts: dict[tuple[int, int], list[int]] = {}

    def stage_counts(self, pp: int, vpp: int = 1) -> list[int]:
        """Layers each pipeline rank holds (`trainyard.config.pipeline.rank_layer_counts`: uneven splits
        give the first and last stages the fewer layers)."""
        counts = self._counts.get((pp, vpp))
        if counts is None:
            counts = self._counts[(pp, vpp)] = rank_layer_counts(self.model.num_layers, pp, vpp)
        return counts

    def activations(self, layout: Layout) -> tuple[float, float]:
        d = layout.degrees
        key = (layout.micro_batch_size, d.tp, d.cp, layout.sequence_parallel, layout.recompute)
        hit = self._activations.get(key)
        if hit is None:
            hit = self._activations[key] = layer_activation_bytes(self.model, self.impl, *key)
        return hit

    def stage_params(self, layout: Layout, stage: int, layers: int) -> StageParams:
        key = (layout.degrees.tp, layout.ep, layout.degrees.pp, stage, layers)
        hit = self._params.get(key)
        if hit is None:
            tp, ep = layout.degrees.tp, layout.ep
            dense = layers * self.layer_dense / tp
            experts = layers * self.layer_experts / (tp * ep)
            units = [self.layer_dense / tp + self.layer_experts / (tp * ep)]
            if stage == 0:
                dense += self.embedding / tp
                units.append(self.embedding / tp)
            if stage == layout.degrees.pp - 1:
                head = self.head or (self.embedding if layout.degrees.pp > 1 else 0)
                dense += head / tp + self.model.hidden_size
                units.append(head / tp)
            hit = self._params[key] = StageParams(dense, experts, max(units))
        return hit

    def stage(self, layout: Layout, stage: int, layers: int) -> dict[str, float]:
        """Itemised bytes on one device of pipeline stage `stage` holding `layers` layers."""
        params = self.stage_params(layout, stage, layers)
        zero = self.impl.effective_zero(layout.zero_stage)
        n_dense = layout.shard_group
        n_exp = max(layout.shard_group // layout.ep, 1)
        full = params.dense + params.experts
        shard = params.dense / n_dense + params.experts / n_exp
        # FSDP2's fp32 shard is the master the optimizer term already counts (mixed precision).
        w_shard = 0 if (self.impl.zero3_fp32_shards and self.model.precision != "fp32") else self.w
        out = {
            "weights": (w_shard * shard if zero >= 3 else self.w * full),
            "gradients": self.g * (shard if zero >= 2 else full),
            "optimizer": self.o * (shard if zero >= 1 else full),
        }
        kept, transient = self.activations(layout)
        out["activations"] = kept * inflight_layer_microbatches(layers, stage, layout) + transient
        if stage == layout.degrees.pp - 1:
            tokens = layout.micro_batch_size * self.model.sequence_length / layout.degrees.cp
            out["logits"] = (tokens * self.model.vocab_size / layout.degrees.tp
                             * (self.e + LOGIT_BYTES_EXTRA))
        grads_waiting = (self.impl.zero_reduce_bucket_bytes if self.impl.zero_reduce_bucket_bytes
                         else params.largest_unit * self.g)
        if zero == 3:
            # The unsharded layers being computed and prefetched, and the unsharded gradients
            # waiting for the reduce-scatter. FSDP2's are one layer's, made as that layer's
            # backward ends, when its activations (kept and recomputed) are freed: the peak is
            # the larger of the two moments, so only the excess over them is added.
            if not self.impl.zero_reduce_bucket_bytes:
                grads_waiting = max(grads_waiting - kept - transient, 0.0)
            out["fsdp_buffers"] = params.largest_unit * self.impl.zero3_live_layers * self.e + grads_waiting
        elif zero in (1, 2):
            out["fsdp_buffers"] = grads_waiting
        elif self.impl.ddp_bucket_copy and layout.shard_group > 1:
            out["ddp_buckets"] = self.g * full
        out["framework"] = self.hw.gpu.framework_bytes
        return out

    def stages_to_check(self, pp: int, vpp: int = 1) -> list[int]:
        """The first and last rank (embedding; head and logits) and the busiest middle one:
        1F1B keeps the most micro-batches in flight on early ranks, so the earliest of the
        busiest."""
        counts = self.stage_counts(pp, vpp)
        stages = {0, pp - 1}
        if pp > 2:
            stages.add(max(range(1, pp - 1), key=lambda i: (counts[i], -i)))
        return sorted(stages)

    def total(self, layout: Layout) -> float:
        """Bytes on the device that needs the most (no itemisation: the search's fast path)."""
        counts = self.stage_counts(layout.degrees.pp, layout.vpp)
        return max(sum(self.stage(layout, i, counts[i]).values())
                   for i in self.stages_to_check(layout.degrees.pp, layout.vpp))

    def breakdown(self, layout: Layout) -> tuple[dict[str, int], int]:
        """The itemised bytes of the device that needs the most, and its pipeline stage."""
        counts = self.stage_counts(layout.degrees.pp, layout.vpp)
        per_stage = [(self.stage(layout, i, counts[i]), i)
                     for i in self.stages_to_check(layout.degrees.pp, layout.vpp)]
        items, stage = max(per_stage, key=lambda item: sum(item[0].values()))
        return {k: int(v) for k, v in items.items()}, stage


def memory_breakdown(model: ModelProfile, hw: Hardware, impl: Implementation,
                     layout: Layout) -> tuple[dict[str, int], int]:
    """The itemised bytes of the device that needs the most, and its pipeline stage."""
    return MemoryModel(model, hw, impl).breakdown(layout)

