"""A `Plan` for a spec: the advisor's (`plugins.advisor.plan_job`), or the spec's own degrees
when the advisor cannot plan it.

The advisor needs the model's shape (`parallelism.hints`). A `strategy: manual` spec without
hints — a debugging job, a script the platform knows nothing about — is run with its degrees
as written, data parallelism filling `gpuCount` (the rule of `config/rules.py`'s
`manual_degrees`). An `auto` spec without hints is refused by the spec rules before this point.
"""

from __future__ import annotations

from config.cluster import Cluster
from config.spec import TrainingJob
from plugins.advisor.plan import Plan


def plan_for_job(job: TrainingJob, cluster: Cluster, *, memory_fraction: float = 0.9,
                 allow_unfit: bool = False) -> tuple[Plan, str]:
    """(plan, where it came from). Raises `ValueError` when the advisor finds that nothing fits
    (with its suggestions), unless `allow_unfit` and the spec's own manual configuration was
    evaluated — then that one is returned, for placement previews."""
    if job.spec.parallelism.hints is None:
        if job.spec.parallelism.strategy == "auto":
            raise ValueError("strategy 'auto' needs parallelism.hints (the model's shape) to plan")
        return manual_plan(job), "manual degrees (no model hints for the advisor)"
    from plugins.advisor import plan_job

    result = plan_job(job, cluster, memory_fraction=memory_fraction)
    if result.best is not None:
        return result.best, f"advisor, strategy {result.strategy}"
    if allow_unfit and result.evaluated is not None:
        return result.evaluated, "the spec's manual configuration (the advisor says it does not fit memory)"
    hints = "; ".join(result.suggestions) or "no suggestion"
    raise ValueError(f"no plan fits {job.spec.hardware.gpu_count} × {job.spec.hardware.gpu_type} "
                     f"({result.hardware}): {hints}")


def manual_plan(job: TrainingJob) -> Plan:
    """The spec's degrees as written; DP fills the rest of `gpuCount`."""
    par, gpus = job.spec.parallelism, job.spec.hardware.gpu_count
    tp, pp, cp = par.degree("tensor_parallel"), par.degree("pipeline_parallel"), par.degree("context_parallel")
    dp = par.data_parallel if par.data_parallel is not None else max(gpus // (tp * pp * cp), 1)
    mbs = par.micro_batch_size or 1
    plan = Plan(
        tp=tp, pp=pp, dp=dp, cp=cp, vpp=par.degree("virtual_pipeline_stages"),
        zero_stage=par.zero_stage or 0, micro_batch_size=mbs,
        activation_checkpointing=par.activation_checkpointing or "none",
        sequence_parallel=bool(par.sequence_parallel) and tp > 1,
    )
    plan.check_world_size(gpus)
    return plan
