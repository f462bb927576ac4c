"""One Airflow DAG per TrainingJob spec in the jobs folder (`TRAINYARD_JOBS_DIR`).

Each valid spec becomes a DAG named after the job (`factory.build_dag`). The specs that do not
validate become one stand-in (`invalid_specs.InvalidSpecsDag`) that Airflow rejects with their
reports — the DAG file's import error — so one team's typo never hides the other teams' DAGs.
When Airflow runs a task it parses with a parsing context naming the DAG: then only that spec is
read and only that DAG is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainyard.dags.factory import build_dag, read_specs
from trainyard.dags.invalid_specs import InvalidSpecsDag

if TYPE_CHECKING:
    from pathlib import Path

    from airflow.sdk import DAG


def job_dags(jobs_dir: Path, wanted: str | None = None) -> dict[str, DAG]:
    """The jobs' DAGs by id (only `wanted`'s when a task's parse names it), and the invalid
    specs' stand-in when there are any and no single DAG is wanted."""
    built: dict[str, DAG] = {}
    broken = []
    for path, job, problems in read_specs(jobs_dir, only=wanted):
        if job is not None and not any(p.severity == "error" for p in problems):
            built[job.name] = build_dag(job, path)
        elif wanted is None:
            broken.append((path, problems))
    if broken:
        stand_in = InvalidSpecsDag.of(broken)
        built[stand_in.dag_id] = stand_in
    return built
