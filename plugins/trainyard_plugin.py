"""The Trainyard plugin for Airflow 3 (DESIGN §12): the Trainyard view inside Airflow's UI.

The only module under `plugins/` that Airflow's plugin loader imports (`plugins/.airflowignore`),
and the one module of the engines' tree that imports Airflow. Every Airflow component loads
plugins (the scheduler, the dag-processor, the triggerer and the api-server), so this module
imports nothing heavy: the view's app (`trainyard.plugins.control_room.app`) is built the first time the
api-server routes a request to it (`_LazyApp`).

What a person gets:
- **Trainyard** in the navigation: every training run, newest first (`/trainyard/`);
- a **Trainyard** tab on each DAG page: that job's runs (`/trainyard/dags/<dag_id>`);
- a **Trainyard** tab on each DAG run page: the training run that DAG run is an attempt of —
  plan, placement map, progress, checkpoints, recovery timeline
  (`/trainyard/dags/<dag_id>/runs/<dag_run_id>`).

Airflow's UI shows an external view with a `url_route` inside its own page (an iframe) and
substitutes `{DAG_ID}` and `{RUN_ID}` in the `href` on the DAG and DAG-run pages; a relative
`href` resolves against the UI's `<base href>`, so the view works under any base URL.
Every page checks that the user may read the DAG's runs (Airflow's own auth manager); the Stop
button's endpoint, that they may change them, and records who they are.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/trainyard"
"""Where the view's app is mounted (kept equal to `trainyard.plugins.tracking.ui_links.URL_PREFIX`; a
unit test checks it, so this module need not import the engine to know it)."""

ICON = ("data:image/svg+xml;utf8,<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'>"
        "<path d='M1 12h14M3 12V4h2v8M11 12V4h2v8M1 4h14' stroke='%23888' stroke-width='1.5' fill='none'/></svg>")
"""A rail track, inline: nothing to serve, nothing fetched."""


def _authorize() -> Any:
    """Airflow's check that the user may read the runs of the DAG in the path (`dag_id`)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    return requires_access_dag("GET", DagAccessEntity.RUN)


def _authorize_stop() -> Any:
    """Airflow's check that the user may change the runs of the DAG in the path (what "Mark as
    failed" needs)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    return requires_access_dag("PUT", DagAccessEntity.RUN)


def _user_name() -> Any:
    """A FastAPI dependency: the name of whoever Airflow says is asking."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi import Depends

    def name(user: Any = Depends(get_user)) -> str:  # noqa: B008 - FastAPI's way of declaring it
        return user.get_name()

    return name


class _LazyApp:
    """An ASGI app that builds the view's FastAPI app on its first request: importing the
    plugin costs the scheduler and the dag-processor nothing."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self._app is None:
            from trainyard.operators.kubernetes_clients import kubernetes_clients
            from trainyard.plugins.control_room.app import create_app

            # the live ranks, a waiting gang's reason and the Stop button reach Kubernetes through
            # Airflow's connection, as the tasks do: the api-server has no kubeconfig of its own
            self._app = create_app(authorize=_authorize(), authorize_stop=_authorize_stop(), user=_user_name(),
                                   mounted_at=URL_PREFIX, kube_clients=kubernetes_clients)
        await self._app(scope, receive, send)


class TrainyardPlugin(AirflowPlugin):
    name = "trainyard"
    fastapi_apps = [{"app": _LazyApp(), "url_prefix": URL_PREFIX, "name": "Trainyard"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012 - AirflowPlugin's own class attributes
        {"name": "Trainyard", "href": "trainyard/", "destination": "nav", "url_route": "trainyard",
         "icon": ICON, "nav_top_level": True},
        {"name": "Trainyard", "href": "trainyard/dags/{DAG_ID}", "destination": "dag",
         "url_route": "trainyard-dag", "icon": ICON},
        {"name": "Trainyard", "href": "trainyard/dags/{DAG_ID}/runs/{RUN_ID}", "destination": "dag_run",
         "url_route": "trainyard-run", "icon": ICON},
    ]
