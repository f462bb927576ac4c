"""What every Trainyard operator does the same way: read the attempt's contracts from XCom,
call one step of the attempt engine (`plugins/attempt/steps.py`), translate engine errors into
Airflow's retry semantics, and push JSON back.

- **Errors** (DESIGN §1): `RETRY_POLICY` maps `trainyard.plugins.errors` to Airflow's retry decision by
  class — a `TransientError` (a lost reservation race, an unreachable agent) is retried after a
  short delay, a `FatalError` (an invalid spec, nothing fits) fails at once with its message in
  the UI. Anything else falls through to the task's `retries`.
- **XCom** carries the pydantic contracts as JSON objects (never pickles), so the UI shows them
  readable and every reader validates what it reads.

Imports nothing heavy: the DAG file imports the operators.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy, RetryAction, RetryRule

if TYPE_CHECKING:
    from airflow.sdk import Context
    from pydantic import BaseModel

    from trainyard.config.problems import Problem
    from trainyard.config.settings import Settings
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.attempt.steps import Opened

M = TypeVar("M", bound="BaseModel")
log = logging.getLogger(__name__)

VALIDATE = "validate_spec"
"""The first task: it opens the attempt and pushes the effective job and the attempt's conf."""

RETRY_POLICY = ExceptionRetryPolicy(rules=[
    RetryRule(exception="trainyard.plugins.errors.FatalError", action=RetryAction.FAIL,
              reason="fatal: retrying the same input cannot succeed"),
    RetryRule(exception="trainyard.plugins.errors.TransientError", action=RetryAction.RETRY,
              retry_delay=timedelta(seconds=5), reason="transient: the world was not ready; retrying"),
])


def fail_plainly(message: str) -> NoReturn:
    """End the running task failed with `message` and no traceback. For the tasks whose failure
    is the verdict, not an error (`attempt_failed`, `give_up`, `cancelled`: their diagnosis is
    logged just before): Airflow's task runner logs a traceback with every exception but
    `SystemExit`, which it logs as one line, `Task exited exit_code=<message>` — a traceback of
    our own `raise` was what a person saw under the diagnosis in "Recent failed task logs". A
    `SystemExit` is retried like any failure: the callers have `retries=0`."""
    raise SystemExit(message)


def task_defaults(owner: str = "trainyard") -> dict[str, Any]:
    """Default arguments of every task of a job's DAG: retries (DESIGN §9: a deferrable task
    can be failed by Airflow itself right after a fast trigger; every task is idempotent, so a
    retry re-attaches), the engine-error retry policy, the owning team."""
    return {"owner": owner, "retries": 2, "retry_delay": timedelta(seconds=5), "retry_policy": RETRY_POLICY}


def settings() -> Settings:
    from trainyard.config.settings import get_settings

    return get_settings()


def runtime() -> Runtime:
    """The engine's runtime inside Airflow: the settings, and Kubernetes clients from the
    cncf-kubernetes provider's `KubernetesHook` on `TRAINYARD_KUBERNETES_CONN_ID`."""
    from trainyard.operators.kubernetes_clients import kubernetes_clients
    from trainyard.plugins.attempt.launchers import Runtime

    return Runtime(settings(), kube_clients=kubernetes_clients)


def log_problems(log: Any, problems: list[Problem]) -> None:
    for p in problems:
        (log.error if p.severity == "error" else log.warning)("%s %s", p.code.value, p.render())


def note_dag_run(context: Context, note: str) -> None:
    """Write the DAG run's note through Airflow's REST API (a task has no other way to): the
    grid then says what happened to the attempt, not just green or red. Best effort — a note that
    cannot be written is logged, never a reason to fail the attempt."""
    write_note(context["dag_run"].dag_id, context["dag_run"].run_id, note)


def write_note(dag_id: str, run_id: str, note: str) -> None:
    """`note_dag_run` for a caller without a task's context (the training trigger's `on_kill`)."""
    from trainyard.plugins.airflow_api import AirflowClient

    try:
        AirflowClient.of(settings(), patience_s=20).set_note(dag_id, run_id, note)
    except Exception as e:  # noqa: BLE001 - the note is presentation; the attempt's outcome stands
        log.warning("the DAG run's note was not written (%s: %s): %s", type(e).__name__, e, note)


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


OPENED = "opened"
"""The XCom key of the attempt as `validate_spec` opened it."""


def push_opened(context: Context, opened: Opened) -> None:
    """What `validate_spec` hands every later task — the effective job, the conf, the cluster,
    the advisor's answer its memory check read (`plan_parallelism` plans with it) — as one XCom:
    every task of the attempt pulls it, and each pull is a request to the API server (three keys
    were 570 of a CI stack's 971 XCom reads)."""
    context["ti"].xcom_push(key=OPENED, value=opened.model_dump(mode="json", by_alias=True, exclude={"warnings"}))


def opened_of(context: Context) -> Opened:
    """The attempt as `validate_spec` opened it (a spec edited mid-run cannot change it)."""
    from trainyard.plugins.attempt.steps import Opened

    return pull(context, VALIDATE, Opened, key=OPENED)
