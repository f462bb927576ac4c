"""`RunOutcome`: the one reading of a run's end that every surface shows (issue 57)."""

from __future__ import annotations

import pytest

from trainyard.plugins.recovery.model import NOT_REGISTERED, REGISTRATION_OFF
from trainyard.plugins.recovery.outcome import RunOutcome, outcome_line


@pytest.mark.parametrize(("state", "final_reason", "kind", "line", "exit_code", "dag", "mlflow"), [
    ("completed", "registered demo version 3 from step 200; candidate moved: no version held it", "registered",
     "completed and registered — registered demo version 3 from step 200; candidate moved: no version held it",
     0, "success", "FINISHED"),
    ("completed", f"completed — {NOT_REGISTERED}", "not_registered",
     "completed, not registered — the script wrote no Trainyard checkpoint (a plain script; see "
     "docs/bring-your-own.md)", 0, "success", "FINISHED"),
    ("completed", f"completed — {REGISTRATION_OFF} (the trigger's register_model Param)", "not_registered",
     "completed, not registered — registration is off (the trigger's register_model Param)", 0, "success", "FINISHED"),
    ("failed", "registration failed: MlflowException: no such bucket", "failed",
     "failed — registration failed: MlflowException: no such bucket", 1, "failed", "FAILED"),
    ("cancelled", "stopped on request (user: ana)", "cancelled", "cancelled — stopped on request (user: ana)",
     1, "failed", "KILLED"),
    ("running", "", "live", "not over yet (running)", 1, "running", "RUNNING"),
])
def test_each_ending_reads_the_same_on_every_surface(state: str, final_reason: str, kind: str, line: str,
                                                     exit_code: int, dag: str, mlflow: str) -> None:
    outcome = RunOutcome.of_run(state, final_reason)
    assert (outcome.kind, outcome.line, outcome.exit_code, outcome.dag_run_state, outcome.mlflow_status) == (
        kind, line, exit_code, dag, mlflow)
    assert outcome_line(state, final_reason) == line
    assert outcome.over == (kind != "live")


def test_a_completed_run_without_a_registered_prefix_never_reads_as_registered() -> None:
    # the old final reason of a run completed before its registration ran: not a registered model
    outcome = RunOutcome.of_run("completed", "the attempt completed: export and register the model")
    assert outcome.kind == "not_registered"
