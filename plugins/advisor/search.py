"""The search over layouts: every valid combination of TP, CP, PP, DP, EP, interleaving, ZeRO
stage, micro-batch size, recomputation and sequence parallelism; keep what fits, rank by step
time, break ties towards the simpler layout.

Validity: TP divides the query and KV heads, the FFN width and the vocabulary (the worker
splits the output head by columns) and fits in a node; PP is any degree up to the layer
count — when it does not divide the layers the first and last stages get the fewer
(`trainyard.config.pipeline`) and the time model runs the pipeline at its busiest rank's pace; DP =
GPUs / (TP·PP·CP) divides the global batch, micro-batch × micro-batches × DP = global batch;
a pipeline needs at least pp micro-batches, interleaving a multiple of pp and virtual stages
that divide a stage's layers (uneven splits: that leave the busiest rank no heavier than
without interleaving); CP is searched for sequences of 16k tokens or
more, in chunks of at least 4k (load-balanced causal ring attention needs s divisible by 2·cp).
Given a `runtime` (`plugins/advisor/runtime.py`; `plan_job` passes the worker's), degrees the
runtime cannot apply are skipped and counted as `unsupported_by_runtime`.

Pins: the spec's `Parallelism` itself (its `auto` strategy): a degree or knob it gives is the
only option searched for that dimension; the user's input is not copied into a type of our own.

Pruning without losing plans: for a given (tp, cp, pp, ep) the least-memory variant of a
micro-batch size (ZeRO-3, full recomputation, sequence parallel, no interleaving) is checked
first; if it does not fit, neither does any variant of that micro-batch size nor of any larger
one (in-flight activations min(p, m)·mbs only grow with mbs), so they are counted as rejected
for memory without being evaluated. `plans_considered` counts every combination,
`plans_evaluated` those whose memory (and, when they fit, time) was actually computed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from trainyard.config.pipeline import rank_layer_counts
from trainyard.config.spec import Parallelism
from trainyard.plugins.advisor.estimate import Estimate, Evaluator
from trainyard.plugins.advisor.hardware import Hardware
from trainyard.plugins.advisor.layout import PYTORCH, Implementation, Layout
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.advisor.runtime import RuntimeCapabilities

TIE_TOLERANCE = 0.01
"""Step times within 1 % are a tie; the simpler layout wins it."""
MAX_VIRTUAL_STAGES = 8
CP_DEGREES = (1, 2, 4, 8, 16, 32)
MIN_CP_SEQUENCE = 16384
"""Context parallelism is searched only for long sequences (as Llama 3 and torchtitan use it);
below this the model's CP costs (kernel efficiency of split attention) are not worth trusting.
A spec can still pin `contextParallel`."""
MIN_CP_CHUNK = 4096

REJECT_MEMORY = "exceeds_memory"
REJECT_BATCH = "batch_indivisible"
REJECT_FEW_MICRO = "micro_batches_below_pp"
REJECT_INTERLEAVE = "interleave_needs_micro_batches_multiple_of_pp"
REJECT_RUNTIME = "unsupported_by_runtime"


@dataclass
class SearchResult:
    ranked: list[Estimate]
    """Fitting layouts, best first (ties resolved towards the simpler one)."""
    rejected: dict[str, int]
    plans_considered: int
    plans_evaluated: int
    smallest: Estimate | None = None
    """The least-memory layout evaluated (for 'nothing fits' messages)."""
    budget_bytes: int = 0
    plans_fitting: int = 0
    limit_bytes: int = 0
    """What a plan could use (see `Evaluator`); 0 when unknown."""

    @property
    def best(self) -> Estimate | None:
        return self.ranked[0] if self.ranked else None


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _options(pinned: object, default: list) -> list:
    return [pinned] if pinned is not None else default


def _tp_options(model: ModelProfile, hw: Hardware, gpus: int, pins: Parallelism) -> list[int]:
    if pins.tensor_parallel is not None:
        return [pins.tensor_parallel]
    return [t for t in divisors(gpus) if t <= hw.gpus_per_node and model.num_heads % t == 0
            and model.num_kv_heads % t == 0 and model.ffn_hidden_size % t == 0
            and model.hidden_size % t == 0 and model.vocab_size % t == 0]


def _cp_options(model: ModelProfile, pins: Parallelism) -> list[int]:
    if pins.context_parallel is not None:
        return [pins.context_parallel]
    s = model.sequence_length
    if s < MIN_CP_SEQUENCE:
        return [1]
    return [c for c in CP_DEGREES if c == 1 or (s % (2 * c) == 0 and s // c >= MIN_CP_CHUNK)]


def _vpp_options(model: ModelProfile, pp: int, pins: Parallelism) -> list[int]:
    if pins.virtual_pipeline_stages is not None:
        return [pins.virtual_pipeline_stages]
    if pp == 1:
        return [1]
    layers = model.num_layers
    if layers % pp == 0:
        return [1] + [v for v in divisors(layers // pp) if 2 <= v <= MAX_VIRTUAL_STAGES]
    # Uneven: interleave only where it keeps the busiest rank as light as the plain split does.
    busiest = max(rank_layer_counts(layers, pp))
    return [1] + [v for v in range(2, MAX_VIRTUAL_STAGES + 1)
                  if pp * v <= layers and max(rank_layer_counts(layers, pp, v)) == busiest]


def _inner_variants(layout: Layout, vpps: list[int], pins: Parallelism,
                    impl: Implementation = PYTORCH) -> Iterator[Layout]:
    """Every (vpp, sp, recompute, zero) variant of a layout. ZeRO-2 is skipped where the
    implementation runs ZeRO-1 as ZeRO-2 (FSDP2): the two would be the same program."""
    sps = _options(pins.sequence_parallel, [False, True] if layout.degrees.tp > 1 else [False])
    recomputes = _options(pins.activation_checkpointing, ["none", "selective", "full"])
    stages = [0, 1, 3] if impl.zero1_as_zero2 else [0, 1, 2, 3]
    zeros = _options(pins.zero_stage, stages if layout.shard_group > 1 else [0])
    for vpp in vpps:
        for sp in sps:
            for ac in recomputes:
                for zero in zeros:
                    yield replace(layout, vpp=vpp, sequence_parallel=sp, recompute=ac,  # type: ignore[arg-type]
                                  zero_stage=zero)


def _least_memory(layout: Layout, pins: Parallelism) -> Layout:
    sp = pins.sequence_parallel if pins.sequence_parallel is not None else layout.degrees.tp > 1
    return replace(layout, vpp=pins.virtual_pipeline_stages or 1, sequence_parallel=sp,
                   recompute=pins.activation_checkpointing or "full",
                   zero_stage=pins.zero_stage if pins.zero_stage is not None else
                   (3 if layout.shard_group > 1 else 0))


def _structures(model: ModelProfile, hw: Hardware, gpus: int, pins: Parallelism,
                rejected: dict[str, int], runtime: RuntimeCapabilities | None = None,
                ) -> Iterator[tuple[RankLayout, int]]:
    """(degrees, ep) combinations that tile `gpus` and the global batch (and that `runtime`,
    when given, can apply)."""
    for tp in _tp_options(model, hw, gpus, pins):
        for cp in _cp_options(model, pins):
            pps = _options(pins.pipeline_parallel, [p for p in divisors(gpus) if p <= model.num_layers])
            for pp in pps:
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                if pins.data_parallel is not None and pins.data_parallel != dp:
                    continue
                if model.global_batch_size % dp:
                    rejected[REJECT_BATCH] = rejected.get(REJECT_BATCH, 0) + 1
                    continue
                eps = [e for e in divisors(model.num_experts or 1)
                       if (dp * cp) % e == 0] if model.is_moe else [1]
                degrees = RankLayout(tp=tp, pp=pp, dp=dp, cp=cp)
                for ep in eps:
                    if runtime is not None and not runtime.allows_degrees(
                            cp=cp, ep=ep, tp=tp, pp=pp, tie_embeddings=model.tie_embeddings):
                        rejected[REJECT_RUNTIME] = rejected.get(REJECT_RUNTIME, 0) + 1
                        continue
                    yield degrees, ep


def search(model: ModelProfile, hw: Hardware, gpu_count: int, *, pins: Parallelism | None = None,
           impl: Implementation = PYTORCH, memory_fraction: float = 0.9, top_k: int = 5,
           first_fit: bool = False, prune: bool = True,
           runtime: RuntimeCapabilities | None = None,
           keep_headroom: float | None = None) -> SearchResult:
    """Rank every valid layout of `model` on `gpu_count` devices of `hw` that fits (and that
    `runtime` can apply; None models any stack, as the published-number checks do).

    `first_fit` stops at the first layout that fits (used to answer 'would it fit with …?');
    `prune=False` evaluates every combination (the benchmark's baseline, same answer).
    A layout fits under the evaluator's `limit`; those within the `budget` rank first (`rank`).
    """
    pins = pins or Parallelism()
    evaluator = Evaluator(model, hw, impl=impl, memory_fraction=memory_fraction,
                          keep_headroom=keep_headroom)
    budget, limit = evaluator.budget, evaluator.limit
    rejected: dict[str, int] = {}
    fitting: list[Estimate] = []
    considered = evaluated = 0
    smallest: Estimate | None = None

    def reject(reason: str, n: int = 1) -> None:
        rejected[reason] = rejected.get(reason, 0) + n

    for degrees, ep in _structures(model, hw, gpu_count, pins, rejected, runtime):
        pp, local = degrees.pp, model.global_batch_size // degrees.dp
        mbss = _options(pins.micro_batch_size, divisors(local))
        vpps = _vpp_options(model, pp, pins)
        for i, mbs in enumerate(mbss):
            if local % mbs:
                reject(REJECT_BATCH)
                continue
            m = local // mbs
            base = Layout(degrees, ep=ep, micro_batch_size=mbs, num_micro_batches=m)
            variants = list(_inner_variants(base, vpps, pins, impl))
            considered += len(variants)
            if pp > 1 and m < pp:
                reject(REJECT_FEW_MICRO, len(variants))
                continue
            least = _least_memory(base, pins)
            least_bytes = evaluator.memory_bytes(least) if prune else 0.0
            if least_bytes > limit:
                evaluated += 1
                if smallest is None or least_bytes < smallest.memory_bytes:
                    smallest = evaluator.evaluate(least, always_time=False)
                reject(REJECT_MEMORY, len(variants))
                for bigger in mbss[i + 1:]:  # more micro-batch only needs more memory
                    n = len(list(_inner_variants(replace(base, micro_batch_size=bigger,
                                                         num_micro_batches=local // bigger),
                                                 vpps, pins, impl)))
                    considered += n
                    reject(REJECT_MEMORY if not (pp > 1 and local // bigger < pp) else REJECT_FEW_MICRO, n)
                break
            for layout in variants:
                if layout.vpp > 1 and m % pp:
                    reject(REJECT_INTERLEAVE)
                    continue
                evaluated += 1
                if evaluator.memory_bytes(layout) > limit:
                    reject(REJECT_MEMORY)
                    continue
                est = evaluator.evaluate(layout)
                if smallest is None or est.memory_bytes < smallest.memory_bytes:
                    smallest = est
                fitting.append(est)
                if first_fit:
                    return SearchResult(fitting, rejected, considered, evaluated, smallest, budget, 1,
                                        limit)
    return SearchResult(rank(fitting, top_k), rejected, considered, evaluated, smallest, budget,
                        len(fitting), limit)


def rank(estimates: list[Estimate], top_k: int) -> list[Estimate]:
    """Best first by step time; among those within `TIE_TOLERANCE` of the fastest, the simplest
    layout leads. Layouts within the budget come before those that need the headroom above it,
    however fast: the headroom is for a plan that has no other way to fit. Returns the best and
    up to `top_k` alternatives."""
    if not estimates:
        return []
    ordered = sorted(estimates, key=lambda e: (not e.within_budget, e.step_s, e.layout.complexity()))
    group = [e for e in ordered if e.within_budget == ordered[0].within_budget]
    fastest = group[0].step_s
    tied = [e for e in group if e.step_s <= fastest * (1 + TIE_TOLERANCE)]
    best = min(tied, key=lambda e: (e.layout.complexity(), e.step_s))
    rest = [e for e in ordered if e is not best]
    return [best, *rest[:top_k]]
