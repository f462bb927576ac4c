"""The MLflow side of an attempt's end and of a run's: the recovery events, the registered
model, the loss plot, the recovery timeline and the cost. Called through the attempt listener
(`listener.MlflowListener`: `concluded`, `registered`, `closed`), never by the steps themselves.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.attempt.bookkeeping import AttemptResult
    from trainyard.plugins.tracking.registry import ModelVersionInfo
    from trainyard.plugins.tracking.runs import LoggedCheckpoint


def record_in_mlflow(result: AttemptResult, mlflow_run_id: str, *, tracking_uri: str) -> None:
    """A failure becomes a recovery event of the run (cause, step, what was done, time to detect,
    steps lost); each in-place torchrun restart of the attempt one more; a final action sets the
    run's status. Keyed by run, attempt and cause, so a retried task records each once."""
    from trainyard.plugins.tracking.runs import (
        log_recovery_event,
        log_recovery_timings,
        set_run_status,
    )

    report, action = result.report, result.action
    if report.restarts_in_place:
        log_recovery_event(mlflow_run_id, "worker_crash", attempt=report.attempt, step=report.step or 0,
                           detail=f"fast path: torchrun restarted the workers in place "
                                  f"{report.restarts_in_place} time(s) from the newest valid checkpoint, "
                                  "counted against faultTolerance.maxRestarts",
                           tracking_uri=tracking_uri, key=f"{report.run}/{report.attempt}/in_place")
    if report.failed:
        detail = f"{report.reason}; {action.kind}: {action.reason}"
        log_recovery_event(mlflow_run_id, report.outcome, attempt=report.attempt, step=report.step or 0,
                           detail=detail, tracking_uri=tracking_uri, duration_s=report.time_to_detect_s,
                           key=f"{report.run}/{report.attempt}/{report.outcome}", resume_step=report.resume_step,
                           at=report.detected_at)
        log_recovery_timings(mlflow_run_id, step=report.step or 0, tracking_uri=tracking_uri,
                             time_to_detect_s=report.time_to_detect_s, steps_lost=report.steps_lost)
    if action.retries:
        set_run_status(mlflow_run_id, "recovering", tracking_uri=tracking_uri)
    elif action.kind == "give_up":
        set_run_status(mlflow_run_id, "failed", tracking_uri=tracking_uri)
    elif action.kind == "cancel":
        set_run_status(mlflow_run_id, "cancelled", tracking_uri=tracking_uri)


def register_model(job: TrainingJob, settings: Settings, *, mlflow_run_id: str,
                   max_steps: int | None = None) -> ModelVersionInfo:
    """Export the run's best valid checkpoint (by the spec's `keepBestMetric`, else the newest)
    and register it as the next version of the job's model; `candidate` moves to it only under
    the spec's rule (`spec.registration.candidate`, with `max_steps` the spec's own maxSteps —
    `plugins/tracking/candidate.py`), and the version's `candidate_note` says why or why not.

    Exactly once per (MLflow run, checkpoint step, manifest SHA-256): a retried `register_model`
    task, or a second call, finds the version the first one made by its lineage tags and returns
    it (pointing `candidate` at it, should the first have stopped before the alias) instead of
    logging a second LoggedModel and version. The export is written under the run's own folder
    (`<runs>/<job>/<run>/export/`, the job's area, not the machine's /tmp) and removed after.
    """
    import shutil

    from trainyard.plugins.checkpoint.uris import area_for
    from trainyard.plugins.tracking.candidate import apply_candidate_rule
    from trainyard.plugins.tracking.registry import (
        DEFAULT_ALIAS,
        _check_manifest_digest,
        find_export,
        register_safetensors,
        select_checkpoint,
    )

    uri = settings.mlflow_tracking_uri
    record = select_checkpoint(mlflow_run_id, tracking_uri=uri, metric=job.spec.checkpoint.keep_best_metric)
    made = registered_version(job.name, mlflow_run_id, record, tracking_uri=uri)
    rule = job.spec.registration.candidate
    if made is not None:
        return apply_candidate_rule(made, rule, alias=DEFAULT_ALIAS, max_steps=max_steps,
                                    mlflow_run_id=mlflow_run_id, tracking_uri=uri)[0]
    folder = export_folder(job, settings, mlflow_run_id)
    shutil.rmtree(folder, ignore_errors=True)  # what an interrupted try left
    folder.mkdir(parents=True)
    try:
        weights = folder / "model.safetensors"
        find_export()(record.manifest_uri, weights, endpoint_url=settings.s3_endpoint_url, job=job.name,
                      area=area_for(job, settings.object_store), scratch_dir=folder)
        _check_manifest_digest(weights, record)
        made = register_safetensors(weights, run_id=mlflow_run_id, checkpoint=record, tracking_uri=uri,
                                    model_name=job.name, alias="")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return apply_candidate_rule(made, rule, alias=DEFAULT_ALIAS, max_steps=max_steps, mlflow_run_id=mlflow_run_id,
                                tracking_uri=uri)[0]


def registered_version(name: str, mlflow_run_id: str, record: LoggedCheckpoint, *,
                       tracking_uri: str) -> ModelVersionInfo | None:
    """The version of model `name` registered from this run's checkpoint (its step and manifest
    SHA-256, as the lineage tags say), or None; the oldest if there are several."""
    from mlflow.exceptions import MlflowException

    from trainyard.plugins.tracking.registry import ModelVersionInfo
    from trainyard.plugins.tracking.runs import TAG, client_for, quote_filter_value

    clauses = [f"name = {quote_filter_value(name)}",
               f"tags.`{TAG}run_id` = {quote_filter_value(mlflow_run_id)}",
               f"tags.`{TAG}checkpoint.step` = {quote_filter_value(str(record.step))}",
               f"tags.`{TAG}checkpoint.sha256` = {quote_filter_value(record.sha256)}"]
    try:
        found = client_for(tracking_uri).search_model_versions(" AND ".join(clauses))
    except MlflowException:  # no such registered model yet: nothing registered
        return None
    if not found:
        return None
    return ModelVersionInfo.from_mlflow(min(found, key=lambda mv: int(mv.version)))


