"""The REST client's trigger is exactly-once: a server error after the run was created (the
embedded SQLite metadata busy under load) is retried with the same run id and returns that run,
never a second one. The server here plays Airflow's `POST /dagRuns` contract (409 for an id that
exists); the end-to-end tests drive the same client against a real Airflow."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support.procs import free_port
from trainyard.plugins.airflow_api import AirflowClient, AirflowRequestFailed, AirflowUnavailable


class FlakyAirflow:
    """Stores the DAG runs it is sent; the first `fail_after_create` POSTs create the run and
    then answer 500, as Airflow does when its commit outlives the database's lock timeout."""

    def __init__(self, fail_after_create: int) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.posts = 0
        self.fail_after_create = fail_after_create
        self.busy_gets = 0
        """The next this many GETs answer 500 (the metadata database locked)."""
        self.gets = 0

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.posts += 1
                run_id = body["dag_run_id"]
                if run_id in fake.runs:
                    self._answer(409, {"detail": f"DAG run {run_id} already exists"})
                    return
                fake.runs[run_id] = {"dag_run_id": run_id, "conf": body["conf"], "state": "queued"}
                if fake.posts <= fake.fail_after_create:
                    self._answer(500, {"reason": "Database error"})
                    return
                self._answer(200, fake.runs[run_id])

            def do_GET(self) -> None:
                fake.gets += 1
                if fake.busy_gets > 0:
                    fake.busy_gets -= 1
                    self._answer(500, {"detail": "database is locked"})
                    return
                run_id = self.path.rsplit("/", 1)[-1]
                from urllib.parse import unquote

                run = fake.runs.get(unquote(run_id))
                self._answer(200 if run else 404, run or {"detail": "not found"})

        return Handler


@pytest.fixture
def flaky() -> Iterator[tuple[FlakyAirflow, AirflowClient]]:
    fake = FlakyAirflow(fail_after_create=1)
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), fake.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, AirflowClient(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()


def test_a_trigger_that_landed_before_a_server_error_is_one_run(flaky: tuple[FlakyAirflow, AirflowClient]) -> None:
    fake, client = flaky
    run = client.trigger("job", {"max_steps": 5})
    assert fake.posts == 2 and len(fake.runs) == 1  # sent twice, one run
    assert run["dag_run_id"] in fake.runs and run["conf"] == {"max_steps": 5}
    assert run["dag_run_id"].startswith("manual__")


def test_a_run_id_taken_by_someone_else_is_an_error_not_a_silent_attach(
        flaky: tuple[FlakyAirflow, AirflowClient]) -> None:
    fake, client = flaky
    fake.fail_after_create = 0
    client.trigger("job", {"max_steps": 5}, run_id="mine")
    with pytest.raises(AirflowRequestFailed, match="already exists") as e:
        client.trigger("job", {"max_steps": 7}, run_id="mine")
    assert e.value.status == 409


def test_a_long_busy_spell_is_waited_out_within_the_patience(flaky: tuple[FlakyAirflow, AirflowClient]) -> None:
    """More server errors in a row than a handful of attempts (CI saw the embedded metadata
    locked for two minutes): a read keeps asking until its patience is spent, then raises."""
    fake, client = flaky
    fake.fail_after_create = 0
    client.trigger("job", {}, run_id="r")
    patient = dataclasses.replace(client, retry_wait_s=0.001)
    fake.busy_gets, fake.gets = 9, 0
    assert patient.dag_run("job", "r")["dag_run_id"] == "r"
    assert fake.gets == 10
    impatient = dataclasses.replace(patient, patience_s=0.0)
    fake.busy_gets, fake.gets = 9, 0
    with pytest.raises(AirflowRequestFailed) as e:
        impatient.dag_run("job", "r")
    assert e.value.status == 500 and fake.gets == 1


def test_nothing_listening_fails_at_once() -> None:
    client = AirflowClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(AirflowUnavailable, match="make airflow"):
        client.trigger("job", {})
