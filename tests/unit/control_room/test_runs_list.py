"""The "Training runs" list (issue 57): filters by team, job and state; steps, final loss,
duration and cost columns read from the same stores as the run page; job names link to their
runs; the outcome column is the one line every surface shows."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.unit.control_room.recorded import JOB, RUN, Recorded
from trainyard.plugins.control_room.app import create_app
from trainyard.plugins.recovery.outcome import outcome_line
from trainyard.plugins.tracking.ui_links import URL_PREFIX

OTHER_JOB, OTHER_RUN = "other-job", "20261201t000000-0the12"


@pytest.fixture(scope="module")
def client(recorded: Recorded) -> TestClient:
    store = recorded.store
    store.open_run(OTHER_JOB, trigger_key="other/1", team="vision", project="p", run=OTHER_RUN)
    store.transition(OTHER_JOB, OTHER_RUN, "failed", reason="registration failed: ValueError: no weights")
    parent = FastAPI()
    parent.mount(URL_PREFIX, create_app(settings=lambda: recorded.settings))
    return TestClient(parent)


def runs_in(html: str) -> list[str]:
    return re.findall(r'href="/trainyard/jobs/[^/]+/runs/([^"]+)"', html)


def cells(html: str, run: str) -> list[str]:
    row = re.search(rf"<tr><td>(?:(?!</tr>).)*runs/{run}\".*?</tr>", html)
    assert row is not None, run
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(0))]


def test_each_run_shows_steps_final_loss_duration_cost_and_its_outcome(client: TestClient,
                                                                         recorded: Recorded) -> None:
    from mlflow import MlflowClient

    mlflow = MlflowClient(recorded.settings.mlflow_tracking_uri)
    history = mlflow.get_metric_history(recorded.mlflow_run_id, "loss")
    info = recorded.store.get_run(JOB, RUN)
    page = client.get(f"{URL_PREFIX}/")
    assert page.status_code == 200
    job, run, team, state, outcome, attempts, steps, loss, duration, cost, *_ = cells(page.text, RUN)
    assert (job, run, team, state, attempts) == (JOB, RUN, "demo", "completed", "2")
    assert outcome == outcome_line(info.state, info.final_reason).replace("'", "&#x27;")
    assert outcome.startswith("completed and registered — registered")
    assert steps == str(max(p.step for p in history))
    assert loss == f"{mlflow.get_run(recorded.mlflow_run_id).data.metrics['loss']:.4g}"
    assert duration != "—" and cost == "—"  # the recorded run was never costed
    other = cells(page.text, OTHER_RUN)
    assert other[3:5] == ["failed", "failed — registration failed: ValueError: no weights"]
    assert other[6:8] == ["—", "—"]  # no MLflow run: nothing made up


def test_job_names_link_to_their_runs(client: TestClient) -> None:
    page = client.get(f"{URL_PREFIX}/").text
    assert f'<a href="{URL_PREFIX}/dags/{JOB}">{JOB}</a>' in page
    assert runs_in(client.get(f"{URL_PREFIX}/dags/{JOB}").text) == [RUN]


@pytest.mark.parametrize(("query", "shown"), [
    ("", {RUN, OTHER_RUN}),
    ("?team=demo", {RUN}),
    ("?team=vision", {OTHER_RUN}),
    (f"?job={OTHER_JOB}", {OTHER_RUN}),
    ("?state=failed", {OTHER_RUN}),
    ("?state=completed&team=demo", {RUN}),
    ("?state=running", set()),
])
def test_the_list_filters_by_team_job_and_state(client: TestClient, query: str, shown: set[str]) -> None:
    page = client.get(f"{URL_PREFIX}/{query}")
    assert page.status_code == 200
    assert set(runs_in(page.text)) == shown
    assert '<form id=\'filter\' method=\'get\'' in page.text
    if not shown:
        assert "No training run matches." in page.text


def test_the_runs_of_one_job_filter_by_state_and_an_unknown_state_is_refused(client: TestClient) -> None:
    assert runs_in(client.get(f"{URL_PREFIX}/dags/{JOB}?state=failed").text) == []
    bad = client.get(f"{URL_PREFIX}/?state=exploded")
    assert bad.status_code == 400 and "is not one of" in bad.text
