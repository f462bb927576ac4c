"""`evaluate`: memory and time of one layout on one kind of hardware — the advisor's unit of
work, used by the search, the manual strategy, the dry run and the published-runs table."""

from __future__ import annotations

from dataclasses import dataclass

from trainyard.plugins.advisor.hardware import Hardware
from trainyard.plugins.advisor.layout import PYTORCH, Implementation, Layout
from trainyard.plugins.advisor.memory import MemoryModel
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.timing import StepTime, TimeModel, peak_flops


@dataclass(frozen=True, slots=True)
class Estimate:
    layout: Layout
    memory: dict[str, int]
    """Bytes by item on the device that needs the most."""
    memory_stage: int
    """The pipeline stage of that device."""
    budget_bytes: int
    """The platform's budget (memory_fraction × capacity): above it a plan uses the headroom."""
    limit_bytes: int
    """What a plan may use: the device's capacity, less the headroom the spec keeps, if any."""
    time: StepTime | None
    """None when the layout does not fit (time is not estimated for it)."""
    tokens_per_s: float = 0.0
    mfu: float = 0.0
    hfu: float = 0.0

    @property
    def memory_bytes(self) -> int:
        return sum(self.memory.values())

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.limit_bytes

    @property
    def within_budget(self) -> bool:
        """Fits without touching the headroom above the budget."""
        return self.memory_bytes <= self.budget_bytes

    @property
    def step_s(self) -> float:
        return self.time.step_s if self.time is not None else float("inf")


def budget_bytes(hw: Hardware, memory_fraction: float) -> int:
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    return int(hw.memory_bytes * memory_fraction)


def limit_bytes(hw: Hardware, keep_headroom: float | None) -> int:
    """The most a plan may use: all of the device, or all but the share `keep_headroom` asks
    to keep free (the spec's `hardware.keepMemoryHeadroom`)."""
    if keep_headroom is None:
        return hw.memory_bytes
    if not 0 <= keep_headroom < 1:
        raise ValueError(f"keep_headroom must be in [0, 1), got {keep_headroom}")
    return int(hw.memory_bytes * (1 - keep_headroom))


def check_layout(model: ModelProfile, layout: Layout, gpu_count: int | None = None) -> None:
    """Raise `ValueError`, naming the values, when the layout cannot split this model."""
    d = layout.degrees
    if gpu_count is not None and d.world_size != gpu_count:
        raise ValueError(f"tp({d.tp}) * pp({d.pp}) * dp({d.dp}) * cp({d.cp}) "
                         f"= {d.world_size} != gpuCount({gpu_count})")
    if layout.global_batch_size != model.global_batch_size:
        raise ValueError(f"micro_batch_size({layout.micro_batch_size}) * num_micro_batches("
                         f"{layout.num_micro_batches}) * dp({layout.degrees.dp}) = {layout.global_batch_size}"
                         f" != global batch size ({model.global_batch_size})")
    if layout.degrees.pp > model.num_layers:
        raise ValueError(f"pp({layout.degrees.pp}) exceeds num_layers({model.num_layers})")
    for heads, name in ((model.num_heads, "num_heads"), (model.num_kv_heads, "num_kv_heads")):
        if heads % layout.degrees.tp:
            raise ValueError(f"tp({layout.degrees.tp}) does not divide {name}({heads})")
    if layout.sequence_parallel and layout.degrees.tp == 1:
        raise ValueError("sequence parallelism needs tp > 1")
    if layout.vpp > 1 and layout.degrees.pp == 1:
        raise ValueError(f"vpp({layout.vpp}) needs pipeline parallelism; pp is 1")
    if layout.ep > 1 and (not model.is_moe or (model.num_experts or 1) % layout.ep
                          or layout.shard_group % layout.ep):
        raise ValueError(f"ep({layout.ep}) must divide num_experts({model.num_experts}) and dp*cp"
                         f"({layout.shard_group})")


class Evaluator:
    """Evaluates layouts of one model on one device type under one memory budget, sharing the
    memory and time models' caches across calls (what the search uses).

    Two thresholds: `budget` (memory_fraction of the device) is where a plan starts to use the
    headroom — it still fits, with a warning; `limit` is what a plan may not exceed: the
    device's capacity, or less when the spec keeps headroom (`keep_headroom`). A configuration
    that really ran can sit in the headroom (Llama 3 405B: an estimated 73.4 GiB on 80 GiB
    H100s, over a 72 GiB budget), so the budget alone never refuses one."""

    def __init__(self, model: ModelProfile, hw: Hardware, *, impl: Implementation = PYTORCH,
                 memory_fraction: float = 0.9, keep_headroom: float | None = None) -> None:
        self.model, self.hw, self.impl = model, hw, impl
        self.budget = budget_bytes(hw, memory_fraction)
        self.limit = limit_bytes(hw, keep_headroom)
        self.memory = MemoryModel(model, hw, impl)
        self.time = TimeModel(model, hw, impl, self.memory)
        self.peak = peak_flops(model, hw)
        self.flops_per_token = model.model_flops_per_token()
        self.attention_recomputed = (not impl.flash_attention
                                     or impl.selective_policy == "core_attention")

    def memory_bytes(self, layout: Layout) -> float:
        return self.memory.total(layout)

    def evaluate(self, layout: Layout, *, always_time: bool = True) -> Estimate:
        memory, stage = self.memory.breakdown(layout)
        if sum(memory.values()) > self.limit and not always_time:
            return Estimate(layout, memory, stage, self.budget, self.limit, None)
        time = self.time.step(layout)
        tokens = self.model.global_batch_size * self.model.sequence_length / time.step_s
        peak = self.peak * layout.degrees.world_size
        extra = self.model.recompute_flops_per_token(
            layout.recompute, attention_recomputed=self.attention_recomputed)
        return Estimate(layout, memory, stage, self.budget, self.limit, time, tokens_per_s=tokens,
                        mfu=tokens * self.flops_per_token / peak,
                        hfu=tokens * (self.flops_per_token + extra) / peak)


def evaluate(model: ModelProfile, hw: Hardware, layout: Layout, *, impl: Implementation = PYTORCH,
             memory_fraction: float = 0.9, keep_headroom: float | None = None,
             always_time: bool = True) -> Estimate:
    """Memory of `layout`, and its step time, throughput and MFU (unless it does not fit and
    `always_time` is False)."""
    return Evaluator(model, hw, impl=impl, memory_fraction=memory_fraction,
                     keep_headroom=keep_headroom).evaluate(layout, always_time=always_time)
