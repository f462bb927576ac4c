"""A `Plan` for a spec: the advisor's when it offers `plan_job`, else the spec's own degrees.

The placer needs only tp / pp / dp / cp. When the advisor (`plugins/advisor/`) exposes
`plan_job(job, cluster, …)` it is used; until then — or for `strategy: manual` specs — the
manual degrees are taken as written, with data parallelism filling `gpuCount` (the same rule
as `config/rules.py`'s `manual_degrees`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from config.cluster import Cluster
from config.spec import TrainingJob
from plugins.advisor.plan import Plan

ADVISOR_MODULES = ("plugins.advisor", "plugins.advisor.search", "plugins.advisor.planner",
                   "plugins.advisor.advise", "plugins.advisor.api")


def advisor_plan_job() -> Callable[..., Any] | None:
    """The advisor's `plan_job`, wherever in `plugins.advisor` it lives, or None."""
    for name in ADVISOR_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        finder = getattr(module, "plan_job", None)
        if callable(finder):
            return finder
    return None


def plan_for_job(job: TrainingJob, cluster: Cluster, **advisor_kwargs: Any) -> tuple[Plan, str]:
    """(plan, where it came from). Manual specs keep their degrees; auto specs ask the advisor."""
    finder = advisor_plan_job() if job.spec.parallelism.strategy == "auto" else None
    if finder is not None:
        result = finder(job, cluster, **advisor_kwargs)
        plan = getattr(result, "plan", result)
        if isinstance(plan, Plan):
            return plan, "advisor"
        raise TypeError(f"plan_job returned {type(result).__name__}, not a Plan (or an object with .plan)")
    source = "manual degrees" if job.spec.parallelism.strategy == "manual" else \
        "manual degrees (the advisor's plan_job is not available)"
    return manual_plan(job), source


def manual_plan(job: TrainingJob) -> Plan:
    """The spec's degrees as written; DP fills the rest of `gpuCount`."""
    par, gpus = job.spec.parallelism, job.spec.hardware.gpu_count
    tp, pp, cp = par.degree("tensor_parallel"), par.degree("pipeline_parallel"), par.degree("context_parallel")
    dp = par.data_parallel if par.data_parallel is not None else max(gpus // (tp * pp * cp), 1)
    mbs = par.micro_batch_size or 1
    hints = par.hints
    gbs: int | None = None
    micro_batches = 1
    if hints is not None and hints.global_batch_size % (mbs * dp) == 0:
        gbs = hints.global_batch_size
        micro_batches = gbs // (mbs * dp)
    plan = Plan(
        tp=tp, pp=pp, dp=dp, cp=cp, vpp=par.degree("virtual_pipeline_stages"),
        zero_stage=par.zero_stage or 0, micro_batch_size=mbs, num_micro_batches=micro_batches,
        activation_checkpointing=par.activation_checkpointing or "none",
        sequence_parallel=bool(par.sequence_parallel) and tp > 1,
        sequence_length=hints.sequence_length if hints else None, global_batch_size=gbs,
    )
    plan.check_world_size(gpus)
    return plan
