"""The platform's maintenance DAGs (DESIGN §4): thin schedules over engine functions.

- `trainyard_checkpoint_audit` (@daily): re-hash a random sample of committed checkpoints across
  every job and run; the task fails, naming each bad checkpoint, when one does not verify.
- `trainyard_retention_sweep` (@hourly): each job's spec retention policy on each finished run
  (never the newest valid checkpoint; quarantined ones are never deleted). It deletes data, so it
  is created paused: a person turns it on (the embedded stack and the tests' stacks never sweep
  behind a test's back).
- `trainyard_chargeback` (@daily): the chargeback of the runs that ended in the DAG run's data
  interval, as CSV + HTML under `<home>/reports/` and a run of MLflow's `trainyard/chargeback`.

The callables are `operators/maintenance.py`; the logic is in `plugins/checkpoint/maintenance.py`
and `plugins/tracking/cost.py`. Nothing heavy is imported here.

Each runs at its next scheduled time, never at once when a stack first sees it (no start date,
`run_immediately=NEVER`, a zero buffer — Airflow 3.3's `run_immediately=False` still runs the
past slot when the stack starts within max(5 min, a tenth of the period) after it): a fresh
stack's scheduler queued both daily DAGs in its first second, before the API server that every task reports to was listening, and their first tries failed
and waited five minutes for the retry. A fresh stack has nothing to audit or bill anyway.
The chargeback's run covers the day before its trigger (`interval`: one day).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, CronTriggerTimetable

from trainyard.operators.common import RETRY_POLICY
from trainyard.operators.maintenance import audit_checkpoints, chargeback_report, sweep_retention

TAGS = ["trainyard", "trainyard:maintenance"]
DEFAULTS = {"retries": 1, "retry_delay": timedelta(minutes=5), "retry_policy": RETRY_POLICY}
NEVER = timedelta(0)
"""`run_immediately` as a buffer of zero: the past slot only when the stack starts exactly on it."""
DAILY = CronTriggerTimetable("@daily", timezone="UTC", run_immediately=NEVER)
HOURLY = CronTriggerTimetable("@hourly", timezone="UTC", run_immediately=NEVER)
DAILY_OVER_THE_DAY_BEFORE = CronTriggerTimetable("@daily", timezone="UTC", interval=timedelta(days=1),
                                                 run_immediately=NEVER)


def maintenance_dags(wanted: str | None = None) -> dict[str, DAG]:
    """The three maintenance DAGs by id (only `wanted` when a task's parse names it)."""
    built: dict[str, DAG] = {}
    if wanted in (None, "trainyard_checkpoint_audit"):
        with DAG(dag_id="trainyard_checkpoint_audit", schedule=DAILY, catchup=False,
                 max_active_runs=1, tags=TAGS, default_args=DEFAULTS,
                 doc_md="Re-hash a random sample of committed checkpoints of every job and run; fail "
                        "loudly, naming each one that does not verify.") as built["trainyard_checkpoint_audit"]:
            PythonOperator(task_id="audit_checkpoints", python_callable=audit_checkpoints, op_kwargs={"sample": 20})
    if wanted in (None, "trainyard_retention_sweep"):
        with DAG(dag_id="trainyard_retention_sweep", schedule=HOURLY, catchup=False,
                 max_active_runs=1, tags=TAGS, default_args=DEFAULTS, is_paused_upon_creation=True,
                 doc_md="Apply each job's spec retention policy to its finished runs. Never deletes the "
                        "newest valid checkpoint nor a quarantined one.") as built["trainyard_retention_sweep"]:
            PythonOperator(task_id="sweep_retention", python_callable=sweep_retention)
    if wanted in (None, "trainyard_chargeback"):
        with DAG(dag_id="trainyard_chargeback", schedule=DAILY_OVER_THE_DAY_BEFORE, catchup=False,
                 max_active_runs=1, tags=TAGS, default_args=DEFAULTS,
                 doc_md="GPU-hours and cost per team and project over the run's data interval "
                        "(CSV + HTML, and an MLflow run of `trainyard/chargeback`).") as built["trainyard_chargeback"]:
            PythonOperator(task_id="chargeback_report", python_callable=chargeback_report,
                           op_kwargs={"since": "{{ data_interval_start }}", "until": "{{ data_interval_end }}"})
    return built
