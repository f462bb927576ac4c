"""The recovery engine's contracts (DESIGN §1, §4, §5): what ended an attempt, what to do about
it, and what the next attempt receives.

- `FailureReport`   what `classify()` concluded from the evidence of one attempt;
- `RecoveryAction`  what `decide()` chose, with the reason (restart, replace a node, roll back,
                    fall back, re-plan, requeue, give up, register);
- `AttemptRecord`   one line of a run's history (the attempt, its outcome, the action taken);
- `CheckpointQuery` / `ResumeCheckpoints`  what `decide()` asks of the run's checkpoints, and the
                    answer the attempt engine looks up in the catalog;
- `AttemptConf`     the conf of the DAG run that starts an attempt — the only way state crosses
                    from one attempt to the next, so the chain of DAG runs is the history.

A *training run* is one trigger of a job (the UI, `trainyard submit`, a schedule, an Asset). It
has an id (`run`); all its attempts share it, and so do its reservation, its checkpoints
(`jobs/<job>/runs/<run>/checkpoints`), its heartbeats and its MLflow run.

Everything is JSON (XCom and DAG-run conf carry these, never pickles). Airflow renders
templated conf values as strings (`"1"` for an attempt), so every model parses in pydantic's
lax mode and rejects unknown keys: a typo in a hand-written conf fails with the field's name.
Pure pydantic: importing this module from a DAG file, a sensor or a trigger costs nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainyard.config.runs import check_run_id
from trainyard.config.runs import (
    new_run_id as new_run_id,  # re-exported: the run id is part of this contract
)

FailureClass = Literal[
    "worker_crash", "node_lost", "hang", "diverged", "checkpoint_corrupt", "oom", "preempted", "user_error",
]
"""DESIGN §5's failure classes, in the order the DAG shows their branches."""

Outcome = Literal[
    "completed", "cancelled", "launch_failed",
    "worker_crash", "node_lost", "hang", "diverged", "checkpoint_corrupt", "oom", "preempted", "user_error",
]
"""How an attempt ended: completed, cancelled on request, never started (`launch_failed`: it
could not be planned, placed or submitted — the step's message says why; nothing to recover),
or one failure class."""

FAILURE_CLASSES: tuple[str, ...] = get_args(FailureClass)

LOG_TAIL_SHOWN = 12
"""How many of the failing rank's last log lines a report carries (`FailureReport.log_tail`)."""

FINAL_KINDS = frozenset({"register", "finish", "give_up", "cancel"})
"""The actions after which no attempt follows: the training run ends."""

NOT_REGISTERED = ("not registered: the script wrote no Trainyard checkpoint (a plain script; see "
                  "docs/bring-your-own.md)")
"""What every surface says of a completed run with nothing to register (the `finish` action)."""

REGISTRATION_OFF = "not registered: registration is off"
"""The start of what every surface says of a completed run told not to register (`finish`)."""

ActionKind = Literal[
    "register", "finish", "restart", "replace_node", "rollback", "fall_back", "replan", "requeue",
    "give_up", "cancel",
]
"""- `register`: the attempt completed; export and register the model.
- `finish`: the attempt completed, but the script wrote no Trainyard checkpoint (a plain script):
  the run is completed and nothing is registered, by design (`NOT_REGISTERED`).
- `restart`: same gang, from the newest valid checkpoint (worker crash, hang).
- `replace_node`: re-place excluding the failed nodes (node lost), then restart.
- `rollback`: restart from the newest valid checkpoint *before the divergence onset*.
- `fall_back`: restart from the valid checkpoint before the corrupt one (quarantined, kept).
- `replan`: restart with a plan that needs less memory (OOM).
- `requeue`: wait for capacity, then resume from the emergency checkpoint (preempted); does
  not count against the restart budget.
- `give_up`: the restart budget is spent, or the failure cannot be fixed by restarting.
- `cancel`: stopped on request; nothing to do."""

LifecycleState = Literal[
    "pending", "scheduling", "starting", "running", "recovering", "completed", "failed", "cancelled",
]
"""A training run's lifecycle (seed §7): the platform state records each change."""

FINAL_LIFECYCLE_STATES: tuple[str, ...] = ("completed", "failed", "cancelled")

