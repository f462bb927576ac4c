"""Data preparation that announces new dataset versions (DESIGN §4, retraining on data):
`trainyard_prepare_demo_data` writes the demo dataset, records it as the version given in the
trigger form, and — its task declaring the dataset's asset as an outlet — emits the asset event
that starts every DAG whose spec says `retrain.onAsset: datasets/pydoc-topics/`. The CLI's
`trainyard data publish` is the other way to announce a version (for data prepared elsewhere).
"""

from __future__ import annotations

from datetime import datetime

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Asset, Param

from trainyard.operators.datasets import prepare_demo_version
from trainyard.plugins.data.assets import dataset_asset_uri

DEMO_SOURCE = "datasets/pydoc-topics/"
"""`trainyard.worker.demo_data.DEMO_PREFIX` (not imported here: the DAG file stays cheap to parse)."""

DAG_ID = "trainyard_prepare_demo_data"


def data_dags(wanted: str | None = None) -> dict[str, DAG]:
    """The demo's data-publishing DAG by id (none when a task's parse names another)."""
    if wanted not in (None, DAG_ID):
        return {}
    with DAG(dag_id=DAG_ID, schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
             max_active_runs=1, tags=["trainyard", "trainyard:data"],
             params={"version": Param("v1", type="string", minLength=1, title="Version tag")},
             doc_md=__doc__) as dag:
        PythonOperator(task_id="prepare_and_publish", python_callable=prepare_demo_version,
                       op_kwargs={"version": "{{ params.version }}"},
                       outlets=[Asset(dataset_asset_uri(DEMO_SOURCE))])
    return {DAG_ID: dag}
