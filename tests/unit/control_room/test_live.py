"""The live part of the view over HTTP: a run that has not ended polls `live.json` (each rank's
state and last log lines, read back by the real `LocalLauncher` from a fabricated run folder)
and carries the Stop button; an ended one does neither. The Stop endpoint takes only a POST
from this origin that the edit check lets through (the stop itself, of real processes, is the
shared stack's test: `tests/e2e/shared_stack/test_live_stop.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient

from tests.unit.control_room.recorded import JOB, RUN, Recorded, record_run
from tests.unit.recovery.runs import Rank, fabricate
from trainyard.plugins.control_room.app import create_app
from trainyard.plugins.tracking.ui_links import URL_PREFIX

LIVE = "20260502t090000-live01"
SAME_ORIGIN = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}


def _client(settings: object, **kwargs: object) -> TestClient:
    parent = FastAPI()
    parent.mount(URL_PREFIX, create_app(settings=lambda: settings, **kwargs))  # type: ignore[arg-type]
    return TestClient(parent)


@pytest.fixture
def live_run(tmp_path: Path) -> Recorded:
    """The recorded run ended; a second run of the job trains now: two ranks alive (this test's
    own process stands in for them — so nothing here may stop them), each with its log."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()
    rec = record_run(tmp_path / "home", uri)
    rec.store.transition(JOB, RUN, "completed")
    rec.store.open_run(JOB, trigger_key=f"{JOB}/manual__live", run=LIVE)
    handle = fabricate(tmp_path / "runs", [Rank(exit_code=None, step=42, log="step 41 loss 1.61\nstep 42 loss 1.58\n"),
                                           Rank(exit_code=None, step=41, log="step 41 loss 1.61\n")],
                       job=JOB, alive_hung=True)
    rec.store.start_attempt(JOB, LIVE, 0, dag_run_id=f"{JOB}/manual__live", handle=handle.model_copy(update={"run": LIVE}))
    return rec


def test_a_live_run_polls_its_ranks_and_offers_stop_until_it_ends(live_run: Recorded) -> None:
    client = _client(live_run.settings)
    update = client.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{LIVE}/live.json").json()
    assert (update["final"], update["attempt"]) == (False, 0)
    ranks = {r["rank"]: r for r in update["ranks"]}
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["log_tail"][-1] == "step 42 loss 1.58" and ranks[1]["log_tail"][-1] == "step 41 loss 1.61"
    assert {r["state"] for r in ranks.values()} == {"hung"}  # alive, its last beat older than the hang timeout
    assert (ranks[0]["step"], ranks[0]["node"]) == (42, "local-0")
    assert update["live"]["step"] == 41 and update["live"]["loss_curve"] == []  # the poll reads no history

    page = client.get(f"{URL_PREFIX}/dags/{JOB}/runs/manual__live").text
    assert 'id="stop-button"' in page and '<dialog id="stop-dialog">' in page
    assert f'"live": "{URL_PREFIX}/jobs/{JOB}/runs/{LIVE}/live.json"' in page
    assert f'"stop": "{URL_PREFIX}/jobs/{JOB}/runs/{LIVE}/stop"' in page
    assert 'http-equiv="refresh"' not in page  # the figures change in place, the page is not reloaded
    assert "step 42 loss 1.58" in page  # the ranks' table is there before the first poll, too

    live_run.store.transition(JOB, LIVE, "cancelled", reason="stopped on request (a test)")
    update = client.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{LIVE}/live.json").json()
    assert update["final"] is True and update["state"] == "cancelled"
    page = client.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{LIVE}").text
    assert 'id="stop-button"' not in page and "live.json" not in page  # an ended run neither polls nor stops


