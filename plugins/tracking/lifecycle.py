"""Open and close a job's MLflow run with everything a run should hold: one call each.

`start_or_resume_run` (runs.py) records params and tags; a run also needs its dataset input,
its start artifacts (spec, plan explanation, data-quality report), system metrics while it
trains and, at the end, its status, loss plot and recovery timeline. `trainyard launch --local`
and the Airflow tasks call these two functions so that their runs hold what the demo's do.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from trainyard.config.settings import Settings
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.advisor.planner import PlanResult
    from trainyard.plugins.tracking.artifacts import TimelineEntry
    from trainyard.plugins.validation.data_quality import DataQualityReport

log = logging.getLogger(__name__)


def open_tracked_run(
    job: TrainingJob, plan: Plan, settings: Settings, *, attempt: int, run_id: str | None = None,
    run: str = "", advice: PlanResult | None = None, plan_source: str = "", check_quality: bool = True,
    quality: DataQualityReport | None = None,
) -> str:
    """Create (attempt 0) or resume the job's run, record its dataset and, on the attempt that
    creates it, its start artifacts; returns the run id. A dataset that cannot be described or
    checked is said in the log and left out: tracking never stops a launch that validated.
    `advice`: the advisor's answer the plan came from, explained beside it (`log_start_artifacts`);
    `quality`: the report the data-quality checks made, else (with `check_quality`) they run here."""
    from trainyard.plugins.tracking.artifacts import log_start_artifacts
    from trainyard.plugins.tracking.runs import start_or_resume_run

    uri = settings.mlflow_tracking_uri
    dataset, store = None, None
    try:
        from trainyard.plugins.data.datasets import describe_dataset, open_dataset_store

        if job.spec.dataset is not None:  # none: a script of the team's own reads its data itself
            store = open_dataset_store(job.spec.dataset.source, settings)
            dataset = describe_dataset(store, job.spec.dataset)
    except Exception as e:  # noqa: BLE001 - lineage is best effort here; validate checks the data
        log.warning("dataset %s not recorded on the run: %s", job.spec.dataset.source, e)  # type: ignore[union-attr]
    rid = start_or_resume_run(job, plan, tracking_uri=uri, run_id=run_id, attempt=attempt, dataset=dataset,
                              trigger_id=run or None)
    if check_quality and quality is None and store is not None:
        from trainyard.plugins.validation.data_quality import check_data_quality

        try:
            quality = check_data_quality(job, store=store)
        except Exception as e:  # noqa: BLE001 - see above
            log.warning("data quality of %s not recorded on the run: %s", job.spec.dataset.source, e)
    log_start_artifacts(rid, job, plan, tracking_uri=uri, advice=advice, plan_source=plan_source, quality=quality)
    return rid


def close_tracked_run(
    run_id: str, status: Literal["completed", "failed", "cancelled"], *, tracking_uri: str,
    timeline: Sequence[TimelineEntry | tuple[float, str]] = (), title: str | None = None,
    rank_logs: Sequence[tuple[int, Path]] = (),
) -> list[str]:
    """The end artifacts (loss plot, recovery timeline, the attempts' rank logs), then the
    status that ends the run."""
    from trainyard.plugins.tracking.artifacts import log_end_artifacts, log_rank_logs
    from trainyard.plugins.tracking.runs import set_run_status

    paths = log_end_artifacts(run_id, tracking_uri=tracking_uri, timeline=timeline, title=title)
    try:
        paths += log_rank_logs(run_id, rank_logs, tracking_uri=tracking_uri)
    except OSError as e:  # the run still ends with its status; the logs stay in the run folder
        log.warning("rank logs not attached to run %s: %s", run_id, e)
    set_run_status(run_id, status, tracking_uri=tracking_uri)
    return paths

