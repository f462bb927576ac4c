"""The view's pages over HTTP, mounted as Airflow mounts a plugin's app (a Starlette `Mount`
under `/trainyard` of a parent app): the run page has its five parts, links resolve against
the parent's root, the JSON is the view model, unknown runs are 404; and the plugin module
declares views and an app in the shapes Airflow's own response models accept."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.unit.control_room.recorded import FIRST_DAG_RUN, JOB, RUN, Recorded
from trainyard.plugins.control_room.app import create_app
from trainyard.plugins.control_room.build import build_run_view
from trainyard.plugins.tracking.ui_links import URL_PREFIX, view_path, view_url

SECTIONS = ("Progress", "Plan", "Placement", "Checkpoints", "Recovery timeline")


@pytest.fixture(scope="module")
def client(recorded: Recorded) -> TestClient:
    parent = FastAPI()
    parent.mount(URL_PREFIX, create_app(settings=lambda: recorded.settings))
    return TestClient(parent)


def test_the_page_of_a_dag_run_is_its_training_run(client: TestClient) -> None:
    from urllib.parse import quote

    page = client.get(f"{URL_PREFIX}/dags/{JOB}/runs/{quote(FIRST_DAG_RUN, safe='')}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    headings = re.findall(r"<h2 id=\"h-[a-z]+\">([^<]+)</h2>", page.text)
    assert headings == list(SECTIONS)
    assert f"run {RUN}" in page.text and "worker_crash at step 19" in page.text
    assert 'http-equiv="refresh"' not in page.text  # a finished run does not reload itself
    # the attempts' DAG runs are Airflow's own pages: the parent's root, not the plugin's
    assert f'href="/dags/{JOB}/runs/{RUN}__attempt-1"' in page.text
    later = client.get(f"{URL_PREFIX}/dags/{JOB}/runs/{RUN}__attempt-1")
    assert later.status_code == 200 and headings == re.findall(r"<h2 id=\"h-[a-z]+\">([^<]+)</h2>", later.text)


def test_the_json_is_the_view_model(client: TestClient, recorded: Recorded) -> None:
    got = client.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{RUN}/view.json").json()
    want = build_run_view(recorded.store, recorded.store.get_run(JOB, RUN), recorded.settings).model_dump(mode="json")
    for part in ("plan", "placement", "checkpoints", "attempts", "mlflow_url"):
        assert got[part] == want[part], part


def test_the_runs_lists_link_to_each_run(client: TestClient) -> None:
    for path in (f"{URL_PREFIX}/", f"{URL_PREFIX}/dags/{JOB}"):
        page = client.get(path)
        assert page.status_code == 200
        assert f'href="{URL_PREFIX}/jobs/{JOB}/runs/{RUN}"' in page.text
    assert client.get(f"{URL_PREFIX}/dags/no-such-job").status_code == 200  # a DAG with no run yet
    # the link `trainyard status` prints is the run's page
    assert view_url("http://127.0.0.1:8080/", JOB, RUN) == f"http://127.0.0.1:8080{URL_PREFIX}/jobs/{JOB}/runs/{RUN}"
    page = client.get(view_path(JOB, RUN))
    assert page.status_code == 200 and f"run {RUN}" in page.text


def test_an_unknown_run_is_not_found(client: TestClient) -> None:
    assert client.get(f"{URL_PREFIX}/dags/{JOB}/runs/manual__never").status_code == 404
    assert client.get(f"{URL_PREFIX}/jobs/{JOB}/runs/20990101t000000-000000").status_code == 404
    assert client.get(f"{URL_PREFIX}/jobs/{JOB}/runs/20990101t000000-000000/view.json").status_code == 404


def test_authorize_runs_before_every_page(recorded: Recorded) -> None:
    from fastapi import HTTPException

    def refuse() -> None:
        raise HTTPException(status_code=403, detail="no access to this DAG")

    guarded = TestClient(create_app(settings=lambda: recorded.settings, authorize=refuse))
    for path in ("/", f"/dags/{JOB}", f"/jobs/{JOB}/runs/{RUN}", f"/jobs/{JOB}/runs/{RUN}/view.json"):
        assert guarded.get(path).status_code == 403, path


def test_the_plugin_declares_what_airflows_ui_accepts() -> None:
    from airflow.api_fastapi.core_api.datamodels.plugins import (
        ExternalViewResponse,
        FastAPIAppResponse,
    )

    from trainyard.plugins import trainyard_plugin

    plugin = trainyard_plugin.TrainyardPlugin
    views = [ExternalViewResponse.model_validate(v) for v in plugin.external_views]
    assert {v.destination for v in views} == {"nav", "dag", "dag_run"}
    assert len({v.url_route for v in views}) == 3  # Airflow drops a view whose route another one took
    by_dest = {v.destination: v.href for v in views}
    assert by_dest["dag_run"] == "trainyard/dags/{DAG_ID}/runs/{RUN_ID}" and by_dest["dag"] == "trainyard/dags/{DAG_ID}"
    assert all(not v.href.startswith("/") for v in views)  # resolved against the UI's <base href>
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == trainyard_plugin.URL_PREFIX == URL_PREFIX
    FastAPIAppResponse.model_validate({**app, "app": type(app["app"]).__qualname__})
    # the hrefs, with Airflow's placeholders filled, are routes of the app
    routes = {r.path for r in create_app().routes}  # type: ignore[attr-defined]
    assert {"/dags/{dag_id}", "/dags/{dag_id}/runs/{dag_run_id}", "/"} <= routes


def _anchors(html: str) -> list[dict[str, str]]:
    """Every `<a>` of a page, as its attributes."""
    from html.parser import HTMLParser

    found: list[dict[str, str]] = []
    parser = HTMLParser()
    parser.handle_starttag = lambda tag, attrs: found.append(  # type: ignore[method-assign]
        {k: v or "" for k, v in attrs}) if tag == "a" else None
    parser.feed(html)
    return found


def test_links_out_of_the_frame_open_outside_it(client: TestClient) -> None:
    """The page is framed in Airflow's UI: a DAG-run link replaces the whole tab (`_top`, not the
    frame, which would nest Airflow in itself); the MLflow link opens a tab of its own (MLflow
    forbids framing); a link to another page of the view stays in the frame."""
    links = _anchors(client.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{RUN}").text)
    dag_runs = [a for a in links if "/dags/" in a["href"]]
    mlflow = [a for a in links if "#/experiments/" in a["href"]]
    assert len(dag_runs) == 2 and all(a.get("target") == "_top" for a in dag_runs), dag_runs
    assert len(mlflow) == 1 and mlflow[0].get("target") == "_blank" and "noopener" in mlflow[0].get("rel", "")
    listed = [a for a in _anchors(client.get(f"{URL_PREFIX}/dags/{JOB}").text) if "/runs/" in a["href"]]
    assert listed and all("target" not in a for a in listed)
