"""Failures read as diagnoses (issue 57): the task a person lands on for a failed attempt,
`attempt_failed`, logs the class, the failing rank, the action and that rank's last log lines,
and fails with one line; the launch log says "fresh start" for attempt 0 and "resuming from step
N (…)" for the attempt after it; the attempts' DAG runs share the training run's id."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.e2e.airflow_stack import RunningStack, demo_spec
from trainyard.plugins.airflow_api import first_attempt, follow_training_run
from trainyard.plugins.recovery.model import FailureReport

pytestmark = pytest.mark.slow

JOB = "diagnosis-crash"
"""The demo's spec as written: `inPlaceRestarts: 0`, so a crash goes through the control plane (the
shared stack's demo job restarts in place)."""


def task_log(s: RunningStack, dag_run_id: str, task_id: str) -> str:
    folder = s.stack.home / "airflow" / "logs" / f"dag_id={JOB}" / f"run_id={dag_run_id}" / f"task_id={task_id}"
    logs = sorted(folder.glob("attempt=*.log"))
    assert logs, folder
    return logs[-1].read_text(errors="replace")


def test_a_crashed_attempt_reads_as_a_diagnosis_and_the_next_says_where_it_resumed(shared: RunningStack) -> None:
    shared.add_jobs({JOB: demo_spec(JOB)})
    conf, first_id = first_attempt({"max_steps": 60, "fault_kill_rank": 1, "fault_kill_at_step": 55})
    shared.client.trigger(JOB, conf, run_id=first_id)
    attempts = follow_training_run(shared.client, JOB, first_id, timeout_s=900)
    assert [(a.outcome, a.action) for a in attempts] == [("worker_crash", "restart"), ("completed", "register")], \
        f"{attempts}\n{shared.logs()}"
    run = attempts[0].run
    assert [a.dag_run_id for a in attempts] == [f"{run}__attempt-0", f"{run}__attempt-1"]

    report = FailureReport.model_validate(shared.client.xcom(JOB, first_id, "classify_outcome", key="report"))
    failed = task_log(shared, first_id, "attempt_failed")
    assert f"attempt 0 of run {run}: worker_crash at step" in failed
    assert "failing rank: 1 on " in failed and "killed by SIGKILL" in failed
    assert "action: restart from step 50" in failed
    assert report.log_tail, report  # rank 1 wrote its start-up lines before the kill
    for line in report.log_tail:  # the failing rank's last lines, as the evidence read them
        assert f"  | {line}" in failed
    assert "worker_crash — restart handed to attempt 1 (diagnosis above)" in failed
    assert "Traceback" not in failed, failed  # the verdict, not a framework traceback under it

    assert "fresh start" in task_log(shared, first_id, "launch_training")
    assert "resuming from step 50" in task_log(shared, attempts[1].dag_run_id, "launch_training")

    from tests.e2e.shared_stack.test_registration import screens
    from tests.support.browser import chromium_page

    with chromium_page() as page:  # where a person lands: the failed task's log in Airflow
        page.goto(f"{shared.stack.url}/dags/{JOB}/runs/{quote(first_id, safe='')}/tasks/attempt_failed",
                  wait_until="networkidle")
        page.get_by_text("failing rank: 1").first.wait_for(timeout=60_000)
        page.screenshot(path=str(screens() / "attempt-failed-diagnosis.png"), full_page=True)
