"""Trainyard's Airflow DAGs, for any Airflow 3 deployment: one DAG file brings them all.

Adding Trainyard to an Airflow is `pip install trainyard[airflow]`, `TRAINYARD_JOBS_DIR` set for
its components, and `DAG_FILE` (`trainyard.config.airflow`) saved in its DAGs folder — `python -m trainyard.dags >
$AIRFLOW_HOME/dags/trainyard_dags.py`. The embedded stack (`make up`, `make demo`) writes the
same file into its own DAGs folder (`trainyard.config.airflow.write_dag_file`). Nothing is
copied from this package into Airflow's folders: the operators, sensors, triggers and the plugin
are imported from the installed distribution (an Airflow provider: `trainyard.provider`).

`dags()` returns what that file puts in its globals:
- one DAG per valid spec in the jobs folder (`training_jobs.py`; `factory.py` builds each);
- for each spec that does not validate, a paused DAG that shows its report and runs nothing
  (`invalid_specs.py` says why not Airflow's import error: it would hide every job of the file);
- the platform's maintenance DAGs (`maintenance.py`) and, where `TRAINYARD_DEMO_DAGS` is set (the
  embedded stack), the demo's data-publishing DAG (`datasets.py`).
When Airflow parses for a task it names the task's DAG: only that DAG is built.

DAG files stay cheap to parse (DESIGN §1): nothing heavy is imported here or by what this imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainyard.config.airflow import DAG_FILE, DAG_FILE_NAME

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["DAG_FILE", "DAG_FILE_NAME", "PLATFORM_PREFIX", "dags"]

PLATFORM_PREFIX = "trainyard_"
"""The platform's own DAG ids start with it (maintenance, demo data); a job's cannot: a job name
is a DNS-1123 label, which has no underscore."""


def dags() -> dict[str, DAG]:
    """Every Trainyard DAG this parse should build, by DAG id."""
    from airflow.sdk import get_parsing_context

    from trainyard.config.settings import Settings
    from trainyard.dags.training_jobs import job_dags

    wanted = get_parsing_context().dag_id
    settings = Settings()
    built = job_dags(settings.jobs_dir, wanted)
    if wanted is None or wanted.startswith(PLATFORM_PREFIX):
        # The platform's own DAGs (and PythonOperator, which only they use) are imported only
        # when this parse may build one: a job's task parse skips them.
        from trainyard.dags.datasets import data_dags
        from trainyard.dags.maintenance import maintenance_dags

        built = {**maintenance_dags(wanted), **built}
        if settings.demo_dags:
            built |= data_dags(wanted)
    return built
