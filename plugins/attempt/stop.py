"""Stopping a training run on request: the gang of its live attempt, then its lifecycle.

`trainyard stop` (and an Airflow "cancel") call `stop_run`. The live attempt's processes are
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
             detail: str = "trainyard stop") -> StopResult:
    """Stop the live attempt's gang (SIGTERM → emergency checkpoint → SIGKILL after `grace_s`),
    record the attempt as cancelled and the run as `cancelled`, and release the attempt's
    reservation. A run already completed, failed or cancelled is left as it is."""
    from trainyard.plugins.attempt.watching import stop_gang
    from trainyard.plugins.run.records import StopReason

    info = store.get_run(job, run)
    if info.final:
        return StopResult(info, None, None, already_final=True)
    live = store.live_attempt(job, info.run)
    handle = live.run_handle if live is not None else None
    status = stop_gang(handle, StopReason(reason="requested", detail=detail), runtime, grace_s=grace_s) if handle else None
    reason = f"stopped on request ({detail})"
    if live is not None:
        store.end_attempt(FailureReport(
            job=job, run=info.run, attempt=live.attempt, outcome="cancelled", reason=reason,
            step=status.step if status else None,
            evidence=[f"launcher: {status.state} — {status.message}"] if status else []))
    info = store.transition(job, info.run, "cancelled", reason=reason)
    if live is not None:  # the devices are free once the gang is gone (a teardown task may repeat it)
        from trainyard.plugins.state.reservations import open_state

        open_state(store.url).release(job, live.attempt, run=info.run)
    return StopResult(info, live.attempt if live else None, status)
