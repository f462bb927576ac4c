"""MLflow's UI as a person meets a Trainyard run in it, in Debian's Chromium against a real
`mlflow server` (3.17): the experiment opens on its model-training pages (no GenAI traces, token
usage or "Detect issues"), the run page's Model metrics tab holds the training's curves with
`loss` first and none of the platform's series or cost figures (`series_key` files those under
System metrics), and the description links back to Airflow and the Trainyard view. Screenshots
are kept (`tests.support.browser.screenshots`)."""

from __future__ import annotations

import pytest

from tests.integration.tracking.mlflow_servers import MlflowServer
from tests.support.browser import chromium_page, screenshots
from tests.unit.tracking.factories import make_job, make_plan

pytestmark = pytest.mark.slow

AIRFLOW = "http://127.0.0.1:8080"


def _a_trained_run(uri: str, trigger: str, offset: float) -> str:
    """A run as a short training leaves it: the worker's series, a checkpoint, a description."""
    from trainyard.plugins.recovery.outcome import outcome_line
    from trainyard.plugins.tracking import runs
    from trainyard.plugins.tracking.description import (
        RunLinks,
        run_description,
        set_run_description,
    )
    from trainyard.plugins.tracking.metrics import replay_key

    rid = runs.start_or_resume_run(make_job("tiny-lm"), make_plan(), tracking_uri=uri, attempt=0, trigger_id=trigger)
    client = runs.client_for(uri)
    for step in range(1, 9):
        runs.log_metrics(client, rid, {"loss": 4.0 - 0.2 * step - offset, "lr": 1e-3, "grad_norm": 1.0,
                                       "tokens_per_s": 5000.0 + step, "data/cache_hit_rate": 1.0,
                                       "data_stall_s": 0.01}, step=step)
    runs.log_metrics(client, rid, {"idle_pct": 2.0, "total_cost_usd": 0.5}, step=0)  # what a closed run's cost logs
    for step in range(5, 9):  # a resumed attempt's recomputed steps (`MetricsStreamer`'s replay marking)
        runs.log_metrics(client, rid, {replay_key("loss"): 4.0 - 0.2 * step - offset}, step=step)
    runs.log_checkpoint(rid, f"file:///ckpt/{trigger}/step-00000008/MANIFEST.json", "a" * 64, 8, {"loss": 2.4},
                        tracking_uri=uri)
    links = RunLinks(dag_runs=[(f"attempt 0: DAG run {trigger}__attempt-0",
                                f"{AIRFLOW}/dags/tiny-lm/runs/{trigger}__attempt-0")],
                     view_url=f"{AIRFLOW}/trainyard/jobs/tiny-lm/runs/{trigger}")
    set_run_description(rid, run_description(job="tiny-lm", run=trigger, outcome=outcome_line("completed", "registered tiny-lm version 1 from step 8"),
                                             links=links), tracking_uri=uri)
    return rid


