"""`AttemptListener`: what an attempt tells its record keeper, one hook per event, and
`MlflowListener`, the keeper every deployment has — the job's MLflow run.

The steps (`steps.py`) do the attempt's work and call one hook per event, one line each:

    launch    created       → the run id   the tracked run created (attempt 0) or continued, with the
                                           dataset, the plan explained by the advisor's answer the
                                           attempt planned with, and the data-quality report
              not_launched                 the launcher refused the gang: the run ends failed
              launched                     the gang runs: a later attempt's time to resume
    watching  checkpointed                 a checkpoint the watcher verified, recorded on the run
    conclude  concluded                    recovery events, timings and the status the action sets
    register  registered    → the version  the run's best valid checkpoint, a model version
    close     closed        → the cost     end artifacts, cost, final status

`listener_for` is the one place that picks the listener, as `launcher_for` picks the launcher.

Errors: a hook raises what its MLflow call raises, exactly as the hand calls it replaces did —
the step fails and its task's retry repeats it (every record is idempotent: keyed by run, attempt
and cause, or replaced when logged again). What tracking already tolerates it still tolerates
inside (`open_tracked_run`: a dataset that cannot be described or checked; `close_tracked_run`:
rank logs that cannot be attached). Without an MLflow run id (a run opened before tracking, a
dry run) the hooks that record on a run do nothing, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.plugins.attempt.bookkeeping import AttemptResult
    from trainyard.plugins.attempt.steps import DataChecked, Opened, Planned
    from trainyard.plugins.launch.base import Runtime
    from trainyard.plugins.run.model import RunHandle
    from trainyard.plugins.tracking.registry import ModelVersionInfo

RunEnd = Literal["completed", "failed", "cancelled"]
"""How a run ends (the `close` step's status)."""


class AttemptListener(Protocol):
    """The attempt's events, as the steps announce them (module docstring: which step, what for)."""

    def created(self, opened: Opened, planned: Planned, checked: DataChecked | None) -> str: ...

    def not_launched(self, mlflow_run_id: str) -> None: ...

    def launched(self, opened: Opened, handle: RunHandle, mlflow_run_id: str, *,
                 resumed_after_s: float | None) -> None: ...

    def checkpointed(self, mlflow_run_id: str, manifest_uri: str) -> None: ...

    def concluded(self, result: AttemptResult, mlflow_run_id: str) -> None: ...

    def registered(self, opened: Opened, mlflow_run_id: str) -> ModelVersionInfo: ...

    def closed(self, opened: Opened, mlflow_run_id: str, status: RunEnd) -> dict[str, float]: ...


def listener_for(runtime: Runtime) -> AttemptListener:
    """The listener of this deployment's attempts: its MLflow tracking server."""
    return MlflowListener(runtime.settings)


class MlflowListener:
    """The job's MLflow run as the attempt's record: one run for every attempt of a training run
    (DESIGN §4), its start artifacts on the first."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def created(self, opened: Opened, planned: Planned, checked: DataChecked | None) -> str:
        """Create (attempt 0) or continue the run; returns its id. The data-quality checks run
        once per attempt: `check_data`'s report is logged as it is, and only an attempt that did
        not run `check_data` (`trainyard launch`, checks turned off) has tracking check here."""
        from trainyard.plugins.attempt.describing import describe_run
        from trainyard.plugins.tracking.lifecycle import open_tracked_run

        job, conf = opened.job, opened.conf
        rid = open_tracked_run(
            job, planned.plan, self.settings, attempt=conf.attempt, run_id=conf.mlflow_run_id or None, run=conf.run,
            check_quality=conf.attempt == 0 and not (checked and checked.checked),
            quality=checked.report if checked else None, advice=planned.advice, plan_source=planned.source)
        describe_run(job.name, conf.run, rid, self.settings)
        return rid

    def not_launched(self, mlflow_run_id: str) -> None:
        """Nothing runs: the run `created` opened ends failed, not running."""
        from trainyard.plugins.tracking.runs import set_run_status

        set_run_status(mlflow_run_id, "failed", tracking_uri=self.settings.mlflow_tracking_uri)

    def launched(self, opened: Opened, handle: RunHandle, mlflow_run_id: str, *,
                 resumed_after_s: float | None) -> None:
        """A later attempt's gang started: the previous attempt's time to resume (its detection to
        this start, from the job state) as the metric `recovery/time_to_resume_s`."""
        if resumed_after_s is None or not mlflow_run_id:
            return
        from trainyard.plugins.tracking.runs import log_recovery_timings

        log_recovery_timings(mlflow_run_id, step=0, tracking_uri=self.settings.mlflow_tracking_uri,
                             time_to_resume_s=resumed_after_s, attempt=opened.conf.attempt - 1)

    def checkpointed(self, mlflow_run_id: str, manifest_uri: str) -> None:
        """A verified checkpoint on the run (idempotent: the worker's rank 0 recorded it first)."""
        if not mlflow_run_id:
            return
        from trainyard.plugins.tracking.runs import log_committed_checkpoint

        log_committed_checkpoint(mlflow_run_id, manifest_uri, tracking_uri=self.settings.mlflow_tracking_uri,
                                 endpoint_url=self.settings.s3_endpoint_url)

    def concluded(self, result: AttemptResult, mlflow_run_id: str) -> None:
        if not mlflow_run_id:
            return
        from trainyard.plugins.attempt.closing import record_in_mlflow

        record_in_mlflow(result, mlflow_run_id, tracking_uri=self.settings.mlflow_tracking_uri)
        from trainyard.plugins.attempt.describing import describe_run

        report = result.report
        describe_run(report.job, report.run, mlflow_run_id, self.settings,
                     reason=f"{report.reason}; {result.action.kind}: {result.action.reason}" if report.failed else "")

    def registered(self, opened: Opened, mlflow_run_id: str) -> ModelVersionInfo:
        from trainyard.plugins.attempt.closing import register_model

        return register_model(opened.job, self.settings, mlflow_run_id=mlflow_run_id,
                              max_steps=opened.spec_max_steps)

    def closed(self, opened: Opened, mlflow_run_id: str, status: RunEnd) -> dict[str, float]:
        from trainyard.plugins.attempt.closing import close_run
        from trainyard.plugins.attempt.describing import describe_run

        figures = close_run(opened.job, self.settings, run=opened.conf.run, mlflow_run_id=mlflow_run_id,
                            status=status)
        describe_run(opened.job.name, opened.conf.run, mlflow_run_id, self.settings)
        return figures
