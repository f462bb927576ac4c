"""`validate_spec` and `validate_data`: the dry run, before any accelerator is allocated.

`validate_spec` also opens the attempt (`plugins.attempt.steps.open_trigger`): it parses the
run's conf (the trigger form's Params, or the hand-over of the previous attempt), gives a first
attempt its training run id, applies the form's overrides to the spec, validates it for this
deployment and pushes the job, the conf and the cluster — every later task of the DAG run reads
them from here, so a spec edited mid-run cannot change a running attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from trainyard.operators.common import log_problems, opened_of, push_opened, runtime, to_xcom

if TYPE_CHECKING:
    from airflow.sdk import Context


class ValidateSpecOperator(BaseOperator):
    """Schema, rules, the launcher's devices, memory fit (the advisor), quota and dataset; opens
    the attempt. An invalid spec fails the task with its full report (no retry)."""

    ui_color = "#e8f4fd"
    template_fields = ("spec_path",)

    def __init__(self, *, spec_path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec_path = spec_path

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.attempt.steps import open_trigger

        dag_run = context["dag_run"]
        opened = open_trigger(self.spec_path, dict(context["params"]), dag_run.conf, dag_id=dag_run.dag_id,
                              dag_run_id=dag_run.run_id, when=dag_run.run_after, runtime=runtime())
        log_problems(self.log, opened.warnings)
        push_opened(context, opened)
        self.log.info("run %s attempt %d of %s: valid on cluster %r", opened.conf.run, opened.conf.attempt,
                      opened.job.name, opened.cluster)
        return {"job": opened.job.name, "run": opened.conf.run, "attempt": opened.conf.attempt}


VALIDATE_DATA = "validate_data"
CHECKED = "data_checked"
"""The XCom key of `check_data`'s result (with the data-quality report) for `launch_training`."""


class ValidateDataOperator(BaseOperator):
    """Data quality of the job's dataset (Great Expectations) when the spec asks for it."""

    ui_color = "#e8f4fd"

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.attempt.steps import check_data

        opened = opened_of(context)
        checked = check_data(opened, runtime())
        log_problems(self.log, checked.warnings)
        context["ti"].xcom_push(key=CHECKED, value=to_xcom(checked))
        if not checked.checked:
            self.log.info("no spec.dataset, or its quality checks are off: nothing to check")
        elif checked.unchanged:
            self.log.info("the dataset and its quality settings are unchanged since this run passed its checks "
                          "(fingerprint %s): not checked again", checked.fingerprint[:12])
        return {"checked": checked.checked, "unchanged": checked.unchanged, "run": opened.conf.run,
                "warnings": len(checked.warnings)}


class SpecIsInvalidOperator(BaseOperator):
    """The one task of an invalid spec's DAG (`dags/invalid_specs.py`): fails with the report, no
    retry — the spec must change first."""

    ui_color = "#e74c3c"
    template_fields = ()

    def __init__(self, *, report: str, **kwargs: Any) -> None:
        super().__init__(retries=0, **kwargs)
        self.report = report

    def execute(self, context: Context) -> None:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(f"this job's spec does not validate; nothing runs until it does:\n{self.report}")
