"""`decide(report, job, conf, ctx) -> RecoveryAction`: what to do after an attempt, and why.

The rules, in the order they are applied:

1. `completed` → **register** (→ **finish** without a checkpoint of ours, or with registration off:
   the spec's `registration.enabled`, the trigger's `register_model`); `cancelled` → **cancel**.
2. **The same failure again** → give up, because another restart would only repeat it:
   - a `worker_crash` of the same rank with the same ordinary exit code (not a signal: a
     signal comes from outside the script) and no step progress since the previous attempt
     → "the script fails the same way every time: <its log line>";
   - a `diverged` attempt whose onset is the previous attempt's onset: the rollback replayed
     the same data with the same RNG state and diverged at the same step again.
3. **The restart budget** (`spec.faultTolerance.maxRestarts`): restarts used so far (the
   conf's count, which includes earlier in-place restarts) plus this attempt's in-place
   (torchrun) restarts; when nothing is left, every retrying action becomes **give_up** with a
   reason listing every attempt and its cause. `preempted` never counts against it.
4. The class's own action:
   - `worker_crash`, `hang` → **restart** the same gang from the newest valid checkpoint
     (a newer committed one that fails verification is quarantined — kept — and named in the
     reason, here and for every "newest valid" choice: replace_node, replan, requeue);
   - `node_lost` → **replace_node**: re-place excluding the failed nodes (the caller also
     cordons them in the platform state), then restart;
   - `diverged` → **rollback** to the newest valid checkpoint *before the onset*; every
     committed checkpoint at or after the onset is quarantined (they hold the diverging state,
     and a later crash must not resume from them). No valid checkpoint before the onset →
     give up: a fresh start replays the same steps with the same seed and would diverge again;
   - `checkpoint_corrupt` → **fall_back** to the newest valid checkpoint older than the bad
     one, quarantining the bad one (and any newer that fail verification). None left → give
     up rather than silently start over and discard the run's progress;
   - `oom` → **replan** with `replan_after_oom` (the new Plan JSON in the action); give up
     when nothing fits in less memory;
   - `preempted` → **requeue**, resuming from the emergency checkpoint (the newest one).

Every retrying action says which step the next attempt resumes from (`resume_step`: the steps
lost are counted from it). "Newest valid" restarts leave `resume_from` empty: the worker restores its newest valid
checkpoint itself, and so does an in-place torchrun restart inside the next attempt; rollback
and fall-back name their checkpoint explicitly.

Pure: `decide` reads no catalog and writes nothing. It says what it needs to know about the
run's checkpoints (`checkpoint_query`: none, for a decision the guards make; else the newest
valid one, before the onset or the corrupt step where that matters); the attempt engine looks
that up and hands the answer in (`DecisionContext.checkpoints`, a `ResumeCheckpoints`). The
checkpoints to quarantine come back in the action (`RecoveryAction.quarantine`), and the attempt
engine quarantines them (`plugins/attempt/bookkeeping.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainyard.plugins.recovery.model import (
    NOT_REGISTERED,
    REGISTRATION_OFF,
    AttemptConf,
    AttemptRecord,
    CheckpointQuery,
    FailureReport,
    RecoveryAction,
    ResumeCheckpoints,
)

if TYPE_CHECKING:
    from trainyard.config.cluster import Cluster
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan


@dataclass(frozen=True)
class DecisionContext:
    """What decisions need beyond the report, as values: the run's checkpoints as the catalog
    answered `checkpoint_query` (None when it asked nothing), and the plan and cluster the
    attempt ran with (for an OOM re-plan)."""

    checkpoints: ResumeCheckpoints | None = None
    cluster: Cluster | None = None
    plan: Plan | None = None


def checkpoint_query(report: FailureReport, job: TrainingJob, conf: AttemptConf) -> CheckpointQuery | None:
    """What `decide` will need to know about the run's checkpoints for `report`; None when the
    decision does not look at them (a cancel, a give-up the guards decide). The attempt engine
    asks the catalog exactly this, so a decision costs the lookups the old in-line reads cost."""
    if report.outcome == "completed":
        return CheckpointQuery(select=False, list_committed=True)
    if _without_checkpoints(report, job, conf) is not None:
        return None
    return CheckpointQuery(before_step=resume_bound(report), list_committed=report.outcome == "diverged")


def resume_bound(report: FailureReport) -> int | None:
    """The step a resume must start before: a divergence's onset (every checkpoint from it on
    holds the diverging state), the corrupt checkpoint's step; None: the newest valid one."""
    if report.outcome == "diverged":
        return report.onset_step
    if report.outcome == "checkpoint_corrupt" and report.corrupt_checkpoint:
        return _step_of(report.corrupt_checkpoint)
    return None


