"""Issue 57's "one truth" and "registration that does not surprise", through the DAG on the
shared stack, as a person meets them:

- a smoke run with registration off (the trigger form's `register_model`) completes, registers
  nothing and leaves `candidate` where it was; a short run that does register leaves
  `candidate` too, and its note says which rule held the alias back;
- a run whose registration fails (a `keepBestMetric` no checkpoint records) reads the same on
  every surface: the DAG run red with the outcome as its note, the job state, `trainyard
  status`, `submit --wait`'s exit code, the Trainyard view (seen in Chromium) and the MLflow run
  (FAILED, its `trainyard.outcome` tag).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.e2e.airflow_stack import RunningStack, demo_spec
from trainyard.plugins.airflow_api import AttemptRun, follow_training_run
from trainyard.plugins.recovery.model import REGISTRATION_OFF

pytestmark = pytest.mark.slow

JOB = "registration-rules"
BROKEN = "registration-breaks"
STEPS = 4
"""A smoke run: the spec says 200; the demo saves its final checkpoint at the end."""


def screens() -> Path:
    """Where this folder's UI tests keep their screenshots: `TRAINYARD_SCREENS` (where an issue's
    report names them), else the suite's own screenshots folder."""
    from tests.support.browser import screenshots

    folder = os.environ.get("TRAINYARD_SCREENS")
    if not folder:
        return screenshots()
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)


def train(s: RunningStack, job: str, conf: dict[str, object]) -> AttemptRun:
    from trainyard.plugins.airflow_api import first_attempt

    conf, first_id = first_attempt(conf)  # as `trainyard submit` triggers: attempt 0 is <run>__attempt-0
    s.client.trigger(job, conf, run_id=first_id)
    (attempt,) = follow_training_run(s.client, job, first_id, timeout_s=600)
    assert attempt.dag_run_id == f"{attempt.run}__attempt-0"
    return attempt


def status_of(s: RunningStack, job: str, run: str) -> str:
    env = {**os.environ, "TRAINYARD_HOME": str(s.settings.home), "TRAINYARD_STATE_DB": s.settings.state_db,
           "COLUMNS": "200"}
    done = subprocess.run([str(Path(sys.executable).parent / "trainyard"), "status", job, "--run", run],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_registration_off_and_a_smoke_run_leave_candidate_alone(shared: RunningStack) -> None:
    from trainyard.plugins.state.jobs import JobStateStore
    from trainyard.plugins.tracking.runs import client_for

    shared.add_jobs({JOB: demo_spec(JOB)})
    mlflow = client_for(shared.settings.mlflow_tracking_uri)
    from tests.support.browser import chromium_page

    with chromium_page() as page:  # the form's switch shows the spec's setting (on), not a blank "off"
        page.goto(f"{shared.stack.url}/dags/{JOB}", wait_until="networkidle")
        page.get_by_role("button", name="Trigger").first.click()
        form = page.get_by_role("dialog")
        form.wait_for()
        form.get_by_text("Register the model").first.scroll_into_view_if_needed()
        assert form.get_by_role("checkbox", name="Register the model").is_checked()
        page.screenshot(path=str(screens() / "trigger-form-register-model.png"), full_page=True)

    off = train(shared, JOB, {"max_steps": STEPS, "register_model": False})
    assert (off.state, off.action) == ("success", "finish"), shared.logs()
    assert off.tasks["register_model"] == "skipped"
    note = shared.client.dag_run(JOB, off.dag_run_id).get("note") or ""
    assert note == f"attempt 0: completed at step {STEPS} → {REGISTRATION_OFF} (the trigger's register_model Param)", \
        note
    assert mlflow.search_model_versions(f"name = '{JOB}'") == []

    smoke = train(shared, JOB, {"max_steps": STEPS})
    assert (smoke.state, smoke.action) == ("success", "register"), shared.logs()
    (version,) = mlflow.search_model_versions(f"name = '{JOB}'")
    assert mlflow.get_registered_model(JOB).aliases == {}  # a 4-step run does not take candidate
    why = f"candidate not moved: the run reached step {STEPS} of the spec's maxSteps 200"
    note = shared.client.dag_run(JOB, smoke.dag_run_id).get("note") or ""
    assert note == f"attempt 0: completed and registered — registered {JOB} version {version.version} " \
                   f"from step {STEPS}; {why}", note
    info = JobStateStore(shared.settings.state_db).get_run(JOB, smoke.run)
    assert info.state == "completed" and why in info.final_reason
    assert why in status_of(shared, JOB, smoke.run)


def test_a_registration_that_fails_fails_the_run_on_every_surface(shared: RunningStack) -> None:
    from trainyard.cli.submit import run_outcome
    from trainyard.plugins.state.jobs import JobStateStore
    from trainyard.plugins.tracking.runs import client_for

    spec = demo_spec(BROKEN)
    spec["spec"]["checkpoint"]["keepBestMetric"] = "eval_loss_nobody_logs"  # a real mistake: nothing to select
    shared.add_jobs({BROKEN: spec})
    attempt = train(shared, BROKEN, {"max_steps": STEPS})
    assert (attempt.state, attempt.action) == ("failed", "register"), shared.logs()
    assert attempt.tasks["register_model"] == "failed"

    from trainyard.plugins.recovery.outcome import outcome_line

    info = JobStateStore(shared.settings.state_db).get_run(BROKEN, attempt.run)
    line = outcome_line(info.state, info.final_reason)  # the job state's; every surface must say it
    assert line.startswith("failed — registration failed: LookupError: no checkpoint of run "
                           f"{info.mlflow_run_id} recorded metric 'eval_loss_nobody_logs'"), line
    note = shared.client.dag_run(BROKEN, attempt.dag_run_id).get("note") or ""
    assert note == f"attempt 0: {line}", note
    outcome = run_outcome(shared.settings, BROKEN, attempt.run)  # what `submit --wait` exits with
    assert outcome is not None and (outcome.line, outcome.exit_code) == (line, 1)
    assert f"outcome: {line}" in status_of(shared, BROKEN, attempt.run)
    run = client_for(shared.settings.mlflow_tracking_uri).get_run(info.mlflow_run_id)
    assert (run.info.status, run.data.tags.get("trainyard.outcome")) == ("FAILED", line)
    assert client_for(shared.settings.mlflow_tracking_uri).search_model_versions(f"name = '{BROKEN}'") == []

    from tests.support.browser import chromium_page

    with chromium_page() as browser:  # the Trainyard tab of the DAG run says the same
        browser.goto(f"{shared.stack.url}/dags/{BROKEN}/runs/{quote(attempt.dag_run_id, safe='')}"
                     "/plugin/trainyard-run", wait_until="networkidle")
        tab = browser.frame_locator('iframe[title="Trainyard"]')
        assert tab.locator("#outcome").inner_text() == line
        browser.screenshot(path=str(screens() / "registration-failed-run-tab.png"), full_page=True)
        browser.goto(f"{shared.stack.url}/trainyard/?state=failed", wait_until="networkidle")
        browser.get_by_role("link", name=attempt.run).wait_for()
        browser.screenshot(path=str(screens() / "runs-list-failed.png"), full_page=True)
