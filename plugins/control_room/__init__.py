"""The Trainyard view: one training run as a person wants to see it (issue 30, DESIGN §12).

| module | what |
|---|---|
| `model` | the view model (`RunView` and its parts), plain pydantic |
| `locate` | which training run an Airflow DAG run is an attempt of |
| `build` | the view from the platform state, the checkpoint store, heartbeats and MLflow |
| `render`, `charts`, `fmt` | server-side HTML with inline CSS and SVG: no script, works offline |
| `app` | the FastAPI app Airflow mounts (`plugins/trainyard_plugin.py`) |

An engine like the others: no Airflow import. Heavy libraries (mlflow) are imported inside the
functions that read MLflow, so mounting the app costs nothing until a page is opened.
"""