def export_folder(job: TrainingJob, settings: Settings, mlflow_run_id: str) -> Path:
    """`<runs>/<job>/<run>/export`: the training run's own folder (its id from the MLflow run's
    `trainyard.run` tag; the MLflow run id for a run started outside the platform)."""
    from trainyard.plugins.tracking.runs import TAG, client_for

    run = client_for(settings.mlflow_tracking_uri).get_run(mlflow_run_id).data.tags.get(TAG + "run") or mlflow_run_id
    return settings.runs_dir / job.name / run / "export"


def run_timeline(job: str, run: str, settings: Settings) -> list[tuple[float, str]]:
    """What happened to a training run, from the job state: (seconds since the run opened, event)."""
    from trainyard.plugins.state.jobs import open_job_state

    state = open_job_state(settings.state_db)
    info = state.get_run(job, run)
    t0 = info.created_at
    events: list[tuple[float, str]] = [(0.0, f"run {run} opened")]
    for a in state.attempts(job, run):
        handle = a.run_handle
        nodes = f" on {', '.join(handle.nodes)}" if handle and handle.nodes else ""
        events.append(((a.started_at - t0).total_seconds(), f"attempt {a.attempt} started{nodes}"))
        if a.ended_at is not None:
            what = f"attempt {a.attempt} {a.outcome or 'ended'}"
            what += f" at step {a.step}" if a.step is not None else ""
            what += f": {a.reason}" if a.reason and a.outcome != "completed" else ""
            what += f" → {a.action}" if a.action else ""
            events.append(((a.ended_at - t0).total_seconds(), what))
    return events


OUTCOME_TAG = "trainyard.outcome"
"""The MLflow run's tag holding the run's one-line outcome (`recovery.outcome.outcome_line`)."""


def tag_outcome(mlflow_run_id: str, state: str, final_reason: str, *, tracking_uri: str) -> None:
    """Write the run's one-line outcome on its MLflow run (tag `trainyard.outcome`), once it is over."""
    from trainyard.plugins.recovery.outcome import RunOutcome
    from trainyard.plugins.tracking.runs import client_for

    outcome = RunOutcome.of_run(state, final_reason)
    if outcome.over:
        client_for(tracking_uri).set_tag(mlflow_run_id, OUTCOME_TAG, outcome.line[:5000])


def close_run(job: TrainingJob, settings: Settings, *, run: str, mlflow_run_id: str,
              status: Literal["completed", "failed", "cancelled"] = "completed") -> dict[str, float]:
    """End the run's MLflow run: its end artifacts (loss plot, recovery timeline), its cost —
    device time by phase from the job state (attempts are training, the gaps between them
    recovery), MFU and tokens/s from what the workers streamed — and its final status.
    Returns the cost figures."""
    from trainyard.config.cluster import cluster_for
    from trainyard.plugins.state.jobs import open_job_state
    from trainyard.plugins.tracking.cost import RunAccounting, job_cost, log_job_cost
    from trainyard.plugins.tracking.lifecycle import close_tracked_run
    from trainyard.plugins.tracking.rates import load_rates
    from trainyard.plugins.tracking.runs import client_for

    state = open_job_state(settings.state_db)
    info, attempts = state.get_run(job.name, run), state.attempts(job.name, run)
    tag_outcome(mlflow_run_id, info.state, info.final_reason, tracking_uri=settings.mlflow_tracking_uri)
    logs = [(a.attempt, Path(h.run_dir) / "ranks") for a in attempts if (h := a.run_handle) is not None and h.run_dir]
    spans = [(a.started_at, a.ended_at) for a in attempts if a.ended_at is not None]
    if not spans:
        close_tracked_run(mlflow_run_id, status, tracking_uri=settings.mlflow_tracking_uri, title=job.name,
                          rank_logs=logs)
        return {}
    training = sum((end - start).total_seconds() for start, end in spans)
    recovery = sum(max((nxt[0] - prev[1]).total_seconds(), 0.0) for prev, nxt in itertools.pairwise(spans))
    acct = RunAccounting(
        job=job.name, team=job.metadata.team, project=job.metadata.project, gpu_type=job.spec.hardware.gpu_type,
        gpu_count=job.spec.hardware.gpu_count, submitted_at=info.created_at, started_at=spans[0][0],
        ended_at=spans[-1][1], training_s=training, recovery_s=recovery, run_id=mlflow_run_id,
        precision=job.spec.parallelism.hints.mixed_precision if job.spec.parallelism.hints else "bf16",
    ).with_run_metrics(dict(client_for(settings.mlflow_tracking_uri).get_run(mlflow_run_id).data.metrics))
    cost = job_cost(acct, load_rates(), cluster=cluster_for(job.spec.hardware.gpu_type, settings.cluster))
    log_job_cost(mlflow_run_id, acct, cost, tracking_uri=settings.mlflow_tracking_uri)
    close_tracked_run(mlflow_run_id, status, tracking_uri=settings.mlflow_tracking_uri,
                      timeline=run_timeline(job.name, run, settings), title=f"{job.name} run {run}", rank_logs=logs)
    return {"device_hours": cost.total_gpu_hours, "recovery_device_hours": cost.recovery_gpu_hours,
            "cost_usd": cost.total_cost_usd}
