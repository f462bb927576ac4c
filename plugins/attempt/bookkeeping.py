"""One call after an attempt ends: classify it, decide, carry out the bookkeeping the decision
implies, and hand back the next attempt's conf. The demo, `trainyard launch` and the DAG's
classify task all use `after_attempt`, so they cannot drift apart.

What `after_attempt` does, in order:

1. `classify(evidence)` → `FailureReport`;
2. looks up in the run's checkpoint catalog what `decide` asks (`checkpoint_query`: the newest
   valid checkpoint, before the onset or the corrupt step where that matters), then
   `decide(report, job, conf, ctx)` → `RecoveryAction` — recovery itself reads no store;
3. quarantines the checkpoints the action names (kept, never deleted): decide returns them as
   a value, the engine writes the markers;
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
from trainyard.plugins.recovery.decide import DecisionContext, checkpoint_query, decide
from trainyard.plugins.recovery.model import (
    AttemptConf,
    CheckpointQuery,
    CheckpointRef,
    FailureReport,
    RecoveryAction,
    RejectedCheckpoint,
    ResumeCheckpoints,
)

if TYPE_CHECKING:
    from trainyard.config.cluster import Cluster
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.recovery.evidence import Evidence
    from trainyard.plugins.state.jobs import JobStateStore, RunInfo


@dataclass(frozen=True)
class DecisionInputs:
    """Where `decide`'s inputs come from: the run's checkpoint catalog (looked up here, handed to
    recovery as values; the quarantines are written there), and the plan and cluster the attempt
    ran with (for an OOM re-plan)."""

    checkpoint_uri: str
    """The run's checkpoint root (`…/jobs/<job>/runs/<run>/checkpoints`)."""
    endpoint_url: str | None = None
    cluster: Cluster | None = None
    plan: Plan | None = None
    verify_hashes: bool = True
    """Re-hash candidate checkpoints (False: sizes only, for very large checkpoints)."""


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


def after_attempt(evidence: Evidence, job: TrainingJob, conf: AttemptConf, inputs: DecisionInputs, *,
                  state: JobStateStore | None = None, by: str = "", apply: bool = True) -> AttemptResult:
    """See the module docstring."""
    report = classify(evidence)
    action = decide_from_catalog(report, job, conf, inputs)
    if action.retries and action.resume_step is not None:  # steps lost, in the state and MLflow
        report = report.model_copy(update={"resume_step": action.resume_step})
    quarantined: list[str] = []
    cordoned: list[str] = []
    if apply and action.quarantine:
        quarantined = apply_quarantine(action, endpoint_url=inputs.endpoint_url, by=by or report.job)
    info = None
    if apply and state is not None:
        if report.outcome == "node_lost":
            for node in report.failed_nodes:
                state.cordon(node, report.reason, by=by or f"{report.job} run {report.run}")
                cordoned.append(node)
        info = state.finish_attempt(report, action)
    next_conf = conf.next_attempt(report, action) if action.retries else None
    return AttemptResult(report, action, next_conf, info, tuple(quarantined), tuple(cordoned))


def decide_from_catalog(report: FailureReport, job: TrainingJob, conf: AttemptConf,
                        inputs: DecisionInputs) -> RecoveryAction:
    """`decide`, with the checkpoints it asks about looked up in the run's catalog first."""
    query = checkpoint_query(report, job, conf)
    checkpoints = look_up_checkpoints(query, inputs) if query is not None else None
    return decide(report, job, conf, DecisionContext(checkpoints=checkpoints, cluster=inputs.cluster,
                                                     plan=inputs.plan))


def look_up_checkpoints(query: CheckpointQuery, inputs: DecisionInputs) -> ResumeCheckpoints:
    """The catalog's answer to `query`: the newest checkpoint that verifies (before
    `query.before_step`), the newer ones that do not, and every committed one when asked."""
    from trainyard.plugins.checkpoint.catalog import list_checkpoints, select_latest_valid

    chosen, rejected, committed = None, [], []
    if query.select:
        selection = select_latest_valid(inputs.checkpoint_uri, hashes=inputs.verify_hashes,
                                        before_step=query.before_step, endpoint_url=inputs.endpoint_url)
        if selection.chosen is not None:
            chosen = CheckpointRef(step=selection.chosen.step, manifest_uri=selection.chosen.manifest_uri)
        rejected = [RejectedCheckpoint(step=r.step, manifest_uri=r.manifest_uri, reason=why.reason)
                    for r, why in selection.rejected]
    if query.list_committed:
        committed = [CheckpointRef(step=r.step, manifest_uri=r.manifest_uri)
                     for r in list_checkpoints(inputs.checkpoint_uri, endpoint_url=inputs.endpoint_url)]
    return ResumeCheckpoints(chosen=chosen, rejected=rejected, committed=committed)


def apply_quarantine(action: RecoveryAction, *, endpoint_url: str | None = None, by: str = "") -> list[str]:
    """Quarantine the checkpoints `action` names (kept, never restored again), with the action's
    reason; their markers' URIs. Decide returns them; writing the markers is the engine's."""
    from trainyard.plugins.checkpoint.catalog import quarantine

    return [quarantine(uri, action.reason, endpoint_url=endpoint_url, by=by) for uri in action.quarantine]


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
