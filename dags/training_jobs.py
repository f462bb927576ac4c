"""One Airflow DAG per TrainingJob spec in `TRAINYARD_JOBS_DIR` (default `config/jobs/`).

Each valid spec becomes a DAG named after the job (`dags/factory.py` builds it); a spec that
does not validate is reported by `invalid_specs.py` as an import error, so one team's typo never
hides the other teams' DAGs. When Airflow runs a task it parses with a parsing context naming
the DAG: then only that spec is read and only that DAG is built.
"""

from __future__ import annotations

from airflow.sdk import get_parsing_context

from dags.factory import build_dag, jobs_dir, read_specs

_wanted = get_parsing_context().dag_id

for _path, _job, _problems in read_specs(jobs_dir(), only=_wanted):
    if _job is not None and not any(p.severity == "error" for p in _problems):
        globals()[_job.name] = build_dag(_job, _path)