def decide(report: FailureReport, job: TrainingJob, conf: AttemptConf, ctx: DecisionContext) -> RecoveryAction:
    """The action after `report` (see the module docstring for the rules and their order).
    `ctx.checkpoints` must answer `checkpoint_query(report, job, conf)` where that is not None."""
    if report.outcome == "completed":
        if not _checkpoints(ctx).committed:
            return RecoveryAction(kind="finish", reason=f"completed — {NOT_REGISTERED}", counts_against_budget=False)
        off = registration_off(job, conf)
        if off:
            return RecoveryAction(kind="finish", reason=f"completed — {off}", counts_against_budget=False)
        return RecoveryAction(kind="register", reason="the attempt completed: export and register the model",
                              counts_against_budget=False)
    early = _without_checkpoints(report, job, conf)
    if early is not None:
        return early
    return _RULES[report.outcome](report, job, ctx)


def registration_off(job: TrainingJob, conf: AttemptConf) -> str:
    """Why a completed run registers nothing though it could ('' when it registers): the
    trigger's `register_model` Param wins over the spec's `registration.enabled`."""
    spec_on = job.spec.registration.enabled
    if conf.register_model is False and spec_on:
        return f"{REGISTRATION_OFF} (the trigger's register_model Param)"
    if conf.register_model is not True and not spec_on:  # the form's switch shows the spec's setting
        return f"{REGISTRATION_OFF} (spec.registration.enabled: false)"
    return ""


def _without_checkpoints(report: FailureReport, job: TrainingJob, conf: AttemptConf) -> RecoveryAction | None:
    """The decisions made before any checkpoint is looked at (rules 1–3, and a rollback with
    no onset); None when the class's own rule decides."""
    if report.outcome == "cancelled":
        return RecoveryAction(kind="cancel", reason=report.reason, counts_against_budget=False)
    if report.outcome == "user_error":
        return _give_up(f"{report.reason} — not retried: the same code and inputs fail the same way; fix the script "
                        "(or its inputs) and trigger the job again (no restart of the budget was used)")
    repeated = _same_failure_again(report, conf.history)
    if repeated:
        return _give_up(repeated)
    if report.outcome != "preempted":
        spent = _budget_spent(report, job, conf)
        if spent:
            return _give_up(spent)
    if report.outcome == "diverged" and report.onset_step is None:
        return _give_up("diverged, but the onset step is unknown (no diverged.json): cannot tell "
                        "which checkpoint is clean; pick one and start from it by hand")
    return None


def budget_left(report: FailureReport, job: TrainingJob, conf: AttemptConf) -> int:
    """Restarts still allowed after this attempt (in-place restarts counted)."""
    return job.spec.fault_tolerance.max_restarts - conf.restarts_used - report.restarts_in_place


def history_lines(history: list[AttemptRecord], report: FailureReport | None = None) -> list[str]:
    """`attempt 0: worker_crash — rank 1 on local-1 was killed by SIGKILL at step 120`, one per
    attempt, the current one (`report`) last."""
    lines = [f"attempt {r.attempt}: {r.outcome} — {r.reason}" for r in history]
    if report is not None:
        lines.append(f"attempt {report.attempt}: {report.outcome} — {report.reason}")
    return lines


# --- guards -----------------------------------------------------------------------------------


