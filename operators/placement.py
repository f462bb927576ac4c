"""`plan_parallelism`, `place_gang` (setup) and `release_gang` (teardown).

The reservation is the gang's setup/teardown pair: `release_gang` runs whatever happened in
between (Airflow's teardown semantics), before the next attempt is handed over, so the next
attempt can place on the freed devices. Both are idempotent per (job, run, attempt): a retried
`place_gang` returns the live reservation, a second release frees nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from trainyard.operators.common import opened_of, pull, pull_optional, runtime, to_xcom

if TYPE_CHECKING:
    from airflow.sdk import Context

    from trainyard.plugins.attempt.steps import Planned

PLAN = "plan_parallelism"
PLACE = "place_gang"
ADVICE = "advice"
"""The XCom key of the advisor's answer behind the plan: the launch explains the plan with it in
MLflow instead of searching again."""


def planned_of(context: Context) -> Planned:
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.advisor.planner import PlanResult
    from trainyard.plugins.attempt.steps import Planned

    source = context["ti"].xcom_pull(task_ids=PLAN, key="source") or "advisor"
    return Planned(plan=pull(context, PLAN, Plan), source=source,
                   advice=pull_optional(context, PLAN, PlanResult, key=ADVICE))


class PlanParallelismOperator(BaseOperator):
    """The attempt's plan — the advisor's, the spec's manual one, or a re-plan handed over."""

    ui_color = "#fdf6e3"

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.attempt.steps import plan

        planned = plan(opened_of(context), runtime())
        p = planned.plan
        memory = f"{p.memory_per_gpu_bytes / 2**30:.2f} GiB per device" if p.memory_per_gpu_bytes else "no estimate"
        self.log.info("plan (%s): %s; %s; %s tokens/s estimated", planned.source, p.describe(), memory,
                      f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "no")
        for part, size in sorted(p.memory_breakdown.items(), key=lambda kv: -kv[1]):
            self.log.info("  memory %-28s %10.1f MiB", part, size / 2**20)
        context["ti"].xcom_push(key="source", value=planned.source)
        if planned.advice is not None:
            context["ti"].xcom_push(key=ADVICE, value=to_xcom(planned.advice))
        return to_xcom(p)


class PlaceGangOperator(BaseOperator):
    """Place the gang (topology-aware, excluding lost and cordoned nodes) and reserve its devices;
    when it does not fit, evict lower-priority gangs after their emergency checkpoint — except on
    a Kueue cluster, where Kueue alone preempts (`plugins/attempt/preempt.py`)."""

    ui_color = "#eee8d5"

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.attempt.steps import place

        opened = opened_of(context)
        placed = place(opened, planned_of(context), runtime())
        for line in placed.evicted:
            self.log.warning("preempted %s", line)
        if placed.waited_s >= 1:
            self.log.info("waited %.0f s for capacity (requeued after preemption)", placed.waited_s)
        if placed.queued:
            self.log.info("the nodes are reserved by other gangs: handed to the cluster's queue (Kueue) unreserved, "
                          "which admits it within its team's quota, or preempts for it")
        self.log.info("placed run %s attempt %d on %s (%s); excluded: %s", opened.conf.run, opened.conf.attempt,
                      ", ".join(f"{n.name}×{n.slots}" for n in placed.placement.nodes), placed.placement.strategy,
                      ", ".join(placed.excluded) or "none")
        return to_xcom(placed.placement)


class ReleaseGangOperator(BaseOperator):
    """Free the attempt's devices (teardown: runs after success, failure or skip)."""

    ui_color = "#eee8d5"

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.attempt.steps import release

        opened = opened_of(context)
        freed = release(opened, runtime())
        self.log.info("released %d device(s) of run %s attempt %d", freed, opened.conf.run, opened.conf.attempt)
        return {"freed": freed}
