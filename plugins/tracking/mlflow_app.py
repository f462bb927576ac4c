"""`mlflow server --app-name trainyard`: MLflow's own server, opening on its model-training pages.

MLflow 3.17's UI decides between its GenAI pages (Traces, token usage, "Detect issues") and its
model-training pages (Runs, metric charts) with one switch per browser: the URL's
`workflowType`, else the choice stored in the browser (`localStorage["mlflow.workflowType_v1"]`),
else GenAI. The experiment's `mlflow.experimentKind` tag is not read. Every link Trainyard hands
out carries `workflowType=machine_learning` (`ui_links`), but someone who types the server's
address into a fresh browser still met a GenAI app with nothing in it.

So this app is MLflow's app with one change: the page that starts the UI (`index.html`, served
for `/`) stores `machine_learning` as the browser's choice when the browser has made none (and
keeps the AI assistant's panel from opening itself). A person who picks GenAI in the UI's switch
keeps that choice; the API, the artifacts and every
other route are MLflow's, untouched. It is MLflow's plugin mechanism (the `mlflow.app` entry
point, as `basic-auth` is), so a deployment's own `mlflow server` gets it by installing
`trainyard` beside MLflow and adding `--app-name trainyard`.
"""

from __future__ import annotations

import json
import os
from typing import Any

BROWSER_DEFAULTS: dict[str, object] = {
    # The UI's workflow switch (its `useLocalStorage` keys end in `_v<version>`).
    "mlflow.workflowType_v1": "machine_learning",
    # MLflow opens its AI assistant's panel over a quarter of the page on a browser's first visit
    # to a server on localhost (ours); "already opened once" keeps the panel closed, its button stays.
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True,
}
"""What a browser that has made no choice of its own starts with."""

_DEFAULTS_JSON = json.dumps({k: json.dumps(v) for k, v in BROWSER_DEFAULTS.items()})
DEFAULTS_SCRIPT = ("<script>try{var d=" + _DEFAULTS_JSON + ";for(var k in d)"
                   "if(localStorage.getItem(k)===null)localStorage.setItem(k,d[k])}catch(e){}</script>")
"""Runs before the UI's own scripts (first in `<head>`): a choice the browser stored is kept."""


def with_defaults(index_html: str) -> str:
    """MLflow's `index.html` with `DEFAULTS_SCRIPT` first in its head."""
    head = index_html.find("<head>")
    if head < 0:
        return DEFAULTS_SCRIPT + index_html
    at = head + len("<head>")
    return index_html[:at] + DEFAULTS_SCRIPT + index_html[at:]


def create_app() -> Any:
    """MLflow's server app with `index.html` served through `with_defaults` (the factory
    `mlflow server --app-name trainyard` runs: FastAPI under uvicorn, MLflow's default, else
    the Flask app for gunicorn and waitress)."""
    from flask import Response
    from mlflow.environment_variables import _MLFLOW_SGI_NAME
    from mlflow.server import app

    index = os.path.join(app.static_folder or "", "index.html")
    serve = app.view_functions["serve"]

    def serve_with_defaults() -> Any:
        if not os.path.exists(index):
            return serve()  # MLflow's own page saying the UI is not built
        with open(index, encoding="utf-8") as f:
            return Response(with_defaults(f.read()), mimetype="text/html")

    app.view_functions["serve"] = serve_with_defaults
    if (_MLFLOW_SGI_NAME.get() or "uvicorn") == "uvicorn":  # what `mlflow server` chose to run the app
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app
