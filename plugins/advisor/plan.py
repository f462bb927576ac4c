"""`Plan`: how one job is split over its devices — the contract between the advisor, the
dry run, the placer, the launcher and the worker runtime (`TRAINYARD_PLAN`).

Pure pydantic, no torch: like torchtitan's `ParallelDims`, a plan checks itself and names
every factor when they disagree, so it can be validated without starting a process. The degrees
are its `layout` (`RankLayout`, their one carrier); a plan written with flat `tp`/`pp`/`dp`/`cp`
keys (before #59: XCom of running jobs, stored attempts) still loads.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt, model_validator

from trainyard.config.spec import Recompute
from trainyard.plugins.advisor.rank_layout import RankLayout, lift_flat_degrees


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    layout: RankLayout = Field(default_factory=RankLayout)
    """The degrees: tensor (`tp`, inside one node), pipeline (`pp`, stages), data (`dp`,
    replicas, or FSDP shards when `zero_stage` ≥ 1) and context (`cp`, the sequence split)
    parallel, in the one rank order. One rank per node: only a placement knows more."""
    vpp: PositiveInt = 1
    """Virtual pipeline stages per pipeline rank (interleaved 1F1B when > 1)."""
    ep: PositiveInt = 1
    """Expert-parallel degree (mixture-of-experts only): experts split over `ep` ranks of the
    dp·cp group. Not a factor of the world size."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """0 = DDP, 1 = optimizer sharded, 2 = + gradients, 3 = + parameters (FSDP)."""
    micro_batch_size: PositiveInt = 1
    """Sequences per micro-batch per data-parallel replica."""
    num_micro_batches: PositiveInt = 1
    """Micro-batches per replica per optimizer step: gradient accumulation, and the pipeline's
    micro-batches when `pp` > 1."""
    activation_checkpointing: Recompute = "none"
    sequence_parallel: bool = False
    """Megatron sequence parallelism for norms/dropout (needs `tp` > 1)."""
    sequence_length: PositiveInt | None = None
    global_batch_size: PositiveInt | None = None
    """Sequences per optimizer step over all replicas = micro_batch_size·num_micro_batches·dp."""

    # Estimates, filled in by the advisor; absent on a plan written by hand.
    memory_per_gpu_bytes: int | None = None
    memory_breakdown: dict[str, int] = Field(default_factory=dict)
    """Bytes per device by item (`weights`, `gradients`, `optimizer`, `activations`, …)."""
    step_time_s: NonNegativeFloat | None = None
    tokens_per_s: NonNegativeFloat | None = None
    mfu: NonNegativeFloat | None = None
    hfu: NonNegativeFloat | None = None
    bubble_fraction: NonNegativeFloat | None = None
    communication_s: dict[str, float] = Field(default_factory=dict)
    """Communication left on the critical path per step, seconds, by dimension (tp, cp, ep, pp, dp)."""
    nccl_env: dict[str, str] = Field(default_factory=dict)
    """NCCL variables suggested for this plan on GPU clusters."""
    peak_flops_per_device: NonNegativeFloat | None = None
    """The MFU denominator on the cluster the attempt runs on (its `peakTflops` wins over the
    catalog's), set when the attempt is planned: the worker's streamed MFU and the cost report
    then divide by the same peak."""

    @model_validator(mode="before")
    @classmethod
    def _lift_flat_degrees(cls, data: object) -> object:
        return lift_flat_degrees(data)

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        d = self.layout
        if d.ranks_per_node != 1:
            raise ValueError(f"a plan's layout has one rank per node, got {d.ranks_per_node}: "
                             "ranks per node are the placement's")
        if self.vpp > 1 and d.pp == 1:
            raise ValueError(f"virtual pipeline stages vpp({self.vpp}) need pipeline parallelism; pp is 1")
        if self.sequence_parallel and d.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1")
        if (d.dp * d.cp) % self.ep:
            raise ValueError(f"ep({self.ep}) must divide dp({d.dp}) * cp({d.cp})")
        expected = self.micro_batch_size * self.num_micro_batches * d.dp
        if self.global_batch_size is not None and self.global_batch_size != expected:
            raise ValueError(
                f"Invalid plan: micro_batch_size({self.micro_batch_size}) * "
                f"num_micro_batches({self.num_micro_batches}) * dp({d.dp}) = {expected} "
                f"!= global_batch_size({self.global_batch_size})"
            )
        return self

    @property
    def pipeline_schedule(self) -> Literal["none", "1f1b", "interleaved_1f1b"]:
        if self.layout.pp == 1:
            return "none"
        return "interleaved_1f1b" if self.vpp > 1 else "1f1b"

    def describe(self) -> str:
        """`TP2·PP1·DP4 ZeRO-3 mbs2×8 AC=selective` — a one-line label for tables and logs."""
        return layout_label(self.layout, vpp=self.vpp, ep=self.ep,
                            zero_stage=self.zero_stage, micro_batch_size=self.micro_batch_size,
                            num_micro_batches=self.num_micro_batches,
                            recompute=self.activation_checkpointing, sequence_parallel=self.sequence_parallel)


def layout_label(degrees: RankLayout, *, vpp: int, ep: int, zero_stage: int,
                 micro_batch_size: int, num_micro_batches: int, recompute: str,
                 sequence_parallel: bool) -> str:
    """The one spelling of a layout people see, for plans and for the advisor's candidates."""
    parts = [f"TP{degrees.tp}", f"PP{degrees.pp}" + (f"(v{vpp})" if vpp > 1 else ""), f"DP{degrees.dp}"]
    if degrees.cp > 1:
        parts.append(f"CP{degrees.cp}")
    if ep > 1:
        parts.append(f"EP{ep}")
    label = "·".join(parts) + f" ZeRO-{zero_stage} mbs{micro_batch_size}×{num_micro_batches}"
    if recompute != "none":
        label += f" AC={recompute}"
    if sequence_parallel:
        label += " SP"
    return label
