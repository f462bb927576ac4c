"""A spec the launcher cannot run, through the real Airflow: the attempt ends `launch_failed` with
the launcher's own message, the DAG run ends failed, and the job state says the run failed —
never a run left `starting`."""

from __future__ import annotations

from typing import Any

from tests.e2e.airflow_stack import RunningStack, demo_spec
from trainyard.plugins.airflow_api import follow_training_run

JOB = "launch-fails"


def _spec() -> dict[str, Any]:
    doc = demo_spec(JOB, smaller=False)
    doc["spec"]["source"]["entrypoint"] = "worker/no_such_train.py"  # valid as a spec, not on this host
    return doc


def test_a_launch_the_launcher_refuses_ends_the_run_failed_with_its_message(shared: RunningStack) -> None:
    from trainyard.plugins.state.jobs import JobStateStore

    shared.add_jobs({JOB: _spec()})
    first = shared.client.trigger(JOB, {"max_steps": 5})["dag_run_id"]
    (attempt,) = follow_training_run(shared.client, JOB, first, timeout_s=300)
    assert (attempt.state, attempt.outcome, attempt.action) == ("failed", "launch_failed", "give_up"), shared.logs()
    assert "no_such_train.py" in attempt.reason and "the launch failed" in attempt.reason, attempt.reason
    tasks = shared.client.task_instances(JOB, first)
    assert tasks["launch_training"]["state"] == "failed" and tasks["launch_training"]["try_number"] == 1  # fatal
    assert tasks["give_up"]["state"] == "failed"
    info = JobStateStore(shared.settings.state_db).get_run(JOB, attempt.run)
    assert info.state == "failed" and "no_such_train.py" in info.final_reason, info
    note = shared.client.dag_run(JOB, first).get("note") or ""
    assert note.startswith("attempt 0: launch_failed") and "gave up" in note, note
