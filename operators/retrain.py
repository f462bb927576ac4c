"""The promotion gate of a retraining DAG (`retrain.promote: manual`), after `register_model`:

```
register_model ─ evaluate ─ approve_promotion (Airflow HITL: Approve / Reject) ─ promote_model
```

`evaluate` scores the new version and the `production` one (`worker/evaluate.py`) and
pushes the approval's Markdown body; `approve_promotion` is Airflow's `ApprovalOperator` (the task
waits in `awaiting_input` until someone answers in the UI's "Required actions" or through
`PATCH …/taskInstances/approve_promotion/-1/hitlDetails`); a Reject skips `promote_model`, so the
alias stays; `promote_model` moves `production` (`registry.move_alias`) and records the approver.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import BaseOperator

from trainyard.operators.common import opened_of, settings

if TYPE_CHECKING:
    from airflow.sdk import Context

REGISTER = "register_model"
EVALUATE = "evaluate"
APPROVE = "approve_promotion"
PROMOTE = "promote_model"
APPROVAL_TIMEOUT = timedelta(days=7)
"""Unanswered for a week: the default answer (Reject) applies and `production` stays."""


class EvaluateModelOperator(BaseOperator):
    """Score the version `register_model` just made against the one at `production`."""

    ui_color = "#d6eaf8"

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.tracking.registry import PRODUCTION_ALIAS
        from trainyard.worker.evaluate import compare_with_production

        job = opened_of(context).job
        registered = context["ti"].xcom_pull(task_ids=REGISTER) or {}
        if not registered.get("version"):
            raise LookupError(f"task {REGISTER!r} pushed no model version")
        config = settings()
        samples = job.spec.retrain.eval_samples if job.spec.retrain else 32
        result = compare_with_production(job, registered["version"], tracking_uri=config.mlflow_tracking_uri,
                                         object_store=config.object_store, endpoint_url=config.s3_endpoint_url,
                                         samples=samples, baseline_alias=PRODUCTION_ALIAS)
        body = result.approval_body()
        self.log.info("%s", body)
        context["ti"].xcom_push(key="approval_body", value=body)
        return result.model_dump(mode="json") | {"improves": result.improves}


def approval(job_name: str) -> ApprovalOperator:
    """The human gate: both versions' metrics in the body, Reject by default on timeout."""
    return ApprovalOperator(
        task_id=APPROVE,
        subject=(f"Promote {job_name} version "
                 f"{{{{ ti.xcom_pull(task_ids='{EVALUATE}')['candidate']['version'] }}}} to production?"),
        body=f"{{{{ ti.xcom_pull(task_ids='{EVALUATE}', key='approval_body') }}}}",
        defaults="Reject", response_timeout=APPROVAL_TIMEOUT, retries=0,
    )


class PromoteModelOperator(BaseOperator):
    """Approved: move `production` to the evaluated version (skipped on Reject)."""

    ui_color = "#abebc6"

    def execute(self, context: Context) -> dict[str, Any]:
        from trainyard.plugins.tracking.registry import PRODUCTION_ALIAS, move_alias

        job = opened_of(context).job
        evaluated = context["ti"].xcom_pull(task_ids=EVALUATE) or {}
        answer = context["ti"].xcom_pull(task_ids=APPROVE) or {}
        version = str(evaluated["candidate"]["version"])
        by = str((answer.get("responded_by_user") or {}).get("name", ""))
        before = move_alias(job.name, PRODUCTION_ALIAS, version, tracking_uri=settings().mlflow_tracking_uri, by=by)
        self.log.info("%s: production moved from version %s to %s, approved by %s", job.name, before, version,
                      by or "(unknown)")
        return {"model": job.name, "alias": PRODUCTION_ALIAS, "version": version, "previous": before, "by": by}
