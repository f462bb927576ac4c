"""The DAGs folder as a deployment has it: the one Trainyard DAG file (`trainyard.config.airflow.
DAG_FILE`), written where the embedded stack writes it. The DAG tests load it with Airflow's own
`DagBag`, so they test what every Airflow parses — not the package's modules one by one."""

from __future__ import annotations

import os
from pathlib import Path


def dags_folder(airflow_home: Path | None = None) -> Path:
    """`<airflow home>/dags` holding the DAG file (default: `$AIRFLOW_HOME`)."""
    from trainyard.config.airflow import write_dag_file

    return write_dag_file(airflow_home or Path(os.environ["AIRFLOW_HOME"])).parent


def dagbag(airflow_home: Path | None = None) -> object:
    """Airflow's loader over that folder (`import_errors`, `dags`)."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(dags_folder(airflow_home)))
