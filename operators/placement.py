"""`plan_parallelism`, `place_gang` (setup) and `release_gang` (teardown).

The reservation is the gang's setup/teardown pair: `release_gang` runs whatever happened in
between (Airflow's teardown semantics), before the next attempt is handed over, so the next
attempt can place on the freed devices. Both are idempotent per (job, run, attempt): a retried
`place_gang` returns the live reservation, a second release frees nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from operators.common import attempt_of, pull, settings, to_xcom

if TYPE_CHECKING:
    from airflow.sdk import Context

PLAN = "plan_parallelism"
PLACE = "place_gang"
LEASE_S = 900.0
"""The reservation's lease; the training watcher renews it while the gang runs, so a control
plane that is down for longer than this frees the devices rather than leaking them."""


REQUEUE_WAIT_S = 3600.0
"""A requeued attempt (after preemption) waits this long for capacity in `place_gang` — holding a
worker slot while it polls; a deferrable wait would free it (not built yet)."""


class PlanParallelismOperator(BaseOperator):
    """The attempt's plan — the advisor's, the spec's manual one, or a re-plan handed over."""

    ui_color = "#fdf6e3"

    def execute(self, context: Context) -> dict[str, Any]:
        from config.cluster import cluster_for
        from plugins.recovery.steps import plan_attempt

        job, conf = attempt_of(context)
        config = settings()
        cluster = cluster_for(job.spec.hardware.gpu_type, config.cluster)
        plan, source = plan_attempt(job, cluster, conf, memory_fraction=config.memory_fraction)
        memory = f"{plan.memory_per_gpu_bytes / 2**30:.2f} GiB per device" if plan.memory_per_gpu_bytes else "no estimate"
        self.log.info("plan (%s): %s; %s; %s tokens/s estimated", source, plan.describe(), memory,
                      f"{plan.tokens_per_s:,.0f}" if plan.tokens_per_s else "no")
        for part, size in sorted(plan.memory_breakdown.items(), key=lambda kv: -kv[1]):
            self.log.info("  memory %-28s %10.1f MiB", part, size / 2**20)
        return to_xcom(plan)


class PlaceGangOperator(BaseOperator):
    """Place the gang (topology-aware, excluding lost nodes) and reserve its devices; when it does
    not fit, evict lower-priority gangs after their emergency checkpoint (`plugins/recovery/preempt.py`)."""

    ui_color = "#eee8d5"

    def execute(self, context: Context) -> dict[str, Any]:
        from config.cluster import cluster_for
        from config.teams import load_teams
        from plugins.advisor.plan import Plan
        from plugins.placement.state import open_state
        from plugins.recovery.preempt import place_preempting
        from plugins.recovery.state import JobStateStore
        from plugins.recovery.steps import excluded_nodes

        job, conf = attempt_of(context)
        config = settings()
        plan = pull(context, PLAN, Plan)
        exclude = excluded_nodes(conf, config.state_db)
        cluster = cluster_for(job.spec.hardware.gpu_type, config.cluster)
        requeued = bool(conf.history) and conf.history[-1].action == "requeue"
        result = place_preempting(job, plan, cluster, open_state(config.state_db), JobStateStore(config.state_db),
                                  load_teams(config.teams_file), run=conf.run, attempt=conf.attempt,
                                  exclude=exclude, lease_s=LEASE_S, wait_s=REQUEUE_WAIT_S if requeued else 0.0)
        placement = result.placement
        for e in result.evicted:
            self.log.warning("preempted %s run %s attempt %d (%d devices): %s", e.victim.job, e.victim.run,
                             e.victim.attempt, e.freed, e.status.message if e.status else "no status")
        if result.waited_s >= 1:
            self.log.info("waited %.0f s for capacity (requeued after preemption)", result.waited_s)
        self.log.info("placed run %s attempt %d on %s (%s); excluded: %s", conf.run, conf.attempt,
                      ", ".join(f"{n.name}×{n.slots}" for n in placement.nodes), placement.strategy,
                      ", ".join(exclude) or "none")
        return to_xcom(placement)


class ReleaseGangOperator(BaseOperator):
    """Free the attempt's devices (teardown: runs after success, failure or skip)."""

    ui_color = "#eee8d5"

    def execute(self, context: Context) -> dict[str, Any]:
        from plugins.placement.state import open_state

        job, conf = attempt_of(context)
        freed = open_state(settings().state_db).release(job.name, conf.attempt, run=conf.run)
        self.log.info("released %d device(s) of run %s attempt %d", freed, conf.run, conf.attempt)
        return {"freed": freed}