def _same_failure_again(report: FailureReport, history: list[AttemptRecord]) -> str:
    if not history:
        return ""
    prev = history[-1]
    if report.outcome == "worker_crash" and prev.outcome == "worker_crash" and \
            report.rank is not None and report.rank == prev.rank and \
            report.exit_code is not None and report.exit_code == prev.exit_code and \
            _ordinary_exit(report.exit_code) and (report.step or 0) <= (prev.step or 0):
        line = report.log_line or prev.log_line or f"exit code {report.exit_code}"
        return (f"the script fails the same way every time: {line} (rank {report.rank}, exit code "
                f"{report.exit_code}, attempts {prev.attempt} and {report.attempt}, no step progress "
                f"past step {prev.step or 0})")
    if report.outcome == "diverged" and prev.outcome == "diverged" and \
            report.onset_step is not None and report.onset_step == prev.onset_step:
        return (f"the run diverges at step {report.onset_step} again after rolling back (attempts "
                f"{prev.attempt} and {report.attempt}): the same data and RNG state replay the same "
                "divergence; lower the learning rate or skip the offending data")
    return ""


def _ordinary_exit(code: int) -> bool:
    """An exit the script chose (1, 2, …), not a signal (negative, or 128 + N from a shell)."""
    return 0 < code <= 128


def _budget_spent(report: FailureReport, job: TrainingJob, conf: AttemptConf) -> str:
    if budget_left(report, job, conf) > 0:
        return ""
    limit = job.spec.fault_tolerance.max_restarts
    used = conf.restarts_used + report.restarts_in_place
    in_place = f", {report.restarts_in_place} of them in place by torchrun" if report.restarts_in_place else ""
    return (f"restart budget spent: {used} of {limit} restarts used (faultTolerance.maxRestarts)"
            f"{in_place}. " + "; ".join(history_lines(conf.history, report)))


def _give_up(reason: str) -> RecoveryAction:
    return RecoveryAction(kind="give_up", reason=reason, counts_against_budget=False)


# --- one rule per class -------------------------------------------------------------------------


def _newest(ctx: DecisionContext) -> tuple[int, str, list[str], str]:
    """(step, where, quarantine, note) for a restart from the run's newest valid checkpoint.

    Newer committed checkpoints that fail verification are quarantined (kept, never restored
    again) and named in the reason: the worker would skip them by itself, but silently, and a
    later attempt (or retention) could meet them again."""
    selection = _checkpoints(ctx)
    newest = selection.chosen
    note = "; ".join(f"checkpoint step {r.step} does not verify ({r.reason}): quarantined"
                     for r in selection.rejected)
    where = f"step {newest.step}" if newest is not None else "scratch (no valid checkpoint yet)"
    return (newest.step if newest is not None else 0), where, [r.manifest_uri for r in selection.rejected], note


def _with(note: str) -> str:
    return f" ({note})" if note else ""


def _restart(report: FailureReport, job: TrainingJob, ctx: DecisionContext) -> RecoveryAction:
    step, where, bad, note = _newest(ctx)
    return RecoveryAction(kind="restart", resume_step=step, quarantine=bad,
                          reason=f"{report.outcome}: restart the same gang from {where}{_with(note)}")


def _replace_node(report: FailureReport, job: TrainingJob, ctx: DecisionContext) -> RecoveryAction:
    step, where, bad, note = _newest(ctx)
    nodes = ", ".join(report.failed_nodes) or "(unnamed)"
    return RecoveryAction(kind="replace_node", exclude_nodes=list(report.failed_nodes), resume_step=step,
                          quarantine=bad, reason=f"node lost: re-place without {nodes}, resume from {where}"
                                                 f"{_with(note)}")


def _rollback(report: FailureReport, job: TrainingJob, ctx: DecisionContext) -> RecoveryAction:
    onset = report.onset_step
    if onset is None:  # `_without_checkpoints` gave up already
        raise ValueError("a rollback needs the divergence's onset step")
    selection = _checkpoints(ctx)
    after = [r.manifest_uri for r in selection.committed if r.step >= onset]
    if selection.chosen is None:
        return _give_up(f"diverged at step {onset} and no valid checkpoint precedes it: a fresh start "
                        "replays the same steps with the same seed and would diverge again; lower the "
                        "learning rate or fix the data, then start a new run")
    return RecoveryAction(
        kind="rollback", resume_from=selection.chosen.manifest_uri, resume_step=selection.chosen.step,
        quarantine=list(dict.fromkeys([*after, *(r.manifest_uri for r in selection.rejected)])),
        reason=(f"diverged at step {onset}: roll back to step {selection.chosen.step}, the newest valid "
                f"checkpoint before the onset" + (f"; quarantine {len(after)} checkpoint(s) at or "
                                                  "after it" if after else "")))


