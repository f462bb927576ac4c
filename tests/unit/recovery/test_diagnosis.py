"""`diagnosis_lines`: what the task a person lands on for a failed attempt logs."""

from __future__ import annotations

from trainyard.plugins.recovery.diagnosis import diagnosis_lines
from trainyard.plugins.recovery.model import FailureReport, RecoveryAction


def test_a_crash_names_the_class_the_rank_the_action_and_the_rank_s_last_lines() -> None:
    report = FailureReport(job="j", run="r-0001", attempt=0, outcome="worker_crash", step=119, rank=1,
                           node="local-1", exit_code=-9, reason="rank 1 on local-1 was killed by SIGKILL at step 119",
                           log_line="step 119 loss 2.1", log_tail=["step 118 loss 2.2", "step 119 loss 2.1"])
    action = RecoveryAction(kind="restart", reason="restart the same gang from step 100", resume_step=100)
    lines = diagnosis_lines(report, action)
    assert lines[:4] == ["attempt 0 of run r-0001: worker_crash at step 119",
                         "failing rank: 1 on local-1: killed by SIGKILL",
                         "cause: rank 1 on local-1 was killed by SIGKILL at step 119",
                         "action: restart from step 100 — restart the same gang from step 100"]
    assert lines[-3:] == ["last 2 log line(s) of rank 1:", "  | step 118 loss 2.2", "  | step 119 loss 2.1"]
    assert not any("Traceback" in ln for ln in lines)


def test_a_lost_node_names_the_node_when_no_rank_failed() -> None:
    report = FailureReport(job="j", run="r-0001", attempt=2, outcome="node_lost", failed_nodes=["local-1"],
                           reason="node lost: 3 missed heartbeats")
    assert diagnosis_lines(report)[1] == "failed node(s): local-1"
