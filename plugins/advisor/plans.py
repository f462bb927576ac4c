"""A `Plan` for a spec: the advisor's (`trainyard.plugins.advisor.plan_job`), or the spec's own degrees
when the advisor cannot plan it.

The advisor needs the model's shape (`parallelism.hints`). A `strategy: manual` spec without
hints — a debugging job, a script the platform knows nothing about — is run with its degrees
as written, data parallelism filling `gpuCount` (the advisor's one manual-plan builder,
`trainyard.plugins.advisor.planner.manual_plan`). An `auto` spec without hints is refused by the spec
rules before this point.
"""

from __future__ import annotations

from trainyard.config.cluster import Cluster
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.planner import PlanResult, manual_plan

__all__ = ["manual_plan", "plan_for_job"]


def plan_for_job(job: TrainingJob, cluster: Cluster, *, memory_fraction: float = 0.9,
                 allow_unfit: bool = False, advice: PlanResult | None = None) -> tuple[Plan, str]:
    """(plan, where it came from). Raises `ValueError` when the advisor finds that nothing fits
    (with its suggestions), unless `allow_unfit` and the spec's own manual configuration was
    evaluated — then that one is returned, for placement previews. `advice`: the advisor's
    answer for this job, cluster and fraction already asked for (an attempt's validation asked),
    so the search does not run again; without one the advisor is asked here."""
    if job.spec.parallelism.hints is None:
        if job.spec.parallelism.strategy == "auto" and job.runs_platform_worker:
            raise ValueError("strategy 'auto' needs parallelism.hints (the model's shape) to plan")
        return manual_plan(job), ("manual degrees (no model hints for the advisor)"
                                  if job.spec.parallelism.strategy == "manual" else
                                  "no model hints: every rank runs the script, data parallel as far as "
                                  "Trainyard knows (no advisor plan, no memory-fit check)")
    from trainyard.plugins.advisor import plan_job

    result = advice if advice is not None else plan_job(job, cluster, memory_fraction=memory_fraction)
    if result.best is not None:
        return result.best, f"advisor, strategy {result.strategy}"
    if allow_unfit and result.evaluated is not None:
        return result.evaluated, "the spec's manual configuration (the advisor says it does not fit memory)"
    hints = "; ".join(result.suggestions) or "no suggestion"
    raise ValueError(f"no plan fits {job.spec.hardware.gpu_count} × {job.spec.hardware.gpu_type} "
                     f"({result.hardware}): {hints}")