def _fall_back(report: FailureReport, job: TrainingJob, ctx: DecisionContext) -> RecoveryAction:
    bad = report.corrupt_checkpoint
    bad_step = resume_bound(report)
    selection = _checkpoints(ctx)
    quarantine = list(dict.fromkeys([*([bad] if bad else []), *(r.manifest_uri for r in selection.rejected)]))
    if selection.chosen is None:
        return _give_up(f"checkpoint corrupt ({report.reason}) and no valid checkpoint to fall back to; "
                        "starting over would discard the run's progress: inspect with `trainyard "
                        "checkpoints`, then start a new run")
    named = f"step {bad_step}" if bad_step is not None else \
        ", ".join(f"step {r.step}" for r in selection.rejected) or "the restore target"
    return RecoveryAction(kind="fall_back", resume_from=selection.chosen.manifest_uri,
                          resume_step=selection.chosen.step, quarantine=quarantine,
                          reason=f"checkpoint {named} does not verify: quarantine it, fall back to step "
                                 f"{selection.chosen.step}")


def _replan(report: FailureReport, job: TrainingJob, ctx: DecisionContext) -> RecoveryAction:
    from trainyard.plugins.advisor.planner import replan_after_oom

    if ctx.cluster is None or ctx.plan is None:
        raise ValueError("decide() needs DecisionContext.cluster and .plan (the plan that ran out of "
                         "memory) to re-plan after an OOM")
    try:
        result = replan_after_oom(job, ctx.cluster, ctx.plan)
    except ValueError as e:
        return _give_up(f"out of memory with {ctx.plan.describe()} and cannot re-plan: {e}")
    best = result.best
    if best is None:
        hints = "; ".join(result.suggestions) or "none"
        return _give_up(f"out of memory with {ctx.plan.describe()}, and no plan fits in less memory "
                        f"(suggestions: {hints})")
    if best.describe() == ctx.plan.describe():
        return _give_up(f"out of memory with {ctx.plan.describe()}; the re-plan found nothing smaller")
    step, _, bad, note = _newest(ctx)
    return RecoveryAction(kind="replan", plan=best.model_dump_json(), resume_step=step, quarantine=bad,
                          reason=f"out of memory with {ctx.plan.describe()} ({_mib(ctx.plan)}): re-planned "
                                 f"to {best.describe()} ({_mib(best)}){_with(note)}")


def _requeue(report: FailureReport, job: TrainingJob, ctx: DecisionContext) -> RecoveryAction:
    step, where, bad, note = _newest(ctx)
    return RecoveryAction(kind="requeue", counts_against_budget=False, resume_step=step, quarantine=bad,
                          reason=f"preempted: requeue and resume from {where} (not counted against "
                                 f"the restart budget){_with(note)}")


_RULES = {"worker_crash": _restart, "hang": _restart, "node_lost": _replace_node, "diverged": _rollback,
          "checkpoint_corrupt": _fall_back, "oom": _replan, "preempted": _requeue}


# --- checkpoints ------------------------------------------------------------------------------


def _checkpoints(ctx: DecisionContext) -> ResumeCheckpoints:
    if ctx.checkpoints is None:
        raise ValueError("decide() needs DecisionContext.checkpoints: the catalog's answer to "
                         "checkpoint_query(report, job, conf), looked up by the attempt engine")
    return ctx.checkpoints


def _step_of(manifest_uri: str) -> int | None:
    from trainyard.plugins.checkpoint.uris import split_manifest_uri

    try:
        return split_manifest_uri(manifest_uri)[2]
    except ValueError:
        return None


def _mib(plan: Plan) -> str:
    return f"{(plan.memory_per_gpu_bytes or 0) / 2**20:.0f} MiB per device"
