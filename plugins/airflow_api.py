"""A small client of Airflow's REST API v2: what `trainyard submit`, the demo, the operators' DAG-run
notes and the end-to-end tests need (trigger a job's DAG, follow its DAG runs and tasks, write a
note), with errors a person can act on. Plain HTTP, no Airflow import; it sits under plugins/
because the operators use it too, and nothing below the command line may import `cli/`.

The embedded stack answers without a token (local-only simple auth, `config/airflow.py`); a real
deployment takes a bearer token (`TRAINYARD_AIRFLOW_TOKEN`). The standard library, and tenacity
for asking again while Airflow is busy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainyard.config.airflow import DAG_FILE_NAME
from trainyard.plugins.errors import FatalError, TransientError

if TYPE_CHECKING:
    from trainyard.config.settings import Settings

log = logging.getLogger(__name__)

JOB_DAGS_FILE = DAG_FILE_NAME
"""The DAG file (relative to the DAGs folder) that builds one DAG per spec in the jobs folder: the
one a deployment drops in under that name (`trainyard.config.airflow.DAG_FILE`)."""


class AirflowUnavailable(TransientError):
    """Airflow does not answer at the URL: say where it was looked for and how to start it (it may
    be starting: asking again later can help)."""


class AirflowRequestFailed(FatalError):
    """Airflow answered with an error status the client does not ask again for (the body's `detail`
    is in the message)."""

    def __init__(self, method: str, url: str, status: int, detail: str) -> None:
        super().__init__(f"{method} {url}: HTTP {status}: {detail}")
        self.status = status


@dataclass(frozen=True)
class AirflowClient:
    url: str
    token: str = ""
    timeout_s: float = 15.0
    headers: dict[str, str] = field(default_factory=dict)
    patience_s: float = 180.0
    """How long a request Airflow is too busy to answer (a server error, a timed-out answer) is
    tried again. Not a few attempts: the embedded SQLite metadata has been seen locked for two
    minutes on a loaded two-core machine (every write waiting out the 60 s busy timeout twice),
    and a trigger given up after one minute failed a run that would have gone on."""
    retry_wait_s: float = 0.5
    """The first wait between tries; each later one doubles, up to 8 s."""

    @classmethod
    def of(cls, settings: Settings, **kwargs: Any) -> AirflowClient:
        """The client of the Airflow `settings` name (`TRAINYARD_AIRFLOW_URL`, its token)."""
        token = settings.airflow_token.get_secret_value() if settings.airflow_token else ""
        return cls(settings.airflow_url, token=token, **kwargs)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              query: dict[str, Any] | None = None) -> Any:
        """One request. A read that gets a server error (the embedded SQLite metadata busy under
        load answers 500) or loses its answer is tried again a few times; a write is sent once
        (`trigger` makes its own POST safe to repeat)."""
        if method != "GET":
            return self._request(method, path, body, query)
        for attempt in self._retrying():
            with attempt:
                return self._request(method, path, body, query)
        raise AssertionError("unreachable")  # pragma: no cover

    def _request(self, method: str, path: str, body: dict[str, Any] | None,
                 query: dict[str, Any] | None) -> Any:
        url = f"{self.url.rstrip('/')}/api/v2/{path.lstrip('/')}"
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", **self.headers}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")
            with contextlib.suppress(ValueError, AttributeError):
                detail = str(json.loads(detail).get("detail", detail))
            raise AirflowRequestFailed(method, url, e.code, detail[:2000]) from e
        except (urllib.error.URLError, OSError) as e:
            raise AirflowUnavailable(
                f"Airflow does not answer at {self.url} ({e}); start it with `make airflow` "
                "(or set TRAINYARD_AIRFLOW_URL)") from e
        return json.loads(raw) if raw else None

    def _retrying(self) -> Any:
        from trainyard.plugins.retry import policy

        def waiting(state: Any) -> None:
            log.warning("Airflow at %s is busy (%s); asking again (%.0f s of %.0f s of patience used)",
                        self.url, state.outcome.exception(), state.seconds_since_start, self.patience_s)

        return policy(_retransmittable, deadline_s=self.patience_s, first_wait_s=self.retry_wait_s, max_wait_s=8,
                      before_sleep=waiting)

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, *, run_id: str | None = None,
                note: str | None = None) -> dict[str, Any]:
        """Start one DAG run, exactly once. The run id is chosen here (Airflow's own
        `manual__<time>` form unless given), which makes the POST safe to repeat: after a server
        error or a lost answer it is sent again, and a 409 for that id means the earlier try did
        land — the run it made is returned, never a second one."""
        run_id = run_id or new_manual_run_id()
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}, "dag_run_id": run_id}
        if note:
            body["note"] = note
        path = f"dags/{urllib.parse.quote(dag_id)}/dagRuns"
        for attempt in self._retrying():
            with attempt:
                try:
                    return self._request("POST", path, body, None)
                except AirflowRequestFailed as e:
                    if e.status != 409 or attempt.retry_state.attempt_number == 1:
                        raise
                    existing = self.dag_run(dag_id, run_id)
                    if existing.get("conf") != body["conf"]:
                        raise
                    return existing
        raise AssertionError("unreachable")  # pragma: no cover

    def dag_runs(self, dag_id: str, *, limit: int = 100) -> list[dict[str, Any]]:
        data = self._call("GET", f"dags/{urllib.parse.quote(dag_id)}/dagRuns",
                          query={"limit": limit, "order_by": "run_after"})
        return list(data["dag_runs"])

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id)}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        data = self._call("GET", f"dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id)}"
                                 "/taskInstances", query={"limit": 100})
        return {t["task_id"]: t for t in data["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        data = self._call("GET", f"dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id)}"
                                 f"/taskInstances/{urllib.parse.quote(task_id)}/xcomEntries/{urllib.parse.quote(key)}",
                          query={"deserialize": "true"})
        return data.get("value")

    def asset_by_uri(self, uri: str) -> dict[str, Any] | None:
        """The asset Airflow knows under exactly `uri` (it learns one from a DAG that schedules on
        it or declares it as an outlet), or None."""
        data = self._call("GET", "assets", query={"uri_pattern": uri, "limit": 100})
        return next((a for a in data["assets"] if a["uri"] == uri), None)

    def create_asset_event(self, asset_id: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """`POST /api/v2/assets/events`: the asset was updated; DAGs scheduled on it are queued."""
        return self._call("POST", "assets/events", {"asset_id": asset_id, "extra": extra or {}})

    def hitl_detail(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        """The human-in-the-loop request of a task (subject, body, options, response)."""
        return self._call("GET", f"dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id)}"
                                 f"/taskInstances/{urllib.parse.quote(task_id)}/{map_index}/hitlDetails")

    def respond_hitl(self, dag_id: str, run_id: str, task_id: str, options: list[str], *,
                     params: dict[str, Any] | None = None, map_index: int = -1) -> dict[str, Any]:
        """Answer a human-in-the-loop task (e.g. `["Approve"]`), as the UI's Required actions does."""
        return self._call("PATCH", f"dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id)}"
                                   f"/taskInstances/{urllib.parse.quote(task_id)}/{map_index}/hitlDetails",
                          {"chosen_options": options, "params_input": params or {}})

    def set_note(self, dag_id: str, run_id: str, note: str) -> dict[str, Any]:
        """The DAG run's note (what the grid and the run's page show beside its state)."""
        return self._call("PATCH", f"dags/{dag_id}/dagRuns/{run_id}", {"note": note[:1000]},
                          query={"update_mask": "note"})

    def set_state(self, dag_id: str, run_id: str, state: str) -> dict[str, Any]:
        """Mark the DAG run `failed`, `success` or `queued` (what the UI's "Mark as …" sends)."""
        return self._call("PATCH", f"dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}", {"state": state},
                          query={"update_mask": "state"})

    def dags(self) -> list[str]:
        return [d["dag_id"] for d in self._call("GET", "dags", query={"limit": 1000})["dags"]]

    def dag_details(self, dag_id: str) -> dict[str, Any]:
        """The DAG's description, documentation, tags, paused state (`dags/{id}/details`)."""
        return dict(self._call("GET", f"dags/{urllib.parse.quote(dag_id)}/details"))

    def request_parse(self, relative_fileloc: str = JOB_DAGS_FILE) -> bool:
        """Ask the DAG processor to parse a DAG file now (Airflow's `parseDagFile`; it takes the
        request within about a second) instead of at its next periodic parse, up to
        `min_file_process_interval` later. A spec new to the jobs folder changes no DAG file, so
        nothing else tells Airflow to look. The request needs the file's token, which Airflow
        gives only with a DAG of that file: False (nothing asked) while the file has none."""
        for dag in self._call("GET", "dags", query={"limit": 1000})["dags"]:
            if dag.get("relative_fileloc") == relative_fileloc and dag.get("file_token"):
                self._call("PUT", f"parseDagFile/{dag['file_token']}")
                return True
        return False

    def import_errors(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "importErrors")["import_errors"])


