"""Stopping a training run on request: the gang of its live attempt, then its lifecycle.

`trainyard stop` and an Airflow "cancel" both call `stop_run`. The live attempt's processes
are found through the launcher handle stored in the job state (`plugins/recovery/state.py`),
so the stop works from any process, long after the one that launched them is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from plugins.recovery.model import FailureReport
from plugins.recovery.state import JobStateStore, RunInfo

if TYPE_CHECKING:
    from plugins.launch.base import Launcher
    from plugins.launch.model import RunStatus

USER_STOP = "user: trainyard stop"
"""The stop reason recorded in `stopped.json`: its `user` cause makes the classifier call the
attempt `cancelled` (never restarted)."""


@dataclass(frozen=True)
class StopResult:
    run: RunInfo
    attempt: int | None
    """The attempt whose gang was stopped (None: no live attempt)."""
    status: RunStatus | None
    already_final: bool = False


def stop_run(store: JobStateStore, launcher: Launcher, job: str, run: str = "", *,
             grace_s: float = 30.0, reason: str = USER_STOP) -> StopResult:
    """Stop the live attempt's gang (SIGTERM → emergency checkpoint → SIGKILL after `grace_s`),
    record the attempt as cancelled and the run as `cancelled`. A run already completed,
    failed or cancelled is left as it is."""
    info = store.get_run(job, run)
    if info.final:
        return StopResult(info, None, None, already_final=True)
    live = store.live_attempt(job, info.run)
    status = None
    if live is not None and live.run_handle is not None:
        status = launcher.stop(live.run_handle, grace_s, reason=reason)
    if live is not None:
        store.end_attempt(FailureReport(job=job, run=info.run, attempt=live.attempt, outcome="cancelled",
                                        reason=f"stopped on request ({reason})",
                                        step=status.step if status else None,
                                        evidence=[f"launcher: {status.state} — {status.message}"] if status else []))
    info = store.transition(job, info.run, "cancelled", reason=f"stopped on request ({reason})")
    return StopResult(info, live.attempt if live else None, status)
