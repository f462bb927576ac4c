"""INSUFFICIENT_GPU_MEMORY and MODEL_SIZE_MISMATCH: does the job fit in device memory, and is
the declared model size the one its shape describes? Answered by the advisor.

- `strategy: auto`: an error when no layout of gpuCount devices fits under `memory_fraction`
  of the device memory; the message names the least any layout needs and the budget, the hint
  what would fit (more devices, a bigger device, shorter sequences).
- `strategy: manual`: an error when the spec's own configuration does not fit; the message
  names its estimate and the budget, the hint single changes that would fit.
- A warning when `modelParameters` differs from the count computed from the shape by > 5 %.

Specs the advisor cannot plan (no hints, a GPU type the cluster lacks, an invalid manual
configuration) produce nothing here: `config/rules.py` already reports why.
"""

from __future__ import annotations

from config.cluster import Cluster
from config.problems import Code, Problem
from config.spec import TrainingJob

GiB = 1024**3


def check_memory(job: TrainingJob, cluster: Cluster, *, memory_fraction: float) -> list[Problem]:
    from plugins.advisor.planner import plan_job

    hints = job.spec.parallelism.hints
    if hints is None or job.spec.hardware.gpu_type not in cluster.gpu_types():
        return []
    try:
        result = plan_job(job, cluster, memory_fraction=memory_fraction, top_k=0)
    except ValueError:
        return []  # structural problems are the spec rules' to report
    problems = [Problem(code=Code.MODEL_SIZE_MISMATCH, path="spec.parallelism.hints.modelParameters",
                        message=line, severity="warning",
                        hint="check the shape hints (hiddenSize, numLayers, ffnHiddenSize, "
                             "numKeyValueHeads, vocabSize, activation) or the declared size")
                for line in result.warnings]
    if result.feasible:
        return problems
    budget = (f"the budget of {result.budget_bytes / GiB:.1f} GiB per device "
              f"({memory_fraction:.0%} of {result.device_memory_bytes / GiB:.0f} GiB "
              f"{job.spec.hardware.gpu_type})")
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
        code=Code.INSUFFICIENT_GPU_MEMORY, path="spec.hardware.gpuCount",
        message=f"no parallelism plan fits: {need}, over {budget}",
        hint=hint))
    return problems
