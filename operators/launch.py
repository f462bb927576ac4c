"""`launch_training`: open (or continue) the run's MLflow run and start the gang, detached.

The training processes do not belong to this task: it returns as soon as torchrun is started
and pushes the `RunHandle`; the deferrable sensors re-attach from it. A retried launch finds
the handle the first try wrote (per job, run and attempt) and re-attaches — it never starts a
second copy. A dry run stops here, skipped, after validation, planning and placement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from operators.common import attempt_of, pull, settings, to_xcom
from operators.placement import PLACE, PLAN

if TYPE_CHECKING:
    from airflow.sdk import Context

LAUNCH = "launch_training"


class LaunchTrainingOperator(BaseOperator):
    """Start the attempt's torchrun gang detached; push its `RunHandle` and the MLflow run id."""

    ui_color = "#d5f5e3"

    def execute(self, context: Context) -> dict[str, Any]:
        from config.cluster import cluster_for
        from plugins.advisor.plan import Plan
        from plugins.placement.model import Placement
        from plugins.recovery.steps import launch_attempt, launched, resume_point
        from plugins.tracking.lifecycle import open_tracked_run

        job, conf = attempt_of(context)
        if conf.dry_run:
            raise AirflowSkipException("dry run: validated, planned and placed; nothing launched")
        config = settings()
        plan, placement = pull(context, PLAN, Plan), pull(context, PLACE, Placement)
        resume_from = resume_point(conf, job, tracking_uri=config.mlflow_tracking_uri,
                                   object_store=config.object_store)  # refused before anything starts
        # the same MLflow run, with the same start artifacts (spec, plan explanation, data-quality
        # report) as `trainyard launch`; every later attempt continues it
        mlflow_run_id = open_tracked_run(
            job, plan, config, attempt=conf.attempt, run_id=conf.mlflow_run_id or None, run=conf.run,
            check_quality=conf.attempt == 0,
            cluster=cluster_for(job.spec.hardware.gpu_type, config.cluster),
            plan_source=f"re-planned after attempt {conf.attempt - 1}" if conf.plan else "advisor")
        handle = launch_attempt(job, plan, placement, conf, config, mlflow_run_id=mlflow_run_id,
                                resume_from=resume_from)
        self.log.info("run %s attempt %d: %d ranks started (%s), resuming from %s; MLflow run %s; "
                      "rank logs under %s/ranks", conf.run, conf.attempt, handle.world_size,
                      ", ".join(a.node for a in handle.agents), resume_from or "the run's newest valid checkpoint",
                      mlflow_run_id, handle.run_dir)
        launched(job, conf, config, handle, mlflow_run_id)
        context["ti"].xcom_push(key="mlflow_run_id", value=mlflow_run_id)
        return to_xcom(handle)
