"""The Trainyard view as a FastAPI app: what Airflow's api-server mounts (`fastapi_apps` of
`plugins/trainyard_plugin.py`) and what a test serves on its own.

URLs, relative to where it is mounted (`/trainyard` in Airflow):

| path | page |
|---|---|
| `/` | every training run, newest first (the nav entry); `?team=&job=&state=` filter it |
| `/dags/{dag_id}` | the runs of one job (the tab on the DAG page) |
| `/dags/{dag_id}/runs/{dag_run_id}` | the training run a DAG run is an attempt of (the tab on a DAG run) |
| `/jobs/{dag_id}/runs/{run}` | a training run by its id (`trainyard status` links here) |
| `…/view.json` | the same view as JSON (`RunView`) |
| `…/live.json` | what a live run's page polls every few seconds (`LiveUpdate`) |
| `POST /jobs/{dag_id}/runs/{run}/stop` | the Stop button: `trainyard stop`'s engine (`plugins/attempt/stop.py`) |

The handlers are plain functions (FastAPI runs them in its thread pool): the platform state and
MLflow are blocking clients. `authorize` is a FastAPI dependency run before every page — the
plugin passes Airflow's own DAG-read check, so the view shows a run only to whoever may read
its DAG; this module imports nothing of Airflow (DESIGN §1). The Stop endpoint also runs
`authorize_stop` (the plugin passes Airflow's DAG-run edit check) and `user` (who is asking, for
the run's record), and refuses what does not come from this origin (`guard.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse

from trainyard.plugins.tracking.ui_links import URL_PREFIX

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.control_room.model import LiveUpdate, RunView
    from trainyard.plugins.launch.kube_clients import KubeClients
    from trainyard.plugins.state.jobs import JobStateStore, RunInfo

def create_app(*, settings: Callable[[], Settings] | None = None, authorize: Callable[..., Any] | None = None,
               authorize_stop: Callable[..., Any] | None = None, user: Callable[..., str] | None = None,
               mounted_at: str = URL_PREFIX, kube_clients: Callable[[], KubeClients] | None = None) -> FastAPI:
    """The app. `settings`: where the platform state, the object store and MLflow are (default
    `trainyard.config.settings.get_settings`, the api-server's `TRAINYARD_*` environment); `mounted_at`:
    the prefix Airflow mounts it under, to tell Airflow's own root from this app's. `authorize_stop`
    and `user`: FastAPI dependencies of the Stop endpoint (may the caller change the DAG's runs;
    their name). `kube_clients`: how the ranks' table, the waiting reason and the Stop button reach
    a Kubernetes API from this process — inside Airflow's api-server its connection, as the tasks
    do (`trainyard_plugin.py` passes it); None: the kubeconfig."""
    from trainyard.config.settings import get_settings
    from trainyard.plugins.attempt.launchers import Runtime

    read_settings = settings or get_settings
    app = FastAPI(title="Trainyard", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(authorize)] if authorize is not None else [])

    def store() -> JobStateStore:
        from trainyard.plugins.state.jobs import open_job_state

        return open_job_state(read_settings().state_db)

    def runtime() -> Runtime:
        return Runtime(read_settings(), kube_clients=kube_clients)

    def runs(request: Request, title: str, *, team: str, job: str, state: str, fixed_job: bool) -> HTMLResponse:
        from trainyard.plugins.control_room.render import message_page
        from trainyard.plugins.control_room.runs_list import RunsFilter, run_summaries, runs_page

        try:
            flt = RunsFilter(team=team.strip(), job=job.strip(), state=state.strip())
        except ValueError as e:
            return HTMLResponse(message_page("Bad filter", str(e)), status_code=400)
        now = _now()
        listed, note = run_summaries(store(), flt, now=now, tracking_uri=read_settings().mlflow_tracking_uri)
        return HTMLResponse(runs_page(listed, title=title, now=now, base=_root(request), flt=flt, note=note,
                                      fixed_job=fixed_job))

    @app.get("/", response_class=HTMLResponse)
    def all_runs(request: Request, team: str = "", job: str = "", state: str = "") -> HTMLResponse:
        return runs(request, "Training runs", team=team, job=job, state=state, fixed_job=False)

    @app.get("/dags/{dag_id}", response_class=HTMLResponse)
    def job_runs(dag_id: str, request: Request, team: str = "", state: str = "") -> HTMLResponse:
        return runs(request, f"Training runs of {dag_id}", team=team, job=dag_id, state=state, fixed_job=True)

    def by_dag_run(dag_id: str, dag_run_id: str) -> RunInfo:
        from trainyard.plugins.control_room.locate import run_of_dag_run

        return run_of_dag_run(store(), dag_id, dag_run_id)

    def by_run(dag_id: str, run: str) -> RunInfo:
        return store().get_run(dag_id, run)

    def view(info: RunInfo, request: Request) -> RunView:
        from trainyard.plugins.control_room.build import build_run_view

        return build_run_view(store(), info, read_settings(), runtime=runtime(), airflow_base=_airflow_root(request, mounted_at,
                                                                                         read_settings()))

    @app.get("/dags/{dag_id}/runs/{dag_run_id}", response_class=HTMLResponse)
    def dag_run_page(dag_id: str, dag_run_id: str, request: Request) -> HTMLResponse:
        return _html(lambda: view(by_dag_run(dag_id, dag_run_id), request), _root(request))

    @app.get("/dags/{dag_id}/runs/{dag_run_id}/view.json")
    def dag_run_json(dag_id: str, dag_run_id: str, request: Request) -> JSONResponse:
        return _json(lambda: view(by_dag_run(dag_id, dag_run_id), request))

    @app.get("/jobs/{dag_id}/runs/{run}", response_class=HTMLResponse)
    def run_page(dag_id: str, run: str, request: Request) -> HTMLResponse:
        return _html(lambda: view(by_run(dag_id, run), request), _root(request))

    @app.get("/jobs/{dag_id}/runs/{run}/view.json")
    def run_json(dag_id: str, run: str, request: Request) -> JSONResponse:
        return _json(lambda: view(by_run(dag_id, run), request))

    def live(info: RunInfo) -> LiveUpdate:
        from trainyard.plugins.control_room.build import build_live_update

        return build_live_update(store(), info, read_settings(), runtime=runtime())

    @app.get("/dags/{dag_id}/runs/{dag_run_id}/live.json")
    def dag_run_live(dag_id: str, dag_run_id: str) -> JSONResponse:
        return _json(lambda: live(by_dag_run(dag_id, dag_run_id)))

    @app.get("/jobs/{dag_id}/runs/{run}/live.json")
    def run_live(dag_id: str, run: str) -> JSONResponse:
        return _json(lambda: live(by_run(dag_id, run)))

    stop_guards = [Depends(authorize_stop)] if authorize_stop is not None else []

    def who() -> str:
        return "a user"

    @app.post("/jobs/{dag_id}/runs/{run}/stop", dependencies=stop_guards)
    def stop(dag_id: str, run: str, request: Request, name: str = Depends(user or who)) -> JSONResponse:
        from trainyard.plugins.control_room.guard import cross_site_problem

        problem = cross_site_problem(request.headers)
        if problem:
            return JSONResponse({"detail": problem}, status_code=403)
        return _stop(store(), dag_id, run, runtime(), name)

    return app


STOP_GRACE_S = 20.0
"""SIGTERM to SIGKILL for the Stop button: time for the emergency checkpoint, inside a browser's
patience for the answer."""


def _stop(store: JobStateStore, job: str, run: str, runtime: Runtime, name: str) -> JSONResponse:
    """The Stop button: `trainyard stop`'s engine, recorded as this person's decision."""
    from trainyard.plugins.attempt.stop import stop_run
    from trainyard.plugins.state.jobs import RunNotFound

    try:
        result = stop_run(store, job, runtime, run, grace_s=STOP_GRACE_S,
                          detail=f"stopped by {name} from the Trainyard view")
    except RunNotFound as e:
        return JSONResponse({"detail": str(e)}, status_code=404)
    if result.already_final:
        message = f"run {result.run.run} had already ended: {result.run.state}"
    else:
        stopped = f"attempt {result.attempt} {result.status.state}" if result.status else "no live attempt"
        message = f"run {result.run.run} {result.run.state} ({stopped})"
    return JSONResponse({"state": result.run.state, "attempt": result.attempt, "message": message})


def _html(make: Callable[[], RunView], base: str) -> HTMLResponse:
    from trainyard.plugins.control_room.render import message_page, run_page
    from trainyard.plugins.state.jobs import RunNotFound

    try:
        return HTMLResponse(run_page(make(), _now(), base=base))
    except RunNotFound as e:
        return HTMLResponse(message_page("No such training run", str(e)), status_code=404)


def _json(make: Callable[[], RunView | LiveUpdate]) -> JSONResponse:
    from trainyard.plugins.state.jobs import RunNotFound

    try:
        return JSONResponse(make().model_dump(mode="json"))
    except RunNotFound as e:
        return JSONResponse({"detail": str(e)}, status_code=404)


def _now() -> datetime:
    return datetime.now(UTC)


def _root(request: Request) -> str:
    """This app's root as the browser reaches it, with a trailing slash (`/trainyard/`)."""
    return request.scope.get("root_path", "").rstrip("/") + "/"


def _airflow_root(request: Request, mounted_at: str, settings: Settings) -> str:
    """Airflow's UI root: the path above the mount point when Airflow serves this app (same
    origin, any base path), else the configured `TRAINYARD_AIRFLOW_URL` (the app alone)."""
    root = request.scope.get("root_path", "").rstrip("/")
    if mounted_at and root.endswith(mounted_at):
        return root[: -len(mounted_at)]
    return settings.airflow_url.rstrip("/")