FINAL_DAG_RUN_STATES = ("success", "failed")


def new_manual_run_id() -> str:
    """A DAG run id in the form Airflow gives a manual trigger, to the microsecond."""
    from datetime import UTC, datetime

    return f"manual__{datetime.now(UTC).isoformat()}"


def _retransmittable(error: BaseException) -> bool:
    """A server error or a lost answer (reset, timed out) is worth asking again; a refused
    connection is not — nothing listens, and the caller should say so at once."""
    if isinstance(error, AirflowRequestFailed):
        return error.status >= 500
    if isinstance(error, AirflowUnavailable):
        cause = error.__cause__
        reason = getattr(cause, "reason", cause)
        return not isinstance(reason, ConnectionRefusedError)
    return False


@dataclass(frozen=True)
class AttemptRun:
    """One attempt of a training run, as its DAG run shows it."""

    dag_run_id: str
    state: str
    attempt: int
    run: str
    outcome: str = ""
    action: str = ""
    reason: str = ""
    tasks: dict[str, str] = field(default_factory=dict)
    """Task id → state of the attempt's DAG run (what the grid shows)."""


def attempt_dag_run_id(run: str, attempt: int) -> str:
    """The DAG run of an attempt of training run `run`: `<run>__attempt-<n>` — attempt 0 when
    `trainyard submit` or the demo triggers it (`first_attempt`), every later one as
    `resume_next_attempt` names it — so a run's attempts sort together in the UI."""
    return f"{run}__attempt-{attempt}"


