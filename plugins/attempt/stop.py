"""Stopping a training run on request: the gang of its live attempt, then its lifecycle.

`trainyard stop`, the Trainyard view's Stop button and a watcher that a person marked failed in
Airflow (`sensors/triggers.py`: `TrainingTrigger.on_kill`) call `stop_run`. The live attempt's processes are
found through the launcher handle stored in the job state (`plugins/state/jobs.py`), so the
stop works from any process, long after the one that launched them is gone; the gang is stopped
the one way the control plane stops gangs (`plugins.attempt.watching.stop_gang`), with the reason `requested`,
which `classify` reads as `cancelled` (never restarted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainyard.plugins.recovery.model import FailureReport
from trainyard.plugins.state.jobs import JobStateStore, RunInfo

if TYPE_CHECKING:
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.run.model import RunStatus


@dataclass(frozen=True)
class StopResult:
    run: RunInfo
    attempt: int | None
    """The attempt whose gang was stopped (None: no live attempt)."""
    status: RunStatus | None
    already_final: bool = False


def stop_run(store: JobStateStore, job: str, runtime: Runtime, run: str = "", *, grace_s: float = 30.0,
             detail: str = "trainyard stop", attempt: int | None = None) -> StopResult:
    """Stop the live attempt's gang (SIGTERM → emergency checkpoint → SIGKILL after `grace_s`),
    record the attempt as cancelled and the run as `cancelled` (in the job state and on its MLflow
    run), and release the attempt's reservation. A run already completed, failed or cancelled is
    left as it is; so is one whose live attempt is not `attempt`, where given (a watcher of an
    attempt that has ended must not stop the next one)."""
    from trainyard.plugins.attempt.watching import stop_gang
    from trainyard.plugins.run.records import StopReason

    info = store.get_run(job, run)
    if info.final:
        return StopResult(info, None, None, already_final=True)
    live = store.live_attempt(job, info.run)
    if attempt is not None and (live is None or live.attempt != attempt):
        return StopResult(info, None, None)
    handle = live.run_handle if live is not None else None
    status = stop_gang(handle, StopReason(reason="requested", detail=detail), runtime, grace_s=grace_s) if handle else None
    reason = f"stopped on request ({detail})"
    if live is not None:
        store.end_attempt(FailureReport(
            job=job, run=info.run, attempt=live.attempt, outcome="cancelled", reason=reason,
            step=status.step if status else None,
            evidence=[f"launcher: {status.state} — {status.message}"] if status else []))
    _mlflow_cancelled(info.mlflow_run_id, runtime)  # first: whoever sees the run cancelled sees it everywhere
    info = store.transition(job, info.run, "cancelled", reason=reason)
    if live is not None:  # the devices are free once the gang is gone (a teardown task may repeat it)
        from trainyard.plugins.state.reservations import open_state

        open_state(store.url).release(job, live.attempt, run=info.run)
    return StopResult(info, live.attempt if live else None, status)


def _mlflow_cancelled(mlflow_run_id: str, runtime: Runtime) -> None:
    """The MLflow run says `cancelled` at once, as the job state does: a DAG run marked failed
    runs none of the tasks that would record it later (best effort: the stop has happened)."""
    if not mlflow_run_id:
        return
    import logging

    from trainyard.plugins.tracking.runs import set_run_status

    try:
        set_run_status(mlflow_run_id, "cancelled", tracking_uri=runtime.settings.mlflow_tracking_uri)
    except Exception as e:  # noqa: BLE001 - MLflow down: the job state already says cancelled
        logging.getLogger(__name__).warning("MLflow run %s not marked cancelled: %s: %s", mlflow_run_id,
                                            type(e).__name__, e)
