"""The maintenance DAGs' task callables (`dags/maintenance.py`): read the settings and the specs,
call the engine, log what it found. Each is a plain function so a test can run it against a real
store without Airflow; all the deciding is in `plugins/checkpoint/maintenance.py` and
`plugins/tracking/cost.py`.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.plugins.checkpoint.maintenance import RootsFound
    from trainyard.plugins.checkpoint.retention import RetentionPolicy

log = logging.getLogger(__name__)


def _settings(settings: Settings | None) -> Settings:
    if settings is not None:
        return settings
    from trainyard.config.settings import get_settings

    return get_settings()


def spec_policies(jobs_dir: Path) -> tuple[dict[str, RetentionPolicy], dict[str, str]]:
    """(job → retention policy, job → `checkpoint.storage` where set) of every spec that parses;
    a spec that does not is left out (its DAG is not built either, `invalid_specs.py` says why)."""
    from trainyard.config.loader import read_spec_file
    from trainyard.plugins.checkpoint.retention import RetentionPolicy

    policies: dict[str, RetentionPolicy] = {}
    storage: dict[str, str] = {}
    for path in sorted(Path(jobs_dir).glob("*.y*ml")):
        job, _ = read_spec_file(path)
        if job is None:
            continue
        policies[job.name] = RetentionPolicy.from_spec(job.spec.checkpoint)
        if job.spec.checkpoint.storage:
            storage[job.name] = job.spec.checkpoint.storage
    return policies, storage


def audit_checkpoints(*, sample: int = 20, seed: int | None = None, settings: Settings | None = None
                      ) -> dict[str, Any]:
    """Re-hash a random sample of committed checkpoints across all jobs and runs; fail (a
    `FatalError` naming each bad one) when any does not verify. Stores this process has no
    credentials for are skipped and named; when that leaves nothing to read, the task is
    skipped (Airflow's `skipped`, with the reason), not failed."""
    from trainyard.plugins.checkpoint.maintenance import audit

    s = _settings(settings)
    _, storage = spec_policies(s.jobs_dir)
    found = _readable_roots(s, storage, "audit")
    report = audit(found.roots, sample=sample, seed=seed, endpoint_url=s.s3_endpoint_url)
    log.info("audited %d of %d committed checkpoints in %d runs", len(report.findings),
             report.population, len(found.roots))
    report.raise_if_bad()
    return {"runs": len(found.roots), "population": report.population, "sampled": len(report.findings),
            "hashed_bytes": sum(f.hashed_bytes for f in report.findings), "skipped_stores": found.skipped}


def sweep_retention(*, dry_run: bool = False, settings: Settings | None = None) -> dict[str, Any]:
    """Apply each job's spec retention policy to every finished run of it (stores without
    credentials skipped, as `audit_checkpoints` does)."""
    from trainyard.plugins.checkpoint.maintenance import sweep

    s = _settings(settings)
    policies, storage = spec_policies(s.jobs_dir)
    found = _readable_roots(s, storage, "sweep")
    live = live_runs_of(s.state_db, sorted({r.job for r in found.roots}))
    report = sweep(found.roots, policies, live_runs=live, dry_run=dry_run, endpoint_url=s.s3_endpoint_url)
    for uri, why in sorted(report.skipped.items()):
        log.info("skipped %s: %s", uri, why)
    for uri, steps in sorted(report.deleted.items()):
        log.info("deleted steps %s under %s", steps, uri)
    return {"swept": len(report.runs), "skipped": len(report.skipped),
            "deleted": {uri: steps for uri, steps in sorted(report.deleted.items())},
            "skipped_stores": found.skipped}


def _readable_roots(s: Settings, storage: dict[str, str], what: str) -> RootsFound:
    """The run roots of the stores this process can read, each other one named in the log.
    When there were stores and none could be read: Airflow's skip (the task shows `skipped`
    with the reason), not a failure and not a retry."""
    from airflow.sdk.exceptions import AirflowSkipException

    from trainyard.plugins.checkpoint.maintenance import find_run_roots

    found = find_run_roots(s.object_store, storage=storage, endpoint_url=s.s3_endpoint_url)
    for location, why in sorted(found.skipped.items()):
        log.warning("%s: skipped %s: %s", what, location, why)
    if found.skipped and not found.roots:
        raise AirflowSkipException(f"nothing to {what}: " + "; ".join(
            f"{location}: {why}" for location, why in sorted(found.skipped.items())))
    return found


def live_runs_of(state_db: str, jobs: list[str]) -> dict[str, set[str]]:
    """Runs of `jobs` the job state does not show as final (the sweep leaves them alone)."""
    from trainyard.plugins.state.jobs import JobStateStore

    store = JobStateStore(state_db)
    try:
        return {job: {r.run for r in store.list_runs(job, limit=1000) if not r.final} for job in jobs}
    finally:
        store.close()


def chargeback_report(since: str | dt.datetime | None = None, until: str | dt.datetime | None = None, *,
                      settings: Settings | None = None, log_to_mlflow: bool = True) -> dict[str, Any]:
    """The chargeback of the runs that ended in [since, until) (the DAG passes its data
    interval): CSV + HTML under `<home>/reports/chargeback/<period>/`, and (by default) a run
    of the MLflow experiment `trainyard/chargeback` holding both."""
    from trainyard.plugins.tracking.cost import (
        accounting_from_mlflow,
        chargeback,
        log_chargeback,
        write_chargeback,
    )

    s = _settings(settings)
    start, end = _when(since), _when(until)
    period = f"{f'{start:%Y-%m-%dT%H%M}' if start else 'start'}_{f'{end:%Y-%m-%dT%H%M}' if end else 'now'}"
    rows = chargeback(accounting_from_mlflow(s.mlflow_tracking_uri), since=start, until=end)
    csv_path, html_path = write_chargeback(rows, s.home / "reports" / "chargeback" / period, period=period)
    run_id = log_chargeback(rows, tracking_uri=s.mlflow_tracking_uri, period=period) if log_to_mlflow else ""
    log.info("chargeback %s: %d team/project rows, %.2f USD; %s, %s; MLflow run %s", period, len(rows),
             sum(r.total_cost_usd for r in rows), csv_path, html_path, run_id or "(not logged)")
    return {"period": period, "rows": len(rows), "csv": str(csv_path), "html": str(html_path),
            "mlflow_run_id": run_id}


def _when(value: str | dt.datetime | None) -> dt.datetime | None:
    if value is None or str(value) in ("", "None"):  # a manual run may have no data interval
        return None
    moment = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
