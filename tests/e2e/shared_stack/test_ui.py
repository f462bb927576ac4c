"""The Trainyard view as a person meets it: in Debian's Chromium, inside the real Airflow UI of
the shared stack, after one short training run of the demo job.

The DAG run's "Trainyard" tab (Airflow's external view, an iframe onto the plugin's app in
the api-server) shows the plan, the placement map, the checkpoints and the recovery timeline
of the training run; the DAG's tab and the navigation entry list it. Screenshots are kept
(`tests.support.browser.screenshots`: `.trainyard/screenshots/` or `$CI_ARTIFACTS`).
"""

from __future__ import annotations

import json
import urllib.request
from urllib.parse import quote

import pytest

from tests.e2e.airflow_stack import DAG_ID, RunningStack
from tests.support.browser import chromium_page, screenshots

pytestmark = pytest.mark.slow

STEPS = 4
"""A few steps: the run ends with its final checkpoint (the demo saves every 50 and at the end)."""
SECTIONS = ("Progress", "Plan", "Placement", "Checkpoints", "Recovery timeline")


def test_the_trainyard_tab_of_a_finished_run_shows_plan_placement_checkpoints_and_timeline(
        shared: RunningStack) -> None:
    (attempt,) = shared.train({"max_steps": STEPS}, timeout_s=600)
    assert (attempt.state, attempt.outcome) == ("success", "completed"), shared.logs()
    url = shared.stack.url
    with urllib.request.urlopen(f"{url}/api/v2/plugins") as answer:  # the Plugins page's source
        plugins = {p["name"]: p for p in json.load(answer)["plugins"]}
    assert {v["destination"] for v in plugins["trainyard"]["external_views"]} == {"nav", "dag", "dag_run"}
    with chromium_page() as page:
        page.goto(f"{url}/dags/{DAG_ID}/runs/{quote(attempt.dag_run_id, safe='')}/plugin/trainyard-run",
                  wait_until="networkidle")
        view = page.frame_locator('iframe[title="Trainyard"]')
        for name in SECTIONS:
            view.get_by_role("heading", name=name, exact=True).wait_for()
        page.screenshot(path=str(screenshots() / "trainyard-run-tab.png"), full_page=True)
        assert view.locator("h1").inner_text().startswith(f"{DAG_ID} · run {attempt.run}")
        assert "TP 1 · PP 1 · DP 2" in view.locator("#plan").inner_text()  # the demo's plan: 2 ranks, DP
        assert sorted(view.locator("#placement [data-rank]").evaluate_all(
            "cells => cells.map(c => Number(c.dataset.rank))")) == [0, 1]
        final = view.locator("#checkpoints tbody tr").first
        assert final.locator("td").first.inner_text() == str(STEPS)
        assert "a resume takes this one" in final.inner_text()
        timeline = view.locator("#recovery tbody tr")
        assert timeline.count() == 1 and f"completed at step {STEPS}" in timeline.inner_text()
        mlflow = view.locator("a[href*='#/experiments/']")
        assert mlflow.get_attribute("target") == "_blank" and "workflowType=machine_learning" in (
            mlflow.get_attribute("href") or "")  # MLflow forbids framing: a tab of its own
        dag_run = view.locator("#recovery a")
        assert dag_run.get_attribute("target") == "_top"
        dag_run.click()  # Airflow's own page replaces the tab, not the frame (no Airflow inside Airflow)
        page.wait_for_url(lambda url: "/plugin/" not in url)
        assert f"/dags/{DAG_ID}/runs/" in page.url

        page.goto(f"{url}/trainyard/jobs/{DAG_ID}/runs/{attempt.run}", wait_until="networkidle")
        page.get_by_role("heading", name="Recovery timeline", exact=True).wait_for()
        page.screenshot(path=str(screenshots() / "trainyard-run-page.png"), full_page=True)

        page.goto(f"{url}/dags/{DAG_ID}/plugin/trainyard-dag", wait_until="networkidle")
        runs = page.frame_locator('iframe[title="Trainyard"]')
        runs.get_by_role("link", name=attempt.run).wait_for()
        page.screenshot(path=str(screenshots() / "trainyard-dag-tab.png"), full_page=True)
    _mlflow_holds_a_model_training_run(shared, attempt.run)


def _mlflow_holds_a_model_training_run(s: RunningStack, run: str) -> None:
    """The run's MLflow experiment opens as a model-training one; its final checkpoint is a
    LoggedModel of the run."""
    from trainyard.plugins.tracking.runs import checkpoints, client_for

    client = client_for(s.settings.mlflow_tracking_uri)
    exp = client.get_experiment_by_name("demo/tiny-lm")
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development"
    (found,) = client.search_runs([exp.experiment_id], filter_string=f"tags.`trainyard.run` = '{run}'")
    assert [c.step for c in checkpoints(found.info.run_id, tracking_uri=s.settings.mlflow_tracking_uri)] == [STEPS]
    assert STEPS in {o.step for o in found.outputs.model_outputs}
    note = found.data.tags["mlflow.note.content"]  # the description: outcome and the links back
    assert note.startswith("**completed and registered — ") and f"/trainyard/jobs/{DAG_ID}/runs/{run})" in note, note
    assert found.data.tags.get("mlflow.runColor")
