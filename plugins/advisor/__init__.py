"""The parallelism advisor: memory, FLOPs and communication models, a search over plans, and
explanations. Pure Python (no torch, no Airflow).

    from trainyard.plugins.advisor import plan_job
    result = plan_job(job, cluster, memory_fraction=0.9, top_k=5)
    result.best            # Plan to run (None when nothing fits)
    result.alternatives    # next best Plans
    result.rejected        # {"exceeds_memory": 1234, ...}
    result.suggestions     # what would fit, when nothing does
    result.to_json()       # the `trainyard plan --json` document
"""

from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.planner import (
    PlanResult,
    plan_auto,
    plan_job,
    plan_manual,
    replan_after_oom,
)

__all__ = ["Plan", "PlanResult", "plan_auto", "plan_job", "plan_manual", "replan_after_oom"]
