"""A fresh stack's maintenance DAGs show no failed run: the daily audit and chargeback used to
be queued in the scheduler's first second — before the API server that tasks report to was
listening — and their first tries failed, retried five minutes later. They now wait for their
next scheduled time (`dags/maintenance.py`); this stack has run a while (the other tests of
this folder may have run first) and none of them has a run that failed or needed a retry."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.e2e.airflow_stack import RunningStack

pytestmark = pytest.mark.slow
MAINTENANCE = ("trainyard_checkpoint_audit", "trainyard_chargeback", "trainyard_retention_sweep")


def test_a_fresh_stacks_maintenance_dags_have_no_failed_run(shared: RunningStack) -> None:
    assert set(MAINTENANCE) <= set(shared.client.dags()), shared.logs()
    now = datetime.now(UTC)
    started = datetime.fromtimestamp(shared.stack.log_file("db-migrate").stat().st_mtime, UTC)
    for dag_id in MAINTENANCE:
        runs = shared.client.dag_runs(dag_id)
        assert [r for r in runs if r["state"] == "failed"] == [], (dag_id, runs)
        early = [r["dag_run_id"] for r in runs if r["run_type"] == "scheduled"
                 and datetime.fromisoformat(r["run_after"]) < started]
        assert early == [], (dag_id, "a run for a time before the stack started, queued at start-up", early)
        for run in runs:
            tries = {t: ti["try_number"] for t, ti in shared.client.task_instances(dag_id, run["dag_run_id"]).items()}
            assert all(n <= 1 for n in tries.values()), (dag_id, run["dag_run_id"], tries)
        dag = shared.client._call("GET", f"dags/{dag_id}")
        if dag_id != "trainyard_retention_sweep":  # created paused: no next run at all
            after = datetime.fromisoformat(dag["next_dagrun_run_after"])
            assert after > now, (dag_id, dag["next_dagrun_run_after"])  # nothing ran at start-up