def test_the_run_page_opens_on_model_training_with_loss_up_front_and_links_back(mlflow_server: MlflowServer) -> None:
    from trainyard.plugins.tracking.runs import RUN_COLOR_TAG, client_for
    from trainyard.plugins.tracking.ui_links import experiment_url, mlflow_run_url

    uri = mlflow_server.uri
    first, second = _a_trained_run(uri, "r1", 0.0), _a_trained_run(uri, "r2", 0.3)
    client = client_for(uri)
    experiment = client.get_run(first).info.experiment_id
    assert client.get_run(first).data.tags[RUN_COLOR_TAG] != client.get_run(second).data.tags[RUN_COLOR_TAG]
    with chromium_page() as page:
        page.goto(mlflow_run_url(uri, experiment, first, tab="model-metrics"))
        charts = page.locator("h4[title]")
        charts.filter(has_text="tokens_per_s").wait_for()
        page.wait_for_timeout(2000)  # the charts draw their lines
        page.screenshot(path=str(screenshots() / "mlflow-run-model-metrics.png"), full_page=True)
        titles = charts.evaluate_all("hs => hs.map(h => h.title)")
        # MLflow sorts a section's charts by key: `loss` first (`metrics.RENAMED`), no prefixed section
        assert titles == ["loss", "loss.replay", "lr", "tokens_per_s", "total_grad_norm"], titles

        assert {"system/data_stall_s", "system/data.cache_hit_rate", "system/checkpoint.step", "system/idle_pct"} <= set(
            client.get_run(first).data.metrics)  # the platform's series: on the System metrics tab
        page.goto(mlflow_run_url(uri, experiment, first, tab="system-metrics"))
        page.wait_for_timeout(3000)
        page.screenshot(path=str(screenshots() / "mlflow-run-system-metrics.png"), full_page=True)

        page.goto(mlflow_run_url(uri, experiment, first))
        description = page.get_by_role("link", name="tiny-lm run r1")
        description.wait_for()
        assert description.get_attribute("href") == f"{AIRFLOW}/trainyard/jobs/tiny-lm/runs/r1"
        assert page.get_by_role("link", name="attempt 0: DAG run r1__attempt-0").get_attribute("href") == \
            f"{AIRFLOW}/dags/tiny-lm/runs/r1__attempt-0"
        page.screenshot(path=str(screenshots() / "mlflow-run-overview.png"), full_page=True)

        page.goto(experiment_url(uri, experiment))
        page.get_by_role("link", name="tiny-lm r2").wait_for()
        page.screenshot(path=str(screenshots() / "mlflow-experiment-runs.png"), full_page=True)
        text = page.locator("body").inner_text()
        assert "Detect" not in text and "Token" not in text, text[:2000]  # not the GenAI overview

        # the two runs compared in charts: `loss` first, its replay beside it, the platform's below
        page.goto(f"{uri}/#/experiments/{experiment}/runs?compareRunsMode=CHART&workflowType=machine_learning")
        compared = page.locator("h4[title]")
        compared.first.wait_for()
        page.wait_for_timeout(2000)
        page.screenshot(path=str(screenshots() / "mlflow-experiment-charts.png"), full_page=True)
        titles = compared.evaluate_all("hs => hs.map(h => h.title)")
        assert titles[:2] == ["loss", "loss.replay"], titles
        assert not any(t.startswith("system/") for t in titles[:4]), titles


def test_a_fresh_browser_at_the_root_opens_model_training_and_keeps_a_choice_of_its_own(
        mlflow_server: MlflowServer) -> None:
    """Someone types the server's address into a browser that never opened MLflow: the app the
    product runs (`mlflow server --app-name trainyard`) opens on Model training, its AI assistant's
    panel closed, and an experiment opens on its runs; a browser that switched to GenAI stays there."""
    from trainyard.plugins.tracking.runs import client_for

    uri = mlflow_server.uri
    experiment = client_for(uri).get_run(_a_trained_run(uri, "fresh", 0.0)).info.experiment_id
    with chromium_page() as page:
        page.goto(uri + "/")
        nav = page.locator("aside").first
        nav.get_by_text("Model registry").wait_for()  # Model training's navigation (GenAI's: Prompts, AI Gateway)
        page.wait_for_timeout(2000)  # the assistant's panel opened itself within this on a first visit
        page.screenshot(path=str(screenshots() / "mlflow-root-fresh-browser.png"), full_page=True)
        assert "Prompts" not in nav.inner_text(), nav.inner_text()
        assert not page.get_by_text("Ask questions about your").is_visible()  # the assistant's panel is closed

        page.goto(f"{uri}/#/experiments/{experiment}")
        page.get_by_role("link", name="tiny-lm fresh").wait_for()  # the runs table, not GenAI's overview
        assert "Detect" not in page.locator("body").inner_text()

        page.locator("[role=button]", has_text="GenAI").click()  # the UI's own switch
        page.goto(uri + "/")
        nav.get_by_text("Prompts").wait_for()  # the browser's own choice wins over the default
        assert page.evaluate("localStorage.getItem('mlflow.workflowType_v1')") == '"genai"'
