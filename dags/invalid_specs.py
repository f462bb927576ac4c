"""Specs in `TRAINYARD_JOBS_DIR` that do not validate, as this file's import error.

Airflow shows an import error per DAG file ("Broken DAG" in the UI, `importErrors` in the REST
API). Reporting invalid specs from their own file keeps every valid job's DAG (built by
`training_jobs.py`) alive while the broken ones are listed, each with its full validation report
in the `trainyard validate` format. Nothing to report: no DAG, no error.
"""

from __future__ import annotations

from airflow.sdk import get_parsing_context

from dags.factory import InvalidSpecs, jobs_dir, read_specs

if get_parsing_context().dag_id is None:  # a task's parse needs only its own DAG's file
    _broken = [(path, problems) for path, job, problems in read_specs(jobs_dir())
               if job is None or any(p.severity == "error" for p in problems)]
    if _broken:
        raise InvalidSpecs(_broken)
