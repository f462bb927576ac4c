"""A training run's outcome, computed once: what the DAG-run note, the DAG run's state,
`trainyard status`, `trainyard submit --wait` (and its exit code), the Trainyard view and the
MLflow run (status and the `trainyard.outcome` tag) all say (issue 57, "one truth").

The job state is the record (`trainyard_runs.state` and `final_reason`); this module only reads
it. Four endings, each with its reason:

    completed and registered — registered demo-tiny-lm version 3 from step 200; candidate moved …
    completed, not registered — registration is off (the trigger's `register` Param)
    failed — registration failed: MlflowException: …
    cancelled — stopped by trainyard stop

A registration failure is a failure of the run: `register` ends the run `failed` with the
reason (`plugins/attempt/steps.register`), never `completed`. Pure: no I/O, no Airflow.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

OutcomeKind = Literal["registered", "not_registered", "failed", "cancelled", "live"]

REGISTERED_PREFIX = "registered "
"""The final reason `register` writes for a version it registered: `registered <model> version …`."""

_HEADS: dict[str, str] = {
    "registered": "completed and registered",
    "not_registered": "completed, not registered",
    "failed": "failed",
    "cancelled": "cancelled",
    "live": "not over yet",
}
_MLFLOW: dict[str, str] = {"registered": "FINISHED", "not_registered": "FINISHED", "failed": "FAILED",
                           "cancelled": "KILLED", "live": "RUNNING"}


class RunOutcome(BaseModel):
    """How a training run ended (or that it has not), with the one reason every surface shows."""

    model_config = ConfigDict(frozen=True)

    kind: OutcomeKind
    reason: str = ""
    state: str = ""
    """The lifecycle state it was read from (`completed`, `failed`, `cancelled`, or a live one)."""

    @classmethod
    def of_run(cls, state: str, final_reason: str) -> RunOutcome:
        """The outcome of a run in lifecycle `state` with `final_reason` (the job state's row)."""
        reason = final_reason.strip()
        if state == "completed":
            if reason.startswith(REGISTERED_PREFIX):
                return cls(kind="registered", reason=reason, state=state)
            for head in ("completed — ", "completed, not registered — ", "completed: ", "not registered: "):
                reason = reason.removeprefix(head)  # the head says it once: "completed, not registered — why"
            return cls(kind="not_registered", reason=reason or "nothing to register", state=state)
        if state in ("failed", "cancelled"):
            return cls(kind=state, reason=reason.removeprefix(f"{state} — "), state=state)  # type: ignore[arg-type]
        return cls(kind="live", reason=state, state=state)

    @property
    def over(self) -> bool:
        return self.kind != "live"

    @property
    def succeeded(self) -> bool:
        """Completed (registered or not by design): the run did what it was asked."""
        return self.kind in ("registered", "not_registered")

    @property
    def exit_code(self) -> int:
        """`trainyard submit --wait`'s exit code for this outcome: 0 completed, else 1."""
        return 0 if self.succeeded else 1

    @property
    def dag_run_state(self) -> Literal["success", "failed", "running"]:
        """The state the final DAG run of the run ends in."""
        return "success" if self.succeeded else "running" if self.kind == "live" else "failed"

    @property
    def mlflow_status(self) -> str:
        """The MLflow run's status (`FINISHED`, `FAILED`, `KILLED`, `RUNNING`)."""
        return _MLFLOW[self.kind]

    @property
    def head(self) -> str:
        """`completed and registered`, `completed, not registered`, `failed`, `cancelled`."""
        return _HEADS[self.kind]

    @property
    def line(self) -> str:
        """The one line every surface shows: `<head> — <reason>`."""
        if self.kind == "live":
            return f"{self.head} ({self.state})"
        return f"{self.head} — {self.reason}" if self.reason else self.head


def outcome_line(state: str, final_reason: str) -> str:
    """The one-line outcome of a run in `state` with `final_reason` (for MLflow's run
    description, notes, tables): `RunOutcome.of_run(state, final_reason).line`."""
    return RunOutcome.of_run(state, final_reason).line