class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FailureReport(_Model):
    """What ended one attempt, with the evidence a person needs to believe it."""

    job: str
    run: str
    attempt: int = Field(ge=0)
    outcome: Outcome
    reason: str
    """One line: `rank 1 on local-0 was killed by SIGKILL at step 120`."""
    evidence: list[str] = Field(default_factory=list)
    """Each fact that led to the verdict (exit codes, verdicts, log lines, records)."""
    rank: int | None = None
    """The first rank that failed (the one to look at)."""
    node: str | None = None
    step: int | None = None
    """The last step every rank reached."""
    onset_step: int | None = None
    """`diverged`: the first bad step (the rollback goes before it)."""
    exit_code: int | None = None
    log_line: str = ""
    """The most telling line of the failing rank's log (the exception, the OOM message)."""
    log_tail: list[str] = Field(default_factory=list, max_length=50)
    """The failing rank's last log lines (at most `LOG_TAIL_SHOWN`): what a person reads first."""
    failed_nodes: list[str] = Field(default_factory=list)
    """`node_lost`: nodes to exclude from the next placement."""
    corrupt_checkpoint: str = ""
    """`checkpoint_corrupt`: the manifest URI that failed verification."""
    restarts_in_place: int = 0
    """torchrun's own restarts inside this attempt (the fast path), counted against the budget."""
    started_at: datetime | None = None
    ended_at: datetime | None = None
    failed_at: datetime | None = None
    """When the failure happened, as the evidence dates it: the first failing rank's exit, the
    hung rank's last heartbeat, the node verdict's onset (None when nothing dates it)."""
    detected_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    """When the control plane knew: its stop of the gang (a hang, a lost node), else when the
    launcher saw the attempt end."""
    resume_step: int | None = None
    """The checkpoint step the next attempt restores, as decided (0: from scratch; None: no
    next attempt). Filled in by `engine.after_attempt` once the action is known."""
    resumed_at: datetime | None = None
    """When the next attempt's gang was started (`steps.launched` of that attempt)."""

    @property
    def failed(self) -> bool:
        return self.outcome not in ("completed", "cancelled")

    @property
    def time_to_detect_s(self) -> float | None:
        """From the failure to its detection (None when the failure is not dated)."""
        if self.failed_at is None:
            return None
        return max(0.0, (self.detected_at - self.failed_at).total_seconds())

    @property
    def time_to_resume_s(self) -> float | None:
        """From the detection to the next attempt's start (restore and first step not included)."""
        return None if self.resumed_at is None else (self.resumed_at - self.detected_at).total_seconds()

    @property
    def steps_lost(self) -> int | None:
        """Steps trained and thrown away: the last step every rank reached minus the resume step."""
        if self.resume_step is None or self.step is None:
            return None
        return max(0, self.step - self.resume_step)


class RecoveryAction(_Model):
    """What to do after an attempt, and why."""

    kind: ActionKind
    reason: str
    resume_from: str = ""
    """Manifest URI the next attempt restores; empty = the run's newest valid checkpoint."""
    resume_step: int | None = None
    """The step of the checkpoint the next attempt restores (0: none, from scratch), as known
    when deciding; None when no attempt follows or the action did not look."""
    exclude_nodes: list[str] = Field(default_factory=list)
    plan: str = ""
    """`replan`: the new Plan as JSON."""
    quarantine: list[str] = Field(default_factory=list)
    """Manifest URIs to quarantine (kept, never restored again, never deleted)."""
    counts_against_budget: bool = True

    @property
    def retries(self) -> bool:
        """True when the action starts another attempt."""
        return self.kind not in FINAL_KINDS


class CheckpointRef(_Model):
    """One committed checkpoint of the run, as decide needs it: its step and manifest URI."""

    step: int = Field(ge=0)
    manifest_uri: str


class RejectedCheckpoint(CheckpointRef):
    """A committed checkpoint that failed verification, and why (quarantined by the action)."""

    reason: str


class CheckpointQuery(_Model):
    """What `decide` needs to know about the run's checkpoints (`decide.checkpoint_query`): the
    attempt engine asks the catalog exactly this and hands the answer back as `ResumeCheckpoints`."""

    select: bool = True
    """Find the newest checkpoint that verifies (every newer one that does not is rejected)."""
    before_step: int | None = None
    """Only checkpoints older than this step may be chosen (a rollback, a fall-back)."""
    list_committed: bool = False
    """List every committed checkpoint (to quarantine those after a divergence's onset, or to
    tell a completed run that wrote checkpoints from a plain script)."""


class ResumeCheckpoints(_Model):
    """The catalog's answer to a `CheckpointQuery`: the checkpoint chosen for a resume, the newer
    ones rejected on the way, and (when asked) every committed one. Plain values, so `decide`
    reads no object store."""

    chosen: CheckpointRef | None = None
    rejected: list[RejectedCheckpoint] = Field(default_factory=list)
    committed: list[CheckpointRef] = Field(default_factory=list)


class AttemptRecord(_Model):
    """One attempt of a run, as the history shows it."""

    attempt: int = Field(ge=0)
    outcome: Outcome
    reason: str = ""
    action: ActionKind | None = None
    action_reason: str = ""
    step: int | None = None
    restarts_in_place: int = 0
    started_at: datetime | None = None
    ended_at: datetime | None = None
    rank: int | None = None
    """The first failing rank, its exit code, its log line and the divergence onset: what
    `decide` compares across attempts to spot a failure that repeats identically."""
    exit_code: int | None = None
    log_line: str = ""
    onset_step: int | None = None

    @classmethod
    def of(cls, report: FailureReport, action: RecoveryAction | None = None) -> AttemptRecord:
        """The history line of the attempt `report` describes, and the action taken after it."""
        return cls(attempt=report.attempt, outcome=report.outcome, reason=report.reason,
                   action=action.kind if action else None, action_reason=action.reason if action else "",
                   step=report.step, restarts_in_place=report.restarts_in_place,
                   started_at=report.started_at, ended_at=report.ended_at, rank=report.rank,
                   exit_code=report.exit_code, log_line=report.log_line, onset_step=report.onset_step)


