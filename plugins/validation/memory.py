"""INSUFFICIENT_GPU_MEMORY and MODEL_SIZE_MISMATCH: does the job fit in device memory, and is
the declared model size the one its shape describes? Answered by the advisor.

- `strategy: auto`: an error when no layout of gpuCount devices fits in the device (or in what
  `hardware.keepMemoryHeadroom` leaves of it); the message names the least any layout needs and
  that limit, the hint what would fit (more devices, a bigger device, shorter sequences).
- `strategy: manual`: an error when the spec's own configuration does not fit; the message
  names its estimate and the limit, the hint single changes that would fit.
- A warning (same code) when the plan fits only above the budget (`memory_fraction` of the
  device): it runs in the headroom, and the message gives both margins.
- A warning when `modelParameters` differs from the count computed from the shape by > 5 %.

Specs the advisor cannot plan (no hints, a GPU type the cluster lacks, an invalid manual
configuration) produce nothing here: `config/rules.py` already reports why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainyard.config.cluster import Cluster
from trainyard.config.problems import Code, Problem
from trainyard.config.spec import TrainingJob

if TYPE_CHECKING:
    from trainyard.plugins.advisor.planner import PlanResult

GiB = 1024**3


def advise(job: TrainingJob, cluster: Cluster, *, memory_fraction: float) -> PlanResult | None:
    """The advisor's answer for `job` on `cluster` — the search the memory check reads, and the
    one an attempt runs: the attempt engine asks here once, checks memory with it, plans with it
    and explains the plan in MLflow with it (the search used to run three times per attempt).
    None for a spec the advisor cannot plan (no hints, a GPU type the cluster lacks, a
    configuration it refuses): the spec rules report why."""
    from trainyard.plugins.advisor.planner import plan_job

    if job.spec.parallelism.hints is None or job.spec.hardware.gpu_type not in cluster.gpu_types():
        return None
    try:
        return plan_job(job, cluster, memory_fraction=memory_fraction)
    except ValueError:
        return None  # structural problems are the spec rules' to report


def check_memory(job: TrainingJob, cluster: Cluster, *, memory_fraction: float,
                 advice: PlanResult | None = None) -> list[Problem]:
    """The memory-fit problems of `job`. `advice`: the advisor's answer the caller already has
    (`advise`, same job, cluster and fraction); without one the advisor is asked here. How
    many alternatives the answer holds (`top_k`) changes nothing read here."""
    result = advice if advice is not None else advise(job, cluster, memory_fraction=memory_fraction)
    if result is None:
        return []
    problems = [Problem(code=Code.MODEL_SIZE_MISMATCH, path="spec.parallelism.hints.modelParameters",
                        message=line, severity="warning",
                        hint="check the shape hints (hiddenSize, numLayers, ffnHiddenSize, "
                             "numKeyValueHeads, vocabSize, activation) or the declared size")
                for line in result.warnings]
    path = "spec.parallelism" if result.strategy == "manual" else "spec.hardware.gpuCount"
    if result.feasible:
        if result.headroom_warning:
            problems.append(Problem(
                code=Code.INSUFFICIENT_GPU_MEMORY, path=path, severity="warning",
                message=result.headroom_warning,
                hint="it fits, with less room than the platform keeps for fragmentation and "
                     "communication buffers; set hardware.keepMemoryHeadroom (e.g. 0.1) to refuse "
                     "such plans, or use more devices or more recomputation for more room"))
        return problems
    budget = _limit_text(job, result.limit_bytes or result.device_memory_bytes,
                         result.device_memory_bytes)
    hint = "; ".join(result.suggestions) or "use more or larger devices, or shorter sequences"
    if result.strategy == "manual" and result.evaluated is not None:
        plan = result.evaluated
        need = plan.memory_per_gpu_bytes or 0
        top = sorted(plan.memory_breakdown.items(), key=lambda kv: -kv[1])[:3]
        items = ", ".join(f"{k} {v / GiB:.1f}" for k, v in top)
        problems.append(Problem(
            code=Code.INSUFFICIENT_GPU_MEMORY, path="spec.parallelism",
            message=(f"{plan.describe()} needs an estimated {need / GiB:.1f} GiB ({need:,} bytes) per "
                     f"device ({items} GiB), over {budget}"),
            hint=hint))
        return problems
    smallest = result.smallest_memory_bytes
    need = (f"the least any layout of {job.spec.hardware.gpu_count} devices needs is an estimated "
            f"{smallest / GiB:.1f} GiB ({smallest:,} bytes)" if smallest
            else f"no valid layout of {job.spec.hardware.gpu_count} devices exists")
    problems.append(Problem(
        code=Code.INSUFFICIENT_GPU_MEMORY, path=path,
        message=f"no parallelism plan fits: {need}, over {budget}",
        hint=hint))
    return problems


def _limit_text(job: TrainingJob, limit: int, capacity: int) -> str:
    """The limit a plan exceeded, in the user's terms: the device, or what the spec leaves."""
    gpu = job.spec.hardware.gpu_type
    keep = job.spec.hardware.keep_memory_headroom
    if keep is None:
        return f"the {capacity / GiB:.1f} GiB of one {gpu}"
    return (f"the {limit / GiB:.1f} GiB per device that keepMemoryHeadroom {keep:g} leaves of "
            f"{capacity / GiB:.0f} GiB {gpu}")
