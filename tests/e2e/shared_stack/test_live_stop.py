"""A live run as a person watches and stops it (issue 57, item 4), on the folder's shared stack:

- the Trainyard tab of a live DAG run updates its step on its own, without a reload, and shows
  each rank's state and last log lines; its Stop button (after the in-page confirmation) stops
  the gang, and the run ends `cancelled` — while a cross-site POST to the same endpoint is refused;
- marking a live DAG run failed through the REST API (the UI's "Mark as failed") stops its ranks
  within a poll of the triggerer, and the run ends `cancelled` in the job state, in MLflow and on
  the DAG run's note.

Restarting the scheduler and triggerer must still leave training alone: `test_training.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.e2e.airflow_stack import DAG_ID, RunningStack
from tests.support.browser import chromium_page, screenshots

pytestmark = pytest.mark.slow

LONG = 20_000
"""Steps no test waits for: each run here is stopped."""


def _start(s: RunningStack) -> tuple[str, object]:
    """Trigger a long run; return its DAG run id and handle once its ranks step."""
    from trainyard.plugins.attempt import watching
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.run.model import RunHandle

    dag_run_id = s.client.trigger(DAG_ID, {"max_steps": LONG})["dag_run_id"]
    s.wait_for_task(DAG_ID, dag_run_id, "watch_training", "deferred", timeout_s=400)
    handle = RunHandle.model_validate(s.client.xcom(DAG_ID, dag_run_id, "launch_training"))
    s.until("the ranks to step", lambda: watching.poll(handle, Runtime(s.settings)).step, timeout_s=240, poll_s=0.5)
    return dag_run_id, handle


def _keep(name: str) -> None:
    """A copy of the suite's screenshot where the issue's report names it (`TRAINYARD_SCREENS`)."""
    folder = os.environ.get("TRAINYARD_SCREENS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshots() / name, Path(folder) / name)


def _post(url: str, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(url, method="POST", headers={"Accept": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _mlflow_status(s: RunningStack, mlflow_run_id: str) -> str:
    from trainyard.plugins.tracking.runs import client_for

    return client_for(s.settings.mlflow_tracking_uri).get_run(mlflow_run_id).data.tags.get("trainyard.status", "")


def test_the_view_of_a_live_run_updates_on_its_own_and_its_stop_button_stops_it(shared: RunningStack) -> None:
    from trainyard.plugins.attempt import watching
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.run.records import StopReason

    s = shared
    dag_run_id, handle = _start(s)
    try:
        _view_and_stop(s, dag_run_id, handle)
    finally:  # whatever failed above, the shared stack's next test finds no gang of this one
        watching.stop_gang(handle, StopReason(reason="requested", detail="test cleanup"), Runtime(s.settings),
                           grace_s=5)


def _view_and_stop(s: RunningStack, dag_run_id: str, handle: Any) -> None:
    from trainyard.plugins.airflow_api import follow_training_run
    from trainyard.plugins.attempt import watching
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.state.jobs import JobStateStore

    url = s.stack.url
    stop_url = f"{url}/trainyard/jobs/{DAG_ID}/runs/{handle.run}/stop"
    # a forged request from another site is refused, and the run goes on
    status, answer = _post(stop_url, {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert status == 403 and "cross-site" in answer["detail"], answer
    status, answer = _post(stop_url, {})  # no Origin: not from a browser page of this site
    assert status == 403, answer
    assert JobStateStore(s.settings.state_db).get_run(DAG_ID, handle.run).state == "running"

    with chromium_page() as page:
        page.goto(f"{url}/dags/{DAG_ID}/runs/{quote(dag_run_id, safe='')}/plugin/trainyard-run",
                  wait_until="networkidle")
        view = page.frame_locator('iframe[title="Trainyard"]')
        step = view.locator('[data-live="step"]')
        step.wait_for()
        view.locator("body").evaluate("body => { window.trainyardMarker = 'not reloaded'; }")
        first = step.inner_text()
        view.locator('#ranks tbody tr[data-rank="1"]').wait_for()
        # the step changes in place: the same document (the marker survives), a newer step
        view.locator('[data-live="step"]').filter(has_not_text=first).wait_for(timeout=120_000)
        assert view.locator("body").evaluate("() => window.trainyardMarker") == "not reloaded"
        assert int(step.inner_text().split(" / ")[0]) > int(first.split(" / ")[0]), (first, step.inner_text())
        assert step.inner_text().endswith(f" / {LONG}")
        ranks = view.locator("#ranks tbody tr")
        assert ranks.count() == 2 and "running" in ranks.first.inner_text()
        view.locator('#ranks tbody tr[data-rank="0"] pre').filter(has_text="step").wait_for(timeout=60_000)
        page.screenshot(path=str(screenshots() / "trainyard-live-run.png"), full_page=True)
        _keep("trainyard-live-run.png")

        view.locator("#stop-button").click()
        view.locator("#stop-dialog").get_by_text("emergency checkpoint").wait_for()
        page.screenshot(path=str(screenshots() / "trainyard-stop-confirm.png"), full_page=True)
        _keep("trainyard-stop-confirm.png")
        view.locator("#stop-confirm").click()
        view.locator("#stop-result").filter(has_text="cancelled").wait_for(timeout=120_000)
        view.locator('[data-live="polled"]').filter(has_text="the run has ended").wait_for(timeout=60_000)
        assert view.locator("h1 .state").inner_text() == "cancelled"
        page.screenshot(path=str(screenshots() / "trainyard-stopped-run.png"), full_page=True)
        _keep("trainyard-stopped-run.png")

    assert watching.poll(handle, Runtime(s.settings)).finished  # the gang is gone
    info = JobStateStore(s.settings.state_db).get_run(DAG_ID, handle.run)
    assert info.state == "cancelled" and "from the Trainyard view" in info.final_reason, info
    assert _mlflow_status(s, info.mlflow_run_id) == "cancelled"
    attempts = follow_training_run(s.client, DAG_ID, dag_run_id, timeout_s=600)
    assert [(a.outcome, a.action) for a in attempts] == [("cancelled", "cancel")], f"{attempts}\n{s.logs()}"
    note = s.client.dag_run(DAG_ID, dag_run_id).get("note") or ""
    assert "cancelled" in note and "from the Trainyard view" in note, note
    from trainyard.plugins.tracking.runs import client_for

    closed = client_for(s.settings.mlflow_tracking_uri).get_run(info.mlflow_run_id)  # `cancelled` closed it
    assert "system/total_cost_usd" in closed.data.metrics and closed.info.status == "KILLED", closed.info


def test_marking_a_live_dag_run_failed_stops_its_ranks_within_a_poll(shared: RunningStack) -> None:
    from trainyard.plugins.attempt import watching
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.run.records import StopReason

    s = shared
    dag_run_id, handle = _start(s)
    try:
        _mark_failed_and_check(s, dag_run_id, handle)
    finally:  # whatever failed above, the shared stack's next test finds no gang of this one
        watching.stop_gang(handle, StopReason(reason="requested", detail="test cleanup"), Runtime(s.settings),
                           grace_s=5)


def _mark_failed_and_check(s: RunningStack, dag_run_id: str, handle: object) -> None:
    from trainyard.plugins.attempt import watching
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.run.exit_codes import PREEMPTED
    from trainyard.plugins.run.records import STOP_REASON_FILE
    from trainyard.plugins.state.jobs import JobStateStore

    s.client.set_state(DAG_ID, dag_run_id, "failed")  # what the UI's "Mark as failed" sends
    # the triggerer cancels the watcher's trigger and calls its on_kill: the gang gets SIGTERM,
    # writes its emergency checkpoint and exits (20 s at most before SIGKILL)
    s.until("the ranks to stop", lambda: watching.poll(handle, Runtime(s.settings)).finished, timeout_s=90)
    status = watching.poll(handle, Runtime(s.settings))
    reason = json.loads(Path(handle.run_dir, STOP_REASON_FILE).read_text())
    assert reason["reason"] == "requested" and "marked failed" in reason["detail"], reason
    assert status.state == "stopped", status
    assert PREEMPTED in {r.exit_code for r in status.ranks}, status  # the emergency checkpoint was written
    info = s.until("the run to be cancelled",
                   lambda: (i := JobStateStore(s.settings.state_db).get_run(DAG_ID, handle.run)).final and i,
                   timeout_s=60)
    assert info.state == "cancelled" and f"its DAG run {dag_run_id} was marked failed in Airflow" in info.final_reason, info
    assert _mlflow_status(s, info.mlflow_run_id) == "cancelled"  # marked before the job state
    note = s.until("the DAG run's note", lambda: s.client.dag_run(DAG_ID, dag_run_id).get("note"), timeout_s=60)
    assert "cancelled" in note and "marked failed" in note, note
    # what the person set stands: the DAG run ends failed once its teardown (release_gang) has run
    ended = s.until("the DAG run to end", lambda: (state := s.client.dag_run(DAG_ID, dag_run_id)["state"])
                    in ("success", "failed") and state, timeout_s=240)
    if ended == "success":  # Airflow's own end of it, before the trigger marked it failed again
        ended = s.until("the DAG run marked failed again",
                        lambda: s.client.dag_run(DAG_ID, dag_run_id)["state"] == "failed" and "failed", timeout_s=60)
    assert ended == "failed"


def test_a_dag_run_marked_failed_while_no_triggerer_is_up_still_stops_its_gang(shared: RunningStack) -> None:
    """The triggerer is down when the person marks the DAG run failed: nobody calls the trigger's
    `on_kill`, and Airflow's API server's listener (`sensors/marked_failed.py`) stops the gang once
    the triggerer has had its time; the run ends `cancelled`, saying why."""
    from trainyard.plugins.attempt import watching
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.run.exit_codes import PREEMPTED
    from trainyard.plugins.run.records import STOP_REASON_FILE, StopReason
    from trainyard.plugins.state.jobs import JobStateStore

    s = shared
    dag_run_id, handle = _start(s)
    s.stack.stop("triggerer")
    try:
        s.client.set_state(DAG_ID, dag_run_id, "failed")
        s.until("the ranks to stop", lambda: watching.poll(handle, Runtime(s.settings)).finished, timeout_s=120)
        reason = json.loads(Path(handle.run_dir, STOP_REASON_FILE).read_text())
        assert reason["reason"] == "requested" and "no triggerer was up" in reason["detail"], reason
        status = watching.poll(handle, Runtime(s.settings))
        assert PREEMPTED in {r.exit_code for r in status.ranks}, status  # the emergency checkpoint was written
        info = s.until("the run to be cancelled",
                       lambda: (i := JobStateStore(s.settings.state_db).get_run(DAG_ID, handle.run)).final and i,
                       timeout_s=60)
        assert info.state == "cancelled" and "marked failed in Airflow" in info.final_reason, info
        assert _mlflow_status(s, info.mlflow_run_id) == "cancelled"
        note = s.until("the DAG run's note", lambda: s.client.dag_run(DAG_ID, dag_run_id).get("note"), timeout_s=60)
        assert "cancelled" in note and "no triggerer was up" in note, note
    finally:  # the shared stack's next test finds its triggerer and no gang of this one
        s.stack.start("triggerer")
        watching.stop_gang(handle, StopReason(reason="requested", detail="test cleanup"), Runtime(s.settings),
                           grace_s=5)
