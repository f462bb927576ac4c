"""`validate_spec` and `validate_data`: the dry run, before any accelerator is allocated.

`validate_spec` also opens the attempt: it parses the run's conf (the trigger form's Params, or
the hand-over of the previous attempt), gives a first attempt its training run id, applies the
form's overrides to the spec and pushes both — every later task of the DAG run reads the job
and the conf from here, so a spec edited mid-run cannot change a running attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from operators.common import attempt_of, settings, to_xcom

if TYPE_CHECKING:
    from airflow.sdk import Context

    from config.problems import Problem


def _report(problems: list[Problem], *, what: str) -> str:
    errors = [p for p in problems if p.severity == "error"]
    lines = [f"{p.code.value} {p.render()}" for p in errors]
    return f"{what}: {len(errors)} error(s)\n" + "\n".join(lines)


class ValidateSpecOperator(BaseOperator):
    """Schema, rules, cluster fit, memory fit (the advisor) and quota; opens the attempt."""

    ui_color = "#e8f4fd"
    template_fields = ("spec_path",)

    def __init__(self, *, spec_path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec_path = spec_path

    def execute(self, context: Context) -> dict[str, Any]:
        from config.cluster import cluster_for
        from config.loader import load_spec_file
        from config.problems import SpecError
        from plugins.recovery.steps import effective_job, open_attempt, trigger_conf
        from plugins.validation.dry_run import validate_job

        dag_run = context["dag_run"]
        conf = open_attempt(trigger_conf(dict(context["params"]), dag_run.conf),
                            dag_id=dag_run.dag_id, trigger_run_id=dag_run.run_id,
                            when=dag_run.run_after)
        try:
            job = effective_job(load_spec_file(self.spec_path), conf)
        except (SpecError, ValueError) as e:
            raise AirflowFailException(f"{self.spec_path}: {e}") from e
        config = settings()
        cluster = cluster_for(job.spec.hardware.gpu_type, config.cluster)
        problems = validate_job(job, cluster=cluster, settings=config)
        for p in problems:
            (self.log.error if p.severity == "error" else self.log.warning)("%s %s", p.code.value, p.render())
        if any(p.severity == "error" for p in problems):
            raise AirflowFailException(_report(problems, what=f"{job.name} is invalid"))
        from plugins.recovery.steps import begin, check_conf_points

        check_conf_points(conf, job, object_store=config.object_store)  # another job's checkpoint: no

        begin(job, conf, config, trigger_key=f"{dag_run.dag_id}/{dag_run.run_id}")
        context["ti"].xcom_push(key="job", value=job.model_dump(mode="json", by_alias=True))
        context["ti"].xcom_push(key="conf", value=to_xcom(conf))
        self.log.info("run %s attempt %d of %s: valid on cluster %r", conf.run, conf.attempt, job.name, cluster.name)
        return {"job": job.name, "run": conf.run, "attempt": conf.attempt}


class ValidateDataOperator(BaseOperator):
    """Data quality of the job's dataset (Great Expectations) when the spec asks for it."""

    ui_color = "#e8f4fd"

    def execute(self, context: Context) -> dict[str, Any]:
        job, conf = attempt_of(context)
        if not job.spec.dataset.quality.enabled:
            self.log.info("spec.dataset.quality is off: nothing to check")
            return {"checked": False}
        from plugins.validation.data_quality import data_quality_problems

        problems = data_quality_problems(job, settings())
        for p in problems:
            (self.log.error if p.severity == "error" else self.log.warning)("%s %s", p.code.value, p.render())
        if any(p.severity == "error" for p in problems):
            raise AirflowFailException(_report(problems, what=f"dataset of {job.name} fails its quality checks"))
        return {"checked": True, "run": conf.run, "warnings": len(problems)}
