"""What every Trainyard operator does the same way: read the attempt's contracts from XCom,
translate engine errors into Airflow's retry semantics, and push JSON back.

- **Errors** (DESIGN §1): `RETRY_POLICY` maps `plugins.errors` to Airflow's retry decision by
  class — a `TransientError` (a lost reservation race, an unreachable agent) is retried after a
  short delay, a `FatalError` (an invalid spec, nothing fits) fails at once with its message in
  the UI. Anything else falls through to the task's `retries`.
- **XCom** carries the pydantic contracts as JSON objects (never pickles), so the UI shows them
  readable and every reader validates what it reads.

Imports nothing heavy: the DAG file imports the operators.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy, RetryAction, RetryRule

if TYPE_CHECKING:
    from airflow.sdk import Context
    from pydantic import BaseModel

    from config.settings import Settings

M = TypeVar("M", bound="BaseModel")

VALIDATE = "validate_spec"
"""The first task: it opens the attempt and pushes the effective job and the attempt's conf."""

RETRY_POLICY = ExceptionRetryPolicy(rules=[
    RetryRule(exception="plugins.errors.FatalError", action=RetryAction.FAIL,
              reason="fatal: retrying the same input cannot succeed"),
    RetryRule(exception="plugins.errors.TransientError", action=RetryAction.RETRY,
              retry_delay=timedelta(seconds=5), reason="transient: the world was not ready; retrying"),
])


def task_defaults(owner: str = "trainyard") -> dict[str, Any]:
    """Default arguments of every task of a job's DAG: retries (DESIGN §9: a deferrable task
    can be failed by Airflow itself right after a fast trigger; every task is idempotent, so a
    retry re-attaches), the engine-error retry policy, the owning team."""
    return {"owner": owner, "retries": 2, "retry_delay": timedelta(seconds=5), "retry_policy": RETRY_POLICY}


def settings() -> Settings:
    from config.settings import get_settings

    return get_settings()


def to_xcom(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")


def pull(context: Context, task_id: str, model: type[M], *, key: str = "return_value") -> M:
    """The contract another task of this DAG run pushed; a missing one is a bug in the DAG."""
    value = context["ti"].xcom_pull(task_ids=task_id, key=key)
    if value is None:
        raise LookupError(f"task {task_id!r} pushed no {model.__name__} (XCom key {key!r})")
    return model.model_validate(value)


def pull_optional(context: Context, task_id: str, model: type[M], *, key: str = "return_value") -> M | None:
    value = context["ti"].xcom_pull(task_ids=task_id, key=key)
    return None if value is None else model.model_validate(value)


def attempt_of(context: Context) -> tuple[Any, Any]:
    """(effective TrainingJob, AttemptConf) as `validate_spec` pushed them."""
    from config.spec import TrainingJob
    from plugins.recovery.model import AttemptConf

    return pull(context, VALIDATE, TrainingJob, key="job"), pull(context, VALIDATE, AttemptConf, key="conf")