def test_stop_takes_only_a_same_origin_post(recorded: Recorded) -> None:
    client = _client(recorded.settings)
    stop = f"{URL_PREFIX}/jobs/{JOB}/runs/{RUN}/stop"
    assert client.get(stop).status_code == 405
    forged = client.post(stop, headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert forged.status_code == 403 and "cross-site" in forged.json()["detail"]
    assert client.post(stop, headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.post(stop).status_code == 403  # no Origin: not a page of this site
    ok = client.post(stop, headers=SAME_ORIGIN)  # the recorded run has ended: nothing to stop
    assert ok.status_code == 200 and ok.json()["message"].startswith(f"run {RUN} had already ended")
    assert client.post(f"{URL_PREFIX}/jobs/{JOB}/runs/no-such-run/stop", headers=SAME_ORIGIN).status_code == 404


def test_stop_runs_the_edit_check_first(recorded: Recorded) -> None:
    seen: list[str] = []

    def refuse() -> None:
        seen.append("asked")
        raise HTTPException(status_code=403, detail="may not edit this DAG's runs")

    client = _client(recorded.settings, authorize_stop=refuse)
    answer = client.post(f"{URL_PREFIX}/jobs/{JOB}/runs/{RUN}/stop", headers=SAME_ORIGIN)
    assert (answer.status_code, answer.json()["detail"], seen) == (403, "may not edit this DAG's runs", ["asked"])
    assert client.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{RUN}").status_code == 200  # reading is not editing


QUEUED = "Job phase Pending: Job suspended; not started: Kueue: pending: couldn't assign flavors to pod set main: " \
         "insufficient unused quota for cpu in flavor trainyard-accelerators, 1 more needed"


class QueuedLauncher:
    """A launcher whose gang waits in its cluster's queue (what `KubernetesLauncher.poll` says of
    a Job Kueue has not admitted), registered as a site would (`TRAINYARD_LAUNCHERS`)."""

    def poll(self, handle: object) -> object:
        from trainyard.plugins.run.model import RunStatus

        return RunStatus(state="pending", message=QUEUED, processes_alive=True)

    @classmethod
    def attach(cls, handle: object, settings: object, runtime: object) -> QueuedLauncher:
        return cls()


def test_a_gang_waiting_in_its_queue_says_why_on_the_page_and_in_the_live_poll(live_run: Recorded) -> None:
    from trainyard.plugins.run.model import RunHandle

    settings = live_run.settings.model_copy(update={"launchers": {"queued": f"{__name__}:QueuedLauncher"}})
    waiting = RunHandle(kind="queued", job=JOB, run=LIVE, attempt=1, world_size=2)
    live_run.store.start_attempt(JOB, LIVE, 1, dag_run_id=f"{JOB}/manual__live-1", handle=waiting)
    client = _client(settings)
    update = client.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{LIVE}/live.json").json()
    assert update["attempt"] == 1 and update["waiting"] == QUEUED and update["ranks"] == []
    page = client.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{LIVE}").text
    assert "waiting: Job phase Pending: Job suspended; not started: Kueue: pending: couldn&#x27;t assign flavors" in page
    assert 'put("waiting"' in page  # and the poll keeps it current


class ClientsLauncher:
    """A site's launcher that says which Kubernetes clients the view handed it (`Runtime.kube_clients`)."""

    def __init__(self, clients: str) -> None:
        self.clients = clients

    def poll(self, handle: object) -> object:
        from trainyard.plugins.run.model import RunStatus

        return RunStatus(state="pending", message=f"asked through {self.clients}", processes_alive=True)

    @classmethod
    def attach(cls, handle: object, settings: object, runtime: object) -> ClientsLauncher:
        clients = runtime.kube_clients  # type: ignore[attr-defined]
        return cls(clients() if clients is not None else "the kubeconfig")


def test_the_view_asks_the_launcher_through_the_clients_it_was_given(live_run: Recorded) -> None:
    """Inside Airflow's api-server there is no kubeconfig: the plugin gives the app Airflow's
    connection (`kubernetes_clients`), and the live poll and the page must use it, as tasks do."""
    from trainyard.plugins.run.model import RunHandle

    settings = live_run.settings.model_copy(update={"launchers": {"site": f"{__name__}:ClientsLauncher"}})
    live_run.store.start_attempt(JOB, LIVE, 1, dag_run_id=f"{JOB}/manual__live-1",
                                 handle=RunHandle(kind="site", job=JOB, run=LIVE, attempt=1, world_size=2))
    given = _client(settings, kube_clients=lambda: "Airflow's connection")
    assert given.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{LIVE}/live.json").json()["waiting"] == \
        "asked through Airflow's connection"
    assert "asked through Airflow&#x27;s connection" in given.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{LIVE}").text
    default = _client(settings)
    assert default.get(f"{URL_PREFIX}/jobs/{JOB}/runs/{LIVE}/live.json").json()["waiting"] == \
        "asked through the kubeconfig"


def test_the_airflow_plugin_gives_the_view_airflows_kubernetes_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from trainyard.operators.kubernetes_clients import kubernetes_clients
    from trainyard.plugins import trainyard_plugin
    from trainyard.plugins.control_room import app as control_room_app

    given: dict[str, object] = {}

    def create_app(**kwargs: object) -> object:
        given.update(kwargs)

        async def asgi(scope: object, receive: object, send: object) -> None:
            return None
        return asgi

    monkeypatch.setattr(control_room_app, "create_app", create_app)
    monkeypatch.setattr(trainyard_plugin, "_authorize", lambda: None)
    monkeypatch.setattr(trainyard_plugin, "_authorize_stop", lambda: None)
    monkeypatch.setattr(trainyard_plugin, "_user_name", lambda: None)
    asyncio.run(trainyard_plugin._LazyApp()({}, None, None))
    assert given["kube_clients"] is kubernetes_clients