def first_attempt(conf: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A new training run's first trigger: `conf` with the run's new id, and its DAG run id
    (`<run>__attempt-0`). A trigger from Airflow's own form gets a generated DAG run id instead."""
    from trainyard.config.runs import new_run_id

    run = new_run_id()
    return {**conf, "run": run}, attempt_dag_run_id(run, 0)


def follow_training_run(client: AirflowClient, dag_id: str, first_dag_run_id: str, *, timeout_s: float,
                        poll_s: float = 2.0, on_poll: Any = None) -> list[AttemptRun]:
    """Wait until the training run that `first_dag_run_id` started has ended — through every
    attempt the recovery hands it to — and return its attempts. `on_poll(attempts, tasks)` is
    called on every poll (a progress display).

    Between the run's id (`validate_spec`'s XCom) and the DAG run's end, a poll without `on_poll`
    asks for the DAG run's state only: its task instances are the costliest read of the REST API
    (the e2e stack's api-server log: ~100 ms each, against ~20–40 ms for the DAG run), and they
    are read once the DAG run has ended."""
    import time

    from trainyard.plugins.recovery.model import FINAL_KINDS

    deadline = time.monotonic() + timeout_s
    attempts: list[AttemptRun] = []
    dag_run_id, attempt, run = first_dag_run_id, 0, ""
    while True:
        try:
            state = client.dag_run(dag_id, dag_run_id)["state"]
        except AirflowRequestFailed as e:
            if e.status != 404 or time.monotonic() > deadline:  # the hand-over may not be there yet
                raise
            state = "queued"
        wanted = on_poll is not None or not run or state in FINAL_DAG_RUN_STATES
        tasks = client.task_instances(dag_id, dag_run_id) if state != "queued" and wanted else {}
        if not run and tasks.get("validate_spec", {}).get("state") == "success":
            run = (client.xcom(dag_id, dag_run_id, "validate_spec") or {}).get("run", "")
        current = AttemptRun(dag_run_id, state, attempt, run,
                             tasks={t: str(v.get("state")) for t, v in tasks.items()})
        if state in FINAL_DAG_RUN_STATES:
            current = _with_outcome(client, dag_id, current, tasks)
            attempts.append(current)
            if current.action in FINAL_KINDS or not current.action or not run:
                return attempts
            dag_run_id, attempt = attempt_dag_run_id(run, attempt + 1), attempt + 1
            continue
        if on_poll is not None:
            on_poll([*attempts, current], tasks)
        if time.monotonic() > deadline:
            raise TimeoutError(f"training run {run or first_dag_run_id} of {dag_id} still {state} "
                               f"(attempt {attempt}) after {timeout_s:g}s")
        time.sleep(poll_s)


def _with_outcome(client: AirflowClient, dag_id: str, attempt: AttemptRun, tasks: dict[str, dict[str, Any]]
                  ) -> AttemptRun:
    from dataclasses import replace

    if tasks.get("classify_outcome", {}).get("state") != "success":
        return attempt
    report = client.xcom(dag_id, attempt.dag_run_id, "classify_outcome", key="report") or {}
    action = client.xcom(dag_id, attempt.dag_run_id, "classify_outcome", key="action") or {}
    return replace(attempt, outcome=report.get("outcome", ""), action=action.get("kind", ""),
                   reason=report.get("reason", ""))
