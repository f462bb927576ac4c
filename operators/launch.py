"""`launch_training`: open (or continue) the run's MLflow run and start the gang, detached.

The training processes do not belong to this task: it returns as soon as the launcher has
submitted the gang and pushes the `RunHandle`; the deferrable sensors re-attach from it. A
retried launch finds the handle the first try wrote (per job, run and attempt) and re-attaches —
it never starts a second copy. A dry run stops here, skipped, after validation, planning and
placement. Which launcher runs the gang is the cluster's (`plugins.attempt.launchers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from trainyard.operators.common import opened_of, pull, pull_optional, runtime, to_xcom
from trainyard.operators.links import MlflowRunLink, TrainyardViewLink
from trainyard.operators.placement import PLACE, planned_of
from trainyard.operators.validate import CHECKED, VALIDATE_DATA

if TYPE_CHECKING:
    from airflow.sdk import Context

LAUNCH = "launch_training"


class LaunchTrainingOperator(BaseOperator):
    """Start the attempt's gang detached; push its `RunHandle` and the MLflow run id."""

    ui_color = "#d5f5e3"
    operator_extra_links = (MlflowRunLink(), TrainyardViewLink(),)

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.attempt.steps import (
            DataChecked,
            Placed,
            checkpoints_root,
            launch,
            start_point,
        )
        from trainyard.plugins.attempt.watching import committed_after
        from trainyard.plugins.placement.model import Placement

        opened = opened_of(context)
        checked = pull_optional(context, VALIDATE_DATA, DataChecked, key=CHECKED)
        launched = launch(opened, planned_of(context), Placed(placement=pull(context, PLACE, Placement)), runtime(),
                          checked=checked)
        if launched is None:
            raise AirflowSkipException("dry run: validated, planned and placed; nothing launched")
        h, rt = launched.handle, runtime()
        try:
            committed = [] if launched.resume_from else [
                (r.step, r.manifest_uri) for r in committed_after(checkpoints_root(opened, rt), -1,
                                                                  endpoint_url=rt.settings.s3_endpoint_url)]
        except Exception as e:  # noqa: BLE001 - a log line must not fail the launch that already happened
            self.log.warning("the run's checkpoints could not be listed for the log: %s", e)
            committed = []
        self.log.info("run %s attempt %d: %d ranks started on %s (%s), %s; MLflow run %s; logs under %s",
                      h.run, h.attempt, h.world_size, ", ".join(h.nodes), h.kind,
                      start_point(launched.resume_from, committed), launched.mlflow_run_id,
                      h.run_dir or f"{h.namespace}/{h.name}")
        context["ti"].xcom_push(key="mlflow_run_id", value=launched.mlflow_run_id)
        return to_xcom(h)
