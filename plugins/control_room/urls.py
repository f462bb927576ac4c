"""Where the Trainyard view lives, for whoever links to it (`trainyard status`, the app
itself): no import of the web framework, so a CLI command pays nothing for a link."""

from __future__ import annotations

from urllib.parse import quote

URL_PREFIX = "/trainyard"
"""Where the plugin mounts the view's app in Airflow's api-server."""


def view_path(job: str, run: str) -> str:
    """The path of a training run's page, from Airflow's root."""
    return f"{URL_PREFIX}/jobs/{quote(job, safe='')}/runs/{quote(run, safe='')}"


def view_url(airflow_url: str, job: str, run: str) -> str:
    """The page of a training run on the Airflow at `airflow_url` (`TRAINYARD_AIRFLOW_URL`)."""
    return airflow_url.rstrip("/") + view_path(job, run)
