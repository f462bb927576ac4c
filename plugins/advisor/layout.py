"""`Layout`: one way to split a job — the degrees and knobs the advisor searches over — and
`Implementation`: what the training code saves and keeps, which decides how much memory a
layout needs.

A `Layout` is the plain, hashable core of a `Plan` (no estimates), cheap enough to create
tens of thousands of times during a search. Its degrees are a `RankLayout` (`degrees`, their one
carrier), shared by every variant of a structure the search tries.

Rank order: `RankLayout` (`plugins/advisor/rank_layout.py`), the worker's device mesh —
fastest-varying first tp, cp, dp, pp. TP groups are consecutive ranks, so they sit inside one
node; a DP group's stride is tp·cp; a PP group's stride is tp·cp·dp. An `Implementation` may
model another stack's order (Llama 3 put pipeline inside data parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from trainyard.config.spec import Recompute
from trainyard.plugins.advisor.plan import layout_label
from trainyard.plugins.advisor.rank_layout import RankLayout

RECOMPUTE_LEVEL = {"none": 0, "selective": 1, "full": 2}


@dataclass(frozen=True, slots=True)
class Layout:
    degrees: RankLayout = field(default_factory=RankLayout)
    """tp, pp, dp, cp in the one rank order (one rank per node: the advisor models nodes
    through `Hardware.gpus_per_node`)."""
    vpp: int = 1
    ep: int = 1
    """Expert-parallel degree (MoE): experts split over `ep` ranks of the dp·cp group."""
    zero_stage: int = 0
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    recompute: Recompute = "none"
    sequence_parallel: bool = False

    @property
    def shard_group(self) -> int:
        """Ranks that hold the same parameters: ZeRO shards and gradients reduce over dp·cp."""
        return self.degrees.dp * self.degrees.cp

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.num_micro_batches * self.degrees.dp

    def complexity(self) -> int:
        """How much machinery the layout needs; ties in step time go to the lower score."""
        d = self.degrees
        return (8 * (d.pp > 1) + 8 * (d.tp > 1) + 8 * (d.cp > 1) + 8 * (self.ep > 1)
                + 4 * (self.vpp > 1) + 2 * RECOMPUTE_LEVEL[self.recompute] + self.zero_stage
                + int(self.sequence_parallel))

    def describe(self) -> str:
        return layout_label(self.degrees, vpp=self.vpp, ep=self.ep,
                            zero_stage=self.zero_stage, micro_batch_size=self.micro_batch_size,
                            num_micro_batches=self.num_micro_batches, recompute=self.recompute,
                            sequence_parallel=self.sequence_parallel)


@dataclass(frozen=True)
class Implementation:
    """What the training code keeps in memory — the conventions behind the memory model.

    `pytorch` is the worker's model as it runs (eager PyTorch) and is measured by the unit
    tests; `fused` is Megatron-Core / Transformer Engine (or torch.compile) style kernels;
    `torchtitan` is the eager torchtitan Llama with its op-level SAC;
