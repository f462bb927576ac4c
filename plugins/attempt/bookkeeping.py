"""One call after an attempt ends: classify it, decide, carry out the bookkeeping the decision
implies, and hand back the next attempt's conf. The demo, `trainyard launch` and the DAG's
classify task all use `after_attempt`, so they cannot drift apart.

What `after_attempt` does, in order:

1. `classify(evidence)` → `FailureReport`;
2. `decide(report, job, conf, ctx)` → `RecoveryAction`;
3. quarantines the checkpoints the action names (kept, never deleted);
4. cordons the failed nodes of a `node_lost` in the platform state (with the report's reason),
   so no later placement uses them until `trainyard nodes uncordon`;
5. records the attempt's end and the run's lifecycle change (`JobStateStore.finish_attempt`);
6. returns the next attempt's `AttemptConf` when the action retries.

Steps 3–5 are skipped where the caller passes no state store / `apply=False` (a dry look).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainyard.plugins.recovery.classify import classify
from trainyard.plugins.recovery.decide import DecisionContext, apply_quarantine, decide
from trainyard.plugins.recovery.model import AttemptConf, FailureReport, RecoveryAction

if TYPE_CHECKING:
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.recovery.evidence import Evidence
    from trainyard.plugins.state.jobs import JobStateStore, RunInfo


@dataclass(frozen=True)
class AttemptResult:
    report: FailureReport
    action: RecoveryAction
    next_conf: AttemptConf | None
    """The conf of the attempt that carries out the action; None when nothing retries."""
    run: RunInfo | None = None
    """The run's state after the bookkeeping (None without a state store)."""
    quarantined: tuple[str, ...] = ()
    cordoned: tuple[str, ...] = ()


def after_attempt(evidence: Evidence, job: TrainingJob, conf: AttemptConf, ctx: DecisionContext, *,
                  state: JobStateStore | None = None, by: str = "", apply: bool = True) -> AttemptResult:
    """See the module docstring."""
    report = classify(evidence)
    action = decide(report, job, conf, ctx)
    if action.retries and action.resume_step is not None:  # steps lost, in the state and MLflow
        report = report.model_copy(update={"resume_step": action.resume_step})
    quarantined: list[str] = []
    cordoned: list[str] = []
    if apply and action.quarantine:
        quarantined = apply_quarantine(action, endpoint_url=ctx.endpoint_url, by=by or report.job)
    info = None
    if apply and state is not None:
        if report.outcome == "node_lost":
            for node in report.failed_nodes:
                state.cordon(node, report.reason, by=by or f"{report.job} run {report.run}")
                cordoned.append(node)
        info = state.finish_attempt(report, action)
    next_conf = conf.next_attempt(report, action) if action.retries else None
    return AttemptResult(report, action, next_conf, info, tuple(quarantined), tuple(cordoned))


def begin_attempt(state: JobStateStore, job: str, run: str, attempt: int, *, dag_run_id: str = "") -> RunInfo:
    """The lifecycle up to `starting` for `attempt` (from `pending`, or from `recovering` for a
    later attempt), and its attempt row. Idempotent. A run that is already completed, failed or
    cancelled (`trainyard stop` during a hand-over) starts nothing: `IllegalTransition`."""
    from trainyard.plugins.state.jobs import IllegalTransition

    info = state.get_run(job, run)
    if info.final:
        raise IllegalTransition(job, run, info.state, "starting")
    if info.state in ("pending", "recovering"):
        info = state.transition(job, run, "scheduling")
    if info.state == "scheduling":
        info = state.transition(job, run, "starting")
    state.start_attempt(job, run, attempt, dag_run_id=dag_run_id)
    return info
