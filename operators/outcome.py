"""After the watchers: `classify_outcome`, the `choose_action` branch, the recovery actions,
`register_model`, `give_up`, `cancelled` and the hand-over `resume_next_attempt`.

All the deciding is the attempt engine's `conclude` step (evidence → classify → decide →
quarantine, cordon, job state → the next attempt's conf); `classify_outcome` calls it once and
pushes the `FailureReport`, the `RecoveryAction` and the next `AttemptConf`. The branch only maps the
action's kind to the task of the same name, so the graph shows which path each attempt took.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import BaseBranchOperator, BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from trainyard.operators.common import (
    fail_plainly,
    note_dag_run,
    opened_of,
    pull,
    pull_optional,
    runtime,
    to_xcom,
)
from trainyard.operators.launch import LAUNCH
from trainyard.operators.links import MlflowRunLink, ModelVersionLink, TrainyardViewLink
from trainyard.operators.placement import PLAN
from trainyard.operators.validate import CHECKED, VALIDATE_DATA

if TYPE_CHECKING:
    from airflow.sdk import Context

    from trainyard.plugins.recovery.model import RecoveryAction

CLASSIFY = "classify_outcome"
RESUME = "resume_next_attempt"
RECOVERY_ACTIONS = ("restart", "replace_node", "rollback", "fall_back", "replan", "requeue")
"""The actions that start another attempt; each is a task of the same name."""
FINAL_ACTIONS = {"register": "register_model", "finish": "finish_run", "give_up": "give_up", "cancel": "cancelled"}


class ClassifyOutcomeOperator(BaseOperator):
    """Runs whatever the watchers concluded (trigger rule `all_done`): gathers the attempt's
    evidence, classifies it, decides, records it (job state, MLflow) and pushes the verdict."""

    ui_color = "#fadbd8"
    operator_extra_links = (TrainyardViewLink(), MlflowRunLink(),)

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.advisor.plan import Plan
        from trainyard.plugins.attempt.steps import DataChecked, conclude
        from trainyard.plugins.run.model import RunHandle, RunStatus

        opened = opened_of(context)
        result = conclude(opened, pull_optional(context, LAUNCH, RunHandle), runtime(),
                          status=pull_optional(context, "watch_training", RunStatus),
                          plan_used=pull_optional(context, PLAN, Plan), by=context["dag_run"].run_id,
                          mlflow_run_id=context["ti"].xcom_pull(task_ids=LAUNCH, key="mlflow_run_id") or "",
                          checked=pull_optional(context, VALIDATE_DATA, DataChecked, key=CHECKED))
        if result is None:
            raise AirflowSkipException("nothing was launched (a dry run, or a step before launch failed)")
        report, action, conf = result.report, result.action, opened.conf
        note_dag_run(context, result.summary)
        self.log.info("attempt %d of run %s: %s — %s", conf.attempt, conf.run, report.outcome, report.reason)
        for line in report.evidence:
            self.log.info("  evidence: %s", line)
        self.log.info("action: %s — %s", action.kind, action.reason)
        ti = context["ti"]
        ti.xcom_push(key="report", value=to_xcom(report))
        ti.xcom_push(key="action", value=to_xcom(action))
        if result.next_conf is not None:
            ti.xcom_push(key="next_conf", value=to_xcom(result.next_conf))
        return {"outcome": report.outcome, "action": action.kind}


def _action(context: Context) -> RecoveryAction:
    from trainyard.plugins.recovery.model import RecoveryAction

    return pull(context, CLASSIFY, RecoveryAction, key="action")


class ChooseActionOperator(BaseBranchOperator):
    """The branch: the task named after the decided action (nothing is decided here)."""

    ui_color = "#fadbd8"

    def choose_branch(self, context: Context) -> str:
        from trainyard.plugins.recovery.model import RecoveryAction

        action = pull_optional(context, CLASSIFY, RecoveryAction, key="action")
        if action is None:
            raise AirflowSkipException("no outcome to act on: nothing was launched")
        return FINAL_ACTIONS.get(action.kind, action.kind)


class RecoveryActionOperator(BaseOperator):
    """One recovery path (`restart`, `replace_node`, `rollback`, `fall_back`, `replan`,
    `requeue`): says what the next attempt will do differently; the bookkeeping it implies
    (quarantine, cordon) was done by the engine when it decided."""

    ui_color = "#f5cba7"

    def __init__(self, *, action: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action = action

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.recovery.model import AttemptConf

        action = _action(context)
        if action.kind != self.action:  # the branch chose another path: a bug in the DAG
            raise AirflowFailException(f"task {self.task_id} runs action {self.action!r}, decided was {action.kind!r}")
        nxt = pull(context, CLASSIFY, AttemptConf, key="next_conf")
        self.log.info("%s: %s", action.kind, action.reason)
        where = (f"step {action.resume_step} ({nxt.resume_from})" if action.resume_step is not None and nxt.resume_from
                 else nxt.resume_from or "the run's newest valid checkpoint")
        self.log.info("attempt %d will resume from %s; excluded nodes: %s; restarts used %d",
                      nxt.attempt, where,
                      ", ".join(nxt.exclude_nodes) or "none", nxt.restarts_used)
        return {"action": action.kind, "next_attempt": nxt.attempt, "resume_from": nxt.resume_from}


class RegisterModelOperator(BaseOperator):
    """The attempt completed: export the best valid checkpoint to safetensors, register it as a
    model version with lineage (`candidate` moves under the spec's rule), close the MLflow run.
    The run's outcome — registered, or failed because the registration did — is the note, the
    DAG run's state and the MLflow run's status alike (`trainyard.plugins.recovery.outcome`)."""

    ui_color = "#abebc6"
    operator_extra_links = (ModelVersionLink(), MlflowRunLink(), TrainyardViewLink(),)

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.attempt.steps import RegistrationFailed, close, register

        opened, rt = opened_of(context), runtime()
        mlflow_run_id = context["ti"].xcom_pull(task_ids=LAUNCH, key="mlflow_run_id")
        try:
            version = register(opened, mlflow_run_id, rt)
        except RegistrationFailed as e:  # the run failed: say so as a diagnosis, not as chained tracebacks
            self.log.error("run %s: %s", opened.conf.run, e)
            note_dag_run(context, f"attempt {opened.conf.attempt}: {e}")
            close(opened, mlflow_run_id, rt, status="failed")
            raise AirflowFailException(str(e)) from None
        note_dag_run(context, f"attempt {opened.conf.attempt}: {version.outcome.line}")
        self.log.info("run %s: %s", opened.conf.run, version.outcome.line)
        closed = close(opened, mlflow_run_id, rt)
        self.log.info("run %s: %s", opened.conf.run, ", ".join(f"{k} {v:.4g}" for k, v in closed.cost.items()))
        return {**version.model_dump(), **closed.cost}


class FinishRunOperator(BaseOperator):
    """The attempt completed and the script wrote no Trainyard checkpoint (a plain script): the run
    is completed and its MLflow run closed FINISHED; nothing is registered, by design — never an
    attempted and failed registration."""

    ui_color = "#d5f5e3"
    operator_extra_links = (MlflowRunLink(), TrainyardViewLink(),)

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.attempt.steps import close

        opened, rt = opened_of(context), runtime()
        mlflow_run_id = context["ti"].xcom_pull(task_ids=LAUNCH, key="mlflow_run_id")
        self.log.info("run %s: %s", opened.conf.run, _action(context).reason)
        closed = close(opened, mlflow_run_id, rt) if mlflow_run_id else None
        return {"registered": False, "reason": _action(context).reason, **(closed.cost if closed else {})}


class GiveUpOperator(BaseOperator):
    """Fails the DAG run with every attempt of the run and its cause (no retry can help)."""

    ui_color = "#e74c3c"

    def execute(self, context: Context) -> None:
        from trainyard.plugins.attempt.steps import close
        from trainyard.plugins.recovery.decide import history_lines
        from trainyard.plugins.recovery.model import FailureReport

        opened = opened_of(context)
        from trainyard.plugins.recovery.diagnosis import diagnosis_lines

        report = pull(context, CLASSIFY, FailureReport, key="report")
        for line in diagnosis_lines(report, _action(context)):
            self.log.error("%s", line)
        lines = "\n".join(history_lines(opened.conf.history, report))
        mlflow_run_id = context["ti"].xcom_pull(task_ids=LAUNCH, key="mlflow_run_id")
        if mlflow_run_id:  # the loss plot, the timeline and the cost of what was spent
            close(opened, mlflow_run_id, runtime(), status="failed")
        self.log.error("attempts:\n%s", lines)
        fail_plainly(f"run {opened.conf.run} gave up: {_action(context).reason}")


class CancelledOperator(BaseOperator):
    """The run was stopped on request: nothing more to do — and the DAG run ends failed, since
    the attempt did not complete (its note says it was cancelled)."""

    ui_color = "#d5d8dc"

    def execute(self, context: Context) -> None:
        from trainyard.plugins.attempt.steps import close

        opened = opened_of(context)
        mlflow_run_id = context["ti"].xcom_pull(task_ids=LAUNCH, key="mlflow_run_id")
        if mlflow_run_id:  # the loss plot, the timeline and the cost up to the stop, as give_up's
            close(opened, mlflow_run_id, runtime(), status="cancelled")
        fail_plainly(f"run {opened.conf.run} was cancelled: {_action(context).reason}")


class AttemptFailedOperator(BaseOperator):
    """After the hand-over: fails the DAG run of an attempt that did not complete, though its
    recovery ran and the next attempt was triggered — so the grid shows a failed attempt red,
    with its class and action in the message and the run's note."""

    ui_color = "#e6b0aa"

    def execute(self, context: Context) -> None:
        from trainyard.plugins.recovery.diagnosis import diagnosis_lines
        from trainyard.plugins.recovery.model import FailureReport

        report = pull(context, CLASSIFY, FailureReport, key="report")
        action = _action(context)
        for line in diagnosis_lines(report, action):  # the diagnosis is what a person lands on
            self.log.error("%s", line)
        fail_plainly(f"attempt {report.attempt} of run {report.run}: {report.outcome} — "
                     f"{action.kind} handed to attempt {report.attempt + 1} (diagnosis above)")


class ResumeNextAttemptOperator(TriggerDagRunOperator):
    """The hand-over: triggers this same DAG with the next attempt's conf. The new DAG run's id
    is derived from (run, attempt), so a retried hand-over never starts two attempts."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(trigger_dag_id="{{ dag.dag_id }}", skip_when_already_exists=True, **kwargs)

    def execute(self, context: Context) -> Any:
        from trainyard.plugins.recovery.model import AttemptConf

        nxt = pull(context, CLASSIFY, AttemptConf, key="next_conf")
        self.conf = to_xcom(nxt)
        from trainyard.plugins.airflow_api import attempt_dag_run_id

        self.trigger_run_id = attempt_dag_run_id(nxt.run, nxt.attempt)
        self.log.info("handing run %s over to attempt %d (DAG run %s)", nxt.run, nxt.attempt, self.trigger_run_id)
        return super().execute(context)
