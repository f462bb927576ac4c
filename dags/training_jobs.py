"""One Airflow DAG per TrainingJob spec in the jobs folder (`TRAINYARD_JOBS_DIR`).

Each valid spec becomes a DAG named after the job (`factory.build_dag`); each spec that does not
validate a paused DAG that shows its report and runs nothing (`invalid_specs`), so one team's
typo never hides the other teams' DAGs. When Airflow runs a task it parses with a parsing context
naming the DAG: then only that spec is read and only that DAG is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainyard.dags.factory import build_dag, read_specs
from trainyard.dags.invalid_specs import invalid_spec_dag

if TYPE_CHECKING:
    from pathlib import Path

    from airflow.sdk import DAG


def job_dags(jobs_dir: Path, wanted: str | None = None) -> dict[str, DAG]:
    """The jobs' DAGs by id (only `wanted`'s when a task's parse names it)."""
    built: dict[str, DAG] = {}
    broken = []
    for path, job, problems in read_specs(jobs_dir, only=wanted):
        if job is not None and not any(p.severity == "error" for p in problems):
            built[job.name] = build_dag(job, path)
        else:
            broken.append((path, problems))
    valid = set(built)
    for path, problems in broken:  # a task's parse read only its own spec
        dag = invalid_spec_dag(path, problems, valid)
        built[dag.dag_id] = dag
    return built
