"""`plan_job`: the advisor's answer for one spec on one cluster — the `Plan` to run, the
alternatives, why the rest were rejected, and, when nothing fits, what would.

This is what the DAG's planning step, the launcher, `trainyard launch --local`, the dry run
(`plugins/validation/memory.py`) and `trainyard plan` call. With `strategy: auto` the search
ranks every valid layout (degrees the spec gives are pinned); with `strategy: manual` exactly
the spec's configuration is evaluated (missing degrees 1, data parallelism filling gpuCount,
ZeRO 0, micro-batch 1, no recomputation).

`plan_job` plans for the worker runtime (`runtime.WORKER_RUNTIME`): it never proposes a plan the
worker would refuse, and raises `ValueError` for a spec that pins one. `plan_auto` and
`plan_manual` model any stack unless given a `runtime`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainyard.plugins.advisor.estimate import Estimate, Evaluator, check_layout
from trainyard.plugins.advisor.hardware import CATALOG, GiB, Hardware, hardware_for
from trainyard.plugins.advisor.layout import PYTORCH, Implementation, Layout
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.nccl import nccl_env
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.advisor.runtime import WORKER_RUNTIME, RuntimeCapabilities
from trainyard.plugins.advisor.search import SearchResult, search

if TYPE_CHECKING:
    from trainyard.config.cluster import Cluster
    from trainyard.config.spec import Parallelism, TrainingJob

PLAN_JSON_KEYS = ("tp", "pp", "dp", "cp", "vpp", "zero_stage", "micro_batch_size",
                  "num_micro_batches", "activation_checkpointing", "sequence_parallel",
                  "memory_per_gpu_bytes", "memory_breakdown", "step_time_s", "tokens_per_s", "mfu",
                  "bubble_fraction")
"""The plan fields `trainyard plan --json` prints (the issue's contract): flat, the degrees
read from the plan's `layout`, so scripts that read `plan.tp` keep working."""


class PlanResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    feasible: bool
    strategy: Literal["auto", "manual"]
    best: Plan | None
    """The plan to run; None when nothing fits."""
    alternatives: list[Plan] = Field(default_factory=list)
    """The next best plans that fit, best first."""
    evaluated: Plan | None = None
    """Manual strategy: the spec's own configuration with its estimates, whether it fits or not."""
    rejected: dict[str, int] = Field(default_factory=dict)
    suggestions: list[str] = Field(default_factory=list)
    """When nothing fits: what would (more devices, a bigger device, shorter sequences)."""
    warnings: list[str] = Field(default_factory=list)
    plans_considered: int = 0
    plans_evaluated: int = 0
    budget_bytes: int
    """The platform's budget (memory_fraction of the device): a plan above it uses the headroom."""
    device_memory_bytes: int
    limit_bytes: int = 0
    """What a plan may use: the device's capacity, less the headroom the spec keeps
    (`hardware.keepMemoryHeadroom`); 0 in results written before there was one."""
    headroom_warning: str | None = None
    """Set when the plan fits only in the headroom above the budget: by how much, and the
    margin left to the device's capacity."""
    hardware: str
    parameter_count: int
    smallest_memory_bytes: int | None = None
    """The least memory any layout needed (what 'nothing fits' is measured against)."""

    def to_json(self) -> dict[str, Any]:
        """`{"feasible", "plan", "alternatives", "rejected"}` with the issue's plan fields.
        `plan` is the best plan, or (manual strategy) the evaluated configuration even when it
        does not fit, or null."""
        shown = self.best or self.evaluated
        return {
            "feasible": self.feasible,
            "plan": plan_json(shown) if shown is not None else None,
            "alternatives": [plan_json(p) for p in self.alternatives],
            "rejected": dict(self.rejected),
        }


def plan_json(plan: Plan) -> dict[str, Any]:
    data = plan.model_dump(mode="json")
    data.update(data.pop("layout"))
    return {key: data[key] for key in PLAN_JSON_KEYS}


def to_plan(est: Estimate, model: ModelProfile, hw: Hardware) -> Plan:
    layout, time = est.layout, est.time
    return Plan(
        layout=layout.degrees, vpp=layout.vpp, ep=layout.ep,
        zero_stage=layout.zero_stage,  # type: ignore[arg-type]
        micro_batch_size=layout.micro_batch_size, num_micro_batches=layout.num_micro_batches,
        activation_checkpointing=layout.recompute, sequence_parallel=layout.sequence_parallel,
        sequence_length=model.sequence_length, global_batch_size=model.global_batch_size,
        memory_per_gpu_bytes=est.memory_bytes, memory_breakdown=dict(est.memory),
        step_time_s=time.step_s if time else None, tokens_per_s=est.tokens_per_s if time else None,
        mfu=est.mfu if time else None, hfu=est.hfu if time else None,
        bubble_fraction=time.bubble_fraction if time else None,
        communication_s={k: round(v, 6) for k, v in time.communication_s.items()} if time else {},
        nccl_env=nccl_env(layout, hw),
    )


def manual_layout(par: Parallelism, gpu_count: int, model: ModelProfile | None = None) -> Layout:
    """The spec's own configuration — the one manual-plan builder: missing degrees 1, DP
    filling gpuCount (`Parallelism.manual_degrees`), ZeRO 0, micro-batch 1, no recomputation.
    With the model's shape the global batch and the split are checked too; without it (a spec
    with no hints) one micro-batch per step. Raises `ValueError` naming the values when invalid."""
    tp, pp, dp, cp = par.manual_degrees(gpu_count)
    if gpu_count % (tp * pp * cp) and par.data_parallel is None:
        raise ValueError(f"gpuCount {gpu_count} is not divisible by TP({tp}) * PP({pp}) * CP({cp})")
    degrees = RankLayout(tp=tp, pp=pp, dp=dp, cp=cp)  # the spec's degrees become a RankLayout here
    if degrees.world_size != gpu_count:
        raise ValueError(f"TP({tp}) * PP({pp}) * DP({dp}) * CP({cp}) = {degrees.world_size} "
                         f"!= gpuCount({gpu_count})")
    if par.sequence_parallel and tp == 1:
        raise ValueError("sequenceParallel needs tensorParallel > 1 (it splits the norms' and "
                         "dropout's activations over the TP group)")
    mbs = par.micro_batch_size or 1
    micro = 1
    if model is not None:
        if model.global_batch_size % (mbs * dp):
            raise ValueError(f"globalBatchSize {model.global_batch_size} is not divisible by "
                             f"microBatchSize({mbs}) * dataParallel({dp}) = {mbs * dp}")
        micro = model.global_batch_size // (mbs * dp)
    layout = Layout(degrees, vpp=par.degree("virtual_pipeline_stages"),
                    zero_stage=par.zero_stage or 0, micro_batch_size=mbs, num_micro_batches=micro,
                    recompute=par.activation_checkpointing or "none",
                    sequence_parallel=bool(par.sequence_parallel))
    if model is not None:
        check_layout(model, layout, gpu_count)
    return layout


def manual_plan(job: TrainingJob) -> Plan:
    """The plan of a `strategy: manual` spec the advisor cannot estimate (no model hints): its
    degrees as written, DP filling gpuCount, no estimates."""
    layout = manual_layout(job.spec.parallelism, job.spec.hardware.gpu_count)
    return Plan(layout=layout.degrees, vpp=layout.vpp,
                zero_stage=layout.zero_stage,  # type: ignore[arg-type]
                micro_batch_size=layout.micro_batch_size, activation_checkpointing=layout.recompute,
                sequence_parallel=layout.sequence_parallel)


def plan_job(job: TrainingJob, cluster: Cluster, *, memory_fraction: float = 0.9, top_k: int = 5,
             impl: Implementation = PYTORCH,
             runtime: RuntimeCapabilities | None = WORKER_RUNTIME,
             keep_headroom: float | None = None) -> PlanResult:
    """Plan `job` on `cluster` for `runtime`. Raises `ValueError` when the spec cannot be
    planned at all (no model hints, a GPU type the cluster lacks, an invalid manual
    configuration, something the runtime cannot apply). A plan may use the device up to its
    capacity, or up to the headroom the spec keeps (`keep_headroom` overrides the spec's);
    one above `memory_fraction` of it comes with `headroom_warning`."""
    par = job.spec.parallelism
    if par.hints is None:
        raise ValueError("the spec has no parallelism.hints: the advisor needs the model's shape "
                         "(hiddenSize, numLayers, numAttentionHeads, sequenceLength, globalBatchSize)")
    model = ModelProfile.from_hints(par.hints)
    hw = hardware_for(cluster, job.spec.hardware.gpu_type)
    gpus = job.spec.hardware.gpu_count
    if runtime is not None:
        refused = runtime.refusals(
            cp=par.degree("context_parallel"), tp=par.degree("tensor_parallel"),
            pp=par.degree("pipeline_parallel"), precision=model.precision, moe=model.is_moe,
            tie_embeddings=model.tie_embeddings)
        if refused:
            raise ValueError("; ".join(refused))
    keep = job.spec.hardware.keep_memory_headroom if keep_headroom is None else keep_headroom
    if par.strategy == "manual":
        return plan_manual(model, hw, manual_layout(par, gpus, model), memory_fraction=memory_fraction,
                           top_k=top_k, impl=impl, runtime=runtime, keep_headroom=keep)
    return plan_auto(model, hw, gpus, pins=par, memory_fraction=memory_fraction,
                     top_k=top_k, impl=impl, runtime=runtime, keep_headroom=keep)


def _warnings(model: ModelProfile) -> list[str]:
    diff = model.parameter_mismatch()
    if diff is None:
        return []
    return [f"modelParameters is {model.declared_parameters:,} but the architecture has "
            f"{model.parameter_count():,} parameters ({diff:+.1%})"]


def _result(model: ModelProfile, hw: Hardware, found: SearchResult, *, strategy: str,
            best: Plan | None, alternatives: list[Plan], evaluated: Plan | None = None,
            suggestions: list[str] | None = None) -> PlanResult:
    return PlanResult(
        feasible=best is not None, strategy=strategy,  # type: ignore[arg-type]
        best=best, alternatives=alternatives, evaluated=evaluated, rejected=found.rejected,
        suggestions=suggestions or [], warnings=_warnings(model),
        plans_considered=found.plans_considered, plans_evaluated=found.plans_evaluated,
        budget_bytes=found.budget_bytes, device_memory_bytes=hw.memory_bytes,
        limit_bytes=found.limit_bytes or hw.memory_bytes,
        headroom_warning=_headroom_warning(best, found.budget_bytes, hw),
        hardware=hw.describe(), parameter_count=model.parameter_count(),
        smallest_memory_bytes=found.smallest.memory_bytes if found.smallest else None)


def _headroom_warning(plan: Plan | None, budget: int, hw: Hardware) -> str | None:
    """What a plan that fits only in the headroom costs: over the budget by, under capacity by."""
    need = plan.memory_per_gpu_bytes if plan is not None else None
    if plan is None or need is None or need <= budget:
        return None
    return (f"{plan.describe()} needs an estimated {need / GiB:.1f} GiB per device, "
            f"{(need - budget) / GiB:.1f} GiB over the budget of {budget / GiB:.1f} GiB "
            f"({budget / hw.memory_bytes:.0%} of {hw.memory_bytes / GiB:.0f} GiB {hw.gpu.name}); "
            f"it runs in the headroom with {(hw.memory_bytes - need) / GiB:.1f} GiB to spare "
            f"({(hw.memory_bytes - need) / hw.memory_bytes:.1%} of the device)")


def plan_auto(model: ModelProfile, hw: Hardware, gpu_count: int, *, pins: Parallelism | None = None,
              memory_fraction: float = 0.9, top_k: int = 5, impl: Implementation = PYTORCH,
              runtime: RuntimeCapabilities | None = None,
              keep_headroom: float | None = None) -> PlanResult:
    found = search(model, hw, gpu_count, pins=pins, impl=impl, memory_fraction=memory_fraction,
                   top_k=top_k, runtime=runtime, keep_headroom=keep_headroom)
    plans = [to_plan(est, model, hw) for est in found.ranked]
    suggestions = [] if plans else what_would_fit(model, hw, gpu_count, found, pins=pins, impl=impl,
                                                  memory_fraction=memory_fraction, runtime=runtime,
                                                  keep_headroom=keep_headroom)
    return _result(model, hw, found, strategy="auto", best=plans[0] if plans else None,
                   alternatives=plans[1:], suggestions=suggestions)


def plan_manual(model: ModelProfile, hw: Hardware, layout: Layout, *, memory_fraction: float = 0.9,
                top_k: int = 5, impl: Implementation = PYTORCH,
                runtime: RuntimeCapabilities | None = None,
                keep_headroom: float | None = None) -> PlanResult:
    evaluator = Evaluator(model, hw, impl=impl, memory_fraction=memory_fraction,
                          keep_headroom=keep_headroom)
    est = evaluator.evaluate(layout)
    plan = to_plan(est, model, hw)
    found = SearchResult(ranked=[est] if est.fits else [],
                         rejected={} if est.fits else {"exceeds_memory": 1}, plans_considered=1,
                         plans_evaluated=1, smallest=est, budget_bytes=evaluator.budget,
                         limit_bytes=evaluator.limit)
    if est.fits:
        return _result(model, hw, found, strategy="manual", best=plan, alternatives=[], evaluated=plan)
    suggestions = manual_fixes(evaluator, layout)
    gpus = layout.degrees.world_size
    auto = search(model, hw, gpus, impl=impl, memory_fraction=memory_fraction, top_k=top_k,
                  runtime=runtime, keep_headroom=keep_headroom)
    if auto.best is not None:
        suggestions.append(f"strategy: auto finds {auto.best.layout.describe()} "
                           f"({auto.best.memory_bytes / GiB:.1f} GiB)")
    else:
        suggestions += what_would_fit(model, hw, gpus, auto, impl=impl,
                                      memory_fraction=memory_fraction, runtime=runtime,
                                      keep_headroom=keep_headroom)
    return _result(model, hw, found, strategy="manual", best=None,
                   alternatives=[to_plan(e, model, hw) for e in auto.ranked[:top_k]],
                   evaluated=plan, suggestions=suggestions)


SPEC_KEYS = {"recompute": "activationCheckpointing", "zero_stage": "zeroStage",
             "micro_batch_size": "microBatchSize", "sequence_parallel": "sequenceParallel"}


def manual_fixes(evaluator: Evaluator, layout: Layout) -> list[str]:
    """Changes to a manual configuration that make it fit: single changes first, pairs when no
    single change is enough (at most three suggestions)."""
    local = layout.micro_batch_size * layout.num_micro_batches
    changes: list[dict[str, Any]] = [{"recompute": "selective"}, {"recompute": "full"}]
    if layout.shard_group > 1:
        changes += [{"zero_stage": z} for z in (1, 2, 3) if z > layout.zero_stage]
    if layout.degrees.tp > 1 and not layout.sequence_parallel:
        changes.append({"sequence_parallel": True})
    if layout.micro_batch_size > 1:
        changes.append({"micro_batch_size": 1, "num_micro_batches": local})
    changes = [c for c in changes if any(getattr(layout, k) != v for k, v in c.items())]
    pairs = [a | b for i, a in enumerate(changes) for b in changes[i + 1:] if not set(a) & set(b)]
    for group in (changes, pairs):
        out = []
        for change in group:
            bytes_ = evaluator.memory_bytes(replace(layout, **change))
            if bytes_ <= evaluator.limit:
                said = ", ".join(f"{SPEC_KEYS[k]}: {str(v).lower() if isinstance(v, bool) else v}"
                                 for k, v in change.items() if k in SPEC_KEYS)
                out.append(f"{said} would fit ({bytes_ / GiB:.1f} GiB)")
        if out:
            return out[:3]
    return []


def what_would_fit(model: ModelProfile, hw: Hardware, gpu_count: int, found: SearchResult, *,
                   pins: Parallelism | None = None, impl: Implementation = PYTORCH,
                   memory_fraction: float = 0.9,
                   runtime: RuntimeCapabilities | None = None,
                   keep_headroom: float | None = None) -> list[str]:
    """More devices, a bigger device or shorter sequences: the first of each that fits."""
    out: list[str] = []
    if found.plans_evaluated == 0:
        out.append(f"no layout of {gpu_count} devices divides globalBatchSize "
                   f"{model.global_batch_size} and the model's heads/layers; change gpuCount or "
                   "globalBatchSize")
        return out

    def fits(m: ModelProfile, h: Hardware, n: int) -> bool:
        return search(m, h, n, pins=pins, impl=impl, memory_fraction=memory_fraction,
                      first_fit=True, runtime=runtime, keep_headroom=keep_headroom).best is not None

    for factor in (2, 4, 8, 16, 32, 64):
        n = gpu_count * factor
        if hw.total_gpus is not None and n > hw.total_gpus:
            out.append(f"more devices: {n} would be needed to try the next size, the cluster has "
                       f"{hw.total_gpus} {hw.gpu.name}")
            break
        if fits(model, hw, n):
            out.append(f"more devices: {n} {hw.gpu.name} would fit")
            break
    bigger = sorted((g for g in CATALOG.values() if not g.is_cpu and g.memory_bytes > hw.memory_bytes),
                    key=lambda g: g.memory_bytes)
    for gpu in bigger:
        if fits(model, hw.with_gpu(gpu), gpu_count):
            out.append(f"a bigger device: {gpu_count} {gpu.name} ({gpu.memory_bytes / GiB:.0f} GiB) "
                       "would fit")
            break
    s = model.sequence_length // 2
    while s >= 128:
        if fits(replace(model, sequence_length=s), hw, gpu_count):
            out.append(f"shorter sequences: sequenceLength {s} would fit on {gpu_count} devices")
            break
        s //= 2
    if not out:
        out.append("nothing simple fits: the model needs more devices than the cluster has")
    return out


def replan_after_oom(job: TrainingJob, cluster: Cluster, failed: Plan, *,
                     memory_fraction: float = 0.9, top_k: int = 5) -> PlanResult:
    """Plan again after `failed` ran out of device memory: the estimate that OOMed was too low,
    so demand 10 % less than it (smaller micro-batches, more recomputation, more sharding) —
    a hard limit, not a budget the headroom may exceed."""
    hw = hardware_for(cluster, job.spec.hardware.gpu_type)
    if not failed.memory_per_gpu_bytes:
        raise ValueError("the failed plan carries no memory estimate to re-plan against")
    fraction = min(memory_fraction, 0.9 * failed.memory_per_gpu_bytes / hw.memory_bytes)
    return plan_job(job, cluster, memory_fraction=fraction, top_k=top_k, keep_headroom=1 - fraction)