class FaultParams(_Model):
    """Fault injection from the DAG's Params (tests and game days); all off by default.
    Applied to attempt 0 only, so the recovery that follows runs clean."""

    kill_rank: int | None = None
    kill_at_step: int | None = None
    hang_rank: int | None = None
    hang_at_step: int | None = None
    nan_at_step: int | None = None
    oom_at_step: int | None = None
    corrupt_newest_checkpoint: bool = False
    fail_gpu_node: str = ""

    @property
    def any(self) -> bool:
        return any(v not in (None, False, "") for v in self.model_dump().values())

    def worker_faults(self) -> str:
        """The faults the training processes inject themselves (`trainyard.worker.faults`' `TRAINYARD_FAULTS`
        syntax); the others are carried out by the control plane (corrupting a checkpoint, failing
        a GPU through the node agent)."""
        items = []
        if self.kill_at_step is not None:
            items.append(f"sigkill@{self.kill_at_step}:{self.kill_rank or 0}")
        if self.hang_at_step is not None:
            items.append(f"hang@{self.hang_at_step}:{self.hang_rank or 0}")
        if self.nan_at_step is not None:
            items.append(f"nan_loss@{self.nan_at_step}")
        if self.oom_at_step is not None:
            items.append(f"oom@{self.oom_at_step}")
        return ",".join(items)


MAX_ATTEMPTS = 10_000
"""Far beyond any restart budget: a conf claiming more is not one of ours."""


class AttemptConf(_Model):
    """The conf of one attempt's DAG run (and the trigger form's Params on the first one).

    The first trigger leaves `run` empty: the run is opened then, and every later attempt gets
    the same `run`, the same `mlflow_run_id`, and the history so far.
    """

    run: str = Field(default="", max_length=63)
    attempt: int = Field(default=0, ge=0, le=MAX_ATTEMPTS)
    mlflow_run_id: str = Field(default="", max_length=64)
    resume_from: str = Field(default="", max_length=4096)
    """Manifest URI to restore; empty = the run's newest valid checkpoint (a fresh start on
    attempt 0). Resolved against the job's area before launch (`steps.resume_point`)."""
    start_from: str = Field(default="", max_length=4096)
    """Attempt 0 only: start from another checkpoint of this job (a manifest URI) or a
    registered model (`models:/<name>@<alias>`) instead of from scratch. Another job's
    checkpoint is the spec's `checkpoint.initFrom`, never a conf value."""
    exclude_nodes: list[str] = Field(default_factory=list, max_length=100_000)
    plan: str = Field(default="", max_length=1_000_000)
    """A Plan JSON that overrides the planner (set after an OOM re-plan)."""
    max_steps: int | None = Field(default=None, gt=0, le=10**12)
    learning_rate: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    dry_run: bool = False
    """Validate, plan and place, then release without launching."""
    register_model: bool | None = None
    """Register the model when the run completes; None: the spec's `registration.enabled`
    (the trigger form's `register_model` Param)."""
    faults: FaultParams = Field(default_factory=FaultParams)
    history: list[AttemptRecord] = Field(default_factory=list, max_length=MAX_ATTEMPTS)
    restarts_used: int = Field(default=0, ge=0, le=MAX_ATTEMPTS)
    """Restarts counted against `faultTolerance.maxRestarts` so far (in-place ones included)."""
    data_checked: str = Field(default="", max_length=64, pattern=r"^[0-9a-f]*$")
    """The fingerprint (`trainyard.plugins.validation.data_quality.data_fingerprint`) of the dataset and
    quality settings an earlier attempt of this run passed; a later attempt whose dataset still
    has it does not run Great Expectations again (its recovery is that much faster)."""

    @field_validator("run")
    @classmethod
    def _run_id(cls, value: str) -> str:
        return check_run_id(value) if value else value

    def next_attempt(self, report: FailureReport, action: RecoveryAction) -> AttemptConf:
        """The conf of the attempt that carries out `action` after `report`."""
        record = AttemptRecord.of(report, action).model_copy(update={"attempt": self.attempt})
        used = self.restarts_used + report.restarts_in_place + (1 if action.counts_against_budget else 0)
        return self.model_copy(update={
            "attempt": self.attempt + 1,
            "resume_from": action.resume_from,
            "start_from": "",
            "exclude_nodes": sorted({*self.exclude_nodes, *action.exclude_nodes}),
            "plan": action.plan or self.plan,
            "faults": FaultParams(),
            "history": [*self.history, record],
            "restarts_used": used,
        })