`megatron` is the code behind Narayanan et al. 2021 and Korthikanti et al. 2022 (fused
LayerNorm, materialised attention scores, dropout, GELU); `deepspeed_zero3` is that model
under DeepSpeed's ZeRO-3 (Narayanan et al. 2021, Table 2).
    """

    name: str
    composite_norm: bool
    """`nn.RMSNorm` as torch 2.13 decomposes it: saves the input upcast to fp32, the fp32
    normalised tensor and the output (8 + e bytes per element); a fused norm keeps its input
    and output (2e)."""
    flash_attention: bool
    """Fused attention (SDPA flash / memory-efficient): keeps q, k, v, output and the log-sum-exp;
    without it the s×s scores are materialised (Korthikanti's 5as/h term)."""
    kv_expanded: bool
    """GQA implemented by repeating K and V to every query head before attention (the worker,
    torchtitan): attention then keeps full-width K and V."""
    dropout: bool
    fused_swiglu: bool
    """Fused SwiGLU keeps gate and up and recomputes silu(gate)·up (3F kept instead of 4F)."""
    selective_policy: Literal["matmul_outputs", "alternate_matmuls", "core_attention"]
    """What `selective` recomputation keeps. `matmul_outputs`: the outputs of every matmul and
    of attention; norms, RoPE, activations recomputed (the worker's op-level SAC).
    `alternate_matmuls`: torchtitan's op-level SAC, which also recomputes every second matmul.
    `core_attention`: everything except QKᵀ/softmax/dropout/AV (Korthikanti et al. 2022)."""
    norm_keeps_fp32_normalised: bool = True
    """For a composite norm: True is `nn.RMSNorm` (8 + e bytes per element, above). False is the
    Llama reference RMSNorm, `self._norm(x.float()).type_as(x) * self.weight` — torchtitan's
    `rmsnorm` in 2024 (torchtitan/models/norms.py) — which casts back before the weight: it keeps
    the fp32 input, the normalised tensor in the compute dtype and the weighted output (4 + 2e;
    measured in tests/unit/advisor/test_advisor_activations.py)."""
    zero3_fp32_shards: bool = False
    """FSDP2 with a mixed-precision policy (the worker, torchtitan) keeps the sharded parameters
    in fp32 and gathers them in the compute dtype: under ZeRO-3 the shard *is* the optimizer's
    fp32 master, with no low-precision shard beside it (16 bytes/param sharded, not 18).
    DeepSpeed's ZeRO-3 keeps an fp16 shard and an fp32 master partition (False)."""
    fp32_grads: bool = True
    """Mixed precision keeps fp32 gradients (FSDP2 reduce_dtype=fp32, DDP on fp32 parameters,
    Megatron's main_grad): 18 bytes/param in all. False is ZeRO's 2-byte accounting (16)."""
    ddp_bucket_copy: bool = False
    """DDP without `gradient_as_bucket_view` keeps a second copy of the gradients in its buckets."""
    zero3_live_layers: float = 2
    """Unsharded layers alive at once under ZeRO-3: FSDP2 gathers a whole block and prefetches
    the next (2); DeepSpeed gathers module by module (about half a layer alive)."""
    zero_reduce_bucket_bytes: float | None = None
    """Unsharded gradients waiting for the reduce-scatter: one layer's under FSDP2 (None), which
    exist once that layer's backward has freed its activations (`MemoryModel.stage` counts the
    larger of the two, not both); DeepSpeed's reduce bucket (5e8 elements in fp16 = 1 GB), which
    fills over many layers, otherwise."""
    collectives_per_layer: int = 1
    """ZeRO collectives per layer and direction: FSDP2 gathers a block's parameters as one
    flat buffer; DeepSpeed ZeRO-3 gathers each linear layer separately (4)."""
    ddp_bucket_bytes: int = 100 * 1024**2
    """DDP's gradient bucket (the worker sets bucket_cap_mb=100): one all-reduce per bucket."""
    zero1_as_zero2: bool = False
    """FSDP2 has no ZeRO-1: the worker runs stage 1 like stage 2 (parameters kept gathered from
    forward to backward, gradients reduce-scattered after every micro-batch and kept sharded)."""
    hierarchical_collectives: bool = True
    """NCCL spreads a collective's cross-node traffic over the node's HCAs (one ring per HCA),
    so the GPUs of a node share it (`comm.ring_bandwidth_s`). False: each GPU's own link carries
    its full (p−1)/p share of every data-parallel collective — DeepSpeed's 2021 ZeRO-3: at a fixed batch its throughput per GPU
    halved with each doubling of the ranks ([N21] Table 2, 144 → 88 → 44 TFLOP/s), a step time
    constant in p at about one HCA's bandwidth per GPU; hierarchical rings would move the same
    bytes 8× faster and leave those runs compute-bound."""
    pipeline_inside_data: bool = False
    """Rank order. False: tp, cp, dp, pp from fastest to slowest (the worker's mesh, torchtitan,
    Megatron) — pipeline groups span the whole job. True: tp, cp, pp, dp (Llama 3) — pipeline
    groups stay close, data-parallel groups span the job."""

    def effective_zero(self, zero_stage: int) -> int:
        return 2 if (zero_stage == 1 and self.zero1_as_zero2) else zero_stage

    def strides(self, layout: Layout) -> tuple[int, int]:
        """(dp stride, pp stride) in ranks for `layout` under this rank order."""
        order = layout.degrees
        if self.pipeline_inside_data:
            inner = order.tp * order.cp
            return inner * order.pp, inner
        return order.stride("dp"), order.stride("pp")


PYTORCH = Implementation(
    name="pytorch", composite_norm=True, flash_attention=True, kv_expanded=True, dropout=False,
    fused_swiglu=False, selective_policy="matmul_outputs", ddp_bucket_copy=True,
    zero1_as_zero2=True, zero3_fp32_shards=True)
FUSED = Implementation(
    name="fused", composite_norm=False, flash_attention=True, kv_expanded=False, dropout=False,
    fused_swiglu=True, selective_policy="matmul_outputs")
MEGATRON = Implementation(
    name="megatron", composite_norm=False, flash_attention=False, kv_expanded=False,
    dropout=True, fused_swiglu=False, selective_policy="core_attention")
DEEPSPEED_ZERO3 = Implementation(
    name="deepspeed_zero3", composite_norm=False, flash_attention=False, kv_expanded=False,
    dropout=True, fused_swiglu=False, selective_policy="core_attention", zero3_live_layers=0.5,
    zero_reduce_bucket_bytes=1e9, collectives_per_layer=4, hierarchical_collectives=False)
TORCHTITAN = Implementation(
    name="torchtitan", composite_norm=True, flash_attention=True, kv_expanded=True, dropout=False,
    fused_swiglu=False, selective_policy="alternate_matmuls", zero1_as_zero2=True,
    zero3_fp32_shards=True)
TORCHTITAN_2024 = replace(TORCHTITAN, name="torchtitan-2024", norm_keeps_fp32_normalised=False)
"""torchtitan as its first performance tables ran it (2024): the Llama reference RMSNorm."""
