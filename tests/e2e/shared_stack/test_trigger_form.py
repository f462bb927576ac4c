"""The Trigger form as a person uses it, in Debian's Chromium against the real Airflow UI: it
submits with its defaults, what is typed into it reaches the run, and an attempt that did not
complete shows failed in the runs list, with its note."""

from __future__ import annotations

from typing import Any

from tests.e2e.airflow_stack import DAG_ID, RunningStack
from tests.support.browser import chromium_page, screenshots
from trainyard.plugins.airflow_api import follow_training_run


def _new_run(s: RunningStack, before: set[str], timeout_s: float = 120) -> dict[str, Any]:
    fresh = s.until("the form's Trigger to start a DAG run",
                    lambda: [r for r in s.client.dag_runs(DAG_ID) if r["dag_run_id"] not in before], timeout_s=timeout_s)
    return fresh[0]


def _trigger_from_the_form(s: RunningStack, fill: dict[str, str], shot: str) -> dict[str, Any]:
    before = {r["dag_run_id"] for r in s.client.dag_runs(DAG_ID)}
    with chromium_page() as page:
        page.goto(f"{s.stack.url}/dags/{DAG_ID}", wait_until="networkidle")
        page.get_by_role("button", name="Trigger").first.click()
        form = page.get_by_role("dialog")
        form.wait_for()
        for label, value in fill.items():
            form.get_by_label(label).fill(value)
        submit = form.get_by_role("button", name="Trigger")
        assert submit.is_enabled()  # with the defaults too: no Param is required but blank
        page.screenshot(path=str(screenshots() / shot), full_page=True)
        submit.click()
        return _new_run(s, before)


def test_the_form_submits_its_defaults_and_a_cancelled_attempt_shows_failed_with_its_note(shared: RunningStack) -> None:
    from trainyard.cli.main import main

    dag_run = _trigger_from_the_form(shared, {}, "trigger-form-defaults.png")
    # nothing set but the switch that shows the spec's own registration.enabled (on)
    assert {k: v for k, v in (dag_run.get("conf") or {}).items() if v not in (None, False)} in ({}, {"register_model": True})
    shared.wait_for_task(DAG_ID, dag_run["dag_run_id"], "launch_training", "success", timeout_s=300)
    run = shared.client.xcom(DAG_ID, dag_run["dag_run_id"], "validate_spec")["run"]
    assert main(["stop", DAG_ID, "--run", run, "--grace-s", "20"]) == 0  # a person cancels it
    (attempt,) = follow_training_run(shared.client, DAG_ID, dag_run["dag_run_id"], timeout_s=300)
    assert (attempt.state, attempt.outcome, attempt.action) == ("failed", "cancelled", "cancel"), shared.logs()
    note = shared.client.dag_run(DAG_ID, dag_run["dag_run_id"]).get("note") or ""
    assert note.startswith("attempt 0: cancelled") and "→ cancelled" in note, note
    with chromium_page() as page:
        page.goto(f"{shared.stack.url}/dags/{DAG_ID}/runs", wait_until="networkidle")
        row = page.get_by_role("row").filter(has_text=dag_run["dag_run_id"])
        row.wait_for()
        assert "failed" in row.inner_text().lower()
        page.screenshot(path=str(screenshots() / "runs-list-failed-attempt.png"), full_page=True)


def test_what_is_typed_into_the_form_reaches_the_run(shared: RunningStack) -> None:
    from trainyard.plugins.tracking.runs import client_for

    dag_run = _trigger_from_the_form(shared, {"Max steps": "4"}, "trigger-form-max-steps.png")
    assert dag_run["conf"]["max_steps"] == 4
    (attempt,) = follow_training_run(shared.client, DAG_ID, dag_run["dag_run_id"], timeout_s=300)
    assert (attempt.state, attempt.outcome, attempt.action) == ("success", "completed", "register"), shared.logs()
    mlflow_run_id = shared.client.xcom(DAG_ID, dag_run["dag_run_id"], "launch_training", key="mlflow_run_id")
    history = client_for(shared.settings.mlflow_tracking_uri).get_metric_history(mlflow_run_id, "loss")
    assert {m.step for m in history} == {1, 2, 3, 4}  # trained to the form's max steps, not the spec's 200
