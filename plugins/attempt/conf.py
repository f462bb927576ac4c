"""The control plane's steps for one attempt of a training run (DESIGN §4), as plain functions.

Each Airflow task of a job's DAG is one of these, wrapped by a thin operator; `trainyard launch`
and the demo call the same ones. What each step decides (which run this trigger opened, which
plan the attempt runs, where it resumes, what the worker is told) is decided here, once:

- `open_attempt`     the attempt's conf: a first trigger opens a new run (its id derived from the
                     Airflow run, so a retried task gets the same one); later attempts carry theirs;
- `effective_job`    the spec with the trigger's overrides (max steps, learning rate);
- `plan_attempt`     the plan: the one a re-plan handed over, else the advisor's / the manual one;
- `resume_point`     the manifest the attempt restores (explicit, a registered model's, or none:
                     the run's newest valid checkpoint, which is a fresh start for a new run);
- `launch_attempt`   the worker environment (faults included) and a detached, idempotent submit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from config.runs import check_run_id
from plugins.errors import FatalError
from plugins.recovery.model import AttemptConf

if TYPE_CHECKING:
    from config.cluster import Cluster
    from config.settings import Settings
    from config.spec import TrainingJob
    from plugins.advisor.plan import Plan
    from plugins.launch.local import LocalLauncher
    from plugins.launch.model import RunHandle, RunStatus
    from plugins.placement.model import Placement
    from plugins.recovery.engine import AttemptResult


class InvalidConf(FatalError):
    """A DAG run's conf (or trigger form) that does not parse as an `AttemptConf`."""


class NoPlan(FatalError):
    """Nothing fits: the advisor's suggestions say what to change."""


def run_id_for_trigger(dag_id: str, trigger_run_id: str, when: datetime) -> str:
    """The training run a first trigger opens: its start time plus a digest of the Airflow run,
    so every task (and every retry) of that DAG run derives the same id without a lookup."""
    digest = hashlib.sha256(f"{dag_id}/{trigger_run_id}".encode()).hexdigest()[:6]
    return check_run_id(f"{when:%Y%m%dt%H%M%S}-{digest}")


FAULT_PARAM_PREFIX = "fault_"
"""The trigger form shows each `FaultParams` field as a flat Param `fault_<field>`."""


def trigger_conf(params: dict[str, Any], conf: dict[str, Any] | None) -> dict[str, Any]:
    """One conf from the trigger form's Params and the DAG run's conf (the conf wins): the flat
    `fault_*` Params become the nested `faults`, unset (None) values are dropped."""
    merged = {**params, **(conf or {})}
    faults = dict(merged.get("faults") or {})
    for key in [k for k in merged if k.startswith(FAULT_PARAM_PREFIX)]:
        value = merged.pop(key)
        if value not in (None, "", False):
            faults[key.removeprefix(FAULT_PARAM_PREFIX)] = value
    merged["faults"] = faults
    return {k: v for k, v in merged.items() if v is not None}


def open_attempt(conf: dict[str, Any] | None, *, dag_id: str, trigger_run_id: str, when: datetime
                 ) -> AttemptConf:
    """Parse a DAG run's conf (Airflow hands Params and conf over together; unknown keys are
    errors, templated strings are coerced) and give a first attempt its run id."""
    from pydantic import ValidationError

    from config.safe_yaml import preview_value

    if conf is not None and not isinstance(conf, dict):
        raise InvalidConf(f"the run's conf is {type(conf).__name__}, not a mapping: {preview_value(conf)}")
    try:
        parsed = AttemptConf.model_validate({k: v for k, v in (conf or {}).items() if v is not None})
    except ValidationError as e:
        errors = e.errors(include_url=False)
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))[:100] or 'conf'}: {err['msg']} "
                             f"(got {preview_value(err.get('input'))})" for err in errors[:5])
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        raise InvalidConf(f"the run's conf is invalid: {problems}{more}") from e
    if parsed.run:
        return parsed
    if parsed.attempt:
        raise InvalidConf(f"attempt {parsed.attempt} names no run: only a first attempt opens one")
    return parsed.model_copy(update={"run": run_id_for_trigger(dag_id, trigger_run_id, when)})


def effective_job(job: TrainingJob, conf: AttemptConf) -> TrainingJob:
    """The spec as this run trains it: the trigger form's overrides applied, revalidated."""
    from config.spec import TrainingJob as Model

    training: dict[str, Any] = {}
    if conf.max_steps is not None:
        training["maxSteps"] = conf.max_steps
    if conf.learning_rate is not None:
        training["learningRate"] = conf.learning_rate
    if not training:
        return job
    data = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spec"]["training"] = {**data["spec"].get("training", {}), **training}
    return Model.model_validate(data)


def plan_attempt(job: TrainingJob, cluster: Cluster, conf: AttemptConf, *, memory_fraction: float
                 ) -> tuple[Plan, str]:
    """(plan, where it came from): a re-plan handed over by the previous attempt wins."""
    from plugins.advisor.plan import Plan
    from plugins.placement.plans import plan_for_job

    if conf.plan:
        plan = Plan.model_validate_json(conf.plan)
        plan.check_world_size(job.spec.hardware.gpu_count)
        return plan, f"re-planned after attempt {conf.attempt - 1}"
    try:
        return plan_for_job(job, cluster, memory_fraction=memory_fraction)
    except ValueError as e:
        raise NoPlan(str(e)) from e


def resume_point(conf: AttemptConf, job: TrainingJob, *, tracking_uri: str, object_store: str) -> str:
    """The manifest URI the attempt restores, or '' for the run's newest valid checkpoint.

    A later attempt restores what the recovery decision named (a rollback, a fall-back) or, with
    nothing named, the newest valid checkpoint of its own run. A first attempt starts fresh unless
    its trigger asked to start from a checkpoint or a registered model (`models:/name@alias`:
    the checkpoint the version was exported from, recorded in its lineage tags) — or, with no
    `start_from`, `job`'s `retrain.startFromAlias` names an alias some version of its model holds.

    Whatever its source, the point must lie inside the job's own area (`uris.resolve_for_job`:
    `<store>/jobs/<job>/…` by path structure, or the spec's storage folder) or be the spec's
    read-only `checkpoint.initFrom`; anything else is `InvalidConf` here, before a gang starts.
    """
    return check_resume_point(_named_point(conf, job, tracking_uri=tracking_uri), job, object_store)


def check_conf_points(conf: AttemptConf, job: TrainingJob, *, object_store: str) -> None:
    """Refuse (`InvalidConf`) a conf whose resume or start point is a URI outside the job's
    area, at `validate_spec` — before a gang is placed. A `models:/` alias needs the registry
    and is resolved (and checked the same way) by `resume_point` at launch."""
    point = conf.resume_from if conf.attempt > 0 else conf.start_from.strip()
    if point and not point.startswith("models:/"):
        check_resume_point(point, job, object_store)


def _named_point(conf: AttemptConf, job: TrainingJob, *, tracking_uri: str) -> str:
    if conf.attempt > 0:
        return conf.resume_from
    start = conf.start_from.strip() or _retrain_start(job, tracking_uri=tracking_uri)
    if not start.startswith("models:/"):
        return start
    from plugins.tracking.runs import client_for

    name, sep, alias = start.removeprefix("models:/").partition("@")
    if not sep or not name or not alias:
        raise InvalidConf(f"start_from {start[:200]!r}: write models:/<name>@<alias>")
    version = client_for(tracking_uri).get_model_version_by_alias(name, alias)
    uri = version.tags.get("trainyard.checkpoint.uri", "")
    if not uri:
        raise InvalidConf(f"model {name} version {version.version} (alias {alias!r}) records no "
                          "checkpoint it was exported from (tag trainyard.checkpoint.uri)")
    return uri


def _retrain_start(job: TrainingJob | None, *, tracking_uri: str) -> str:
    """`models:/<job>@<alias>` when the spec's `retrain.startFromAlias` is held by a version, else
    '' (a first retraining run, before anything was promoted, starts fresh)."""
    alias = job.spec.retrain.start_from_alias if job is not None and job.spec.retrain is not None else None
    if not alias:
        return ""
    from plugins.tracking.evaluate import version_at

    return f"models:/{job.name}@{alias}" if version_at(job.name, alias, tracking_uri=tracking_uri) else ""


def check_resume_point(uri: str, job: TrainingJob, object_store: str) -> str:
    """`uri` when it names a manifest inside the job's area (or is its `initFrom`), '' for '';
    else `InvalidConf` naming the URI and why (`trainyard launch --resume-from` calls it too)."""
    if not uri:
        return ""
    from plugins.checkpoint.uris import resolve_for_job, split_manifest_uri
    from plugins.errors import TrainyardError

    try:
        split_manifest_uri(uri)
        return resolve_for_job(uri, job, object_store)
    except (TrainyardError, ValueError) as e:
        raise InvalidConf(f"resume point {uri[:300]!r} refused: {str(e)[:400]}") from e


def launcher(settings: Settings, *, max_restarts: int = 0) -> LocalLauncher:
    """The launcher of the embedded default (Kubernetes goes through `KubernetesLauncher`)."""
    from plugins.launch.local import REPO_ROOT, LocalLauncher

    return LocalLauncher(settings.runs_dir, source_dir=REPO_ROOT, max_restarts=max_restarts)


def launch_attempt(job: TrainingJob, plan: Plan, placement: Placement, conf: AttemptConf,
                   settings: Settings, *, mlflow_run_id: str, resume_from: str,
                   source_dir: Path | None = None) -> RunHandle:
    """Start the attempt's gang detached; a second call for the same attempt re-attaches."""
    from plugins.launch.environment import build_worker_env
    from plugins.launch.local import LocalLauncher
    from worker.faults import ENV as FAULTS_ENV

    worker_env = build_worker_env(job, plan, settings, run=conf.run, attempt=conf.attempt,
                                  resume_from=resume_from, mlflow_run_id=mlflow_run_id)
    faults = conf.faults.worker_faults() if conf.attempt == 0 else ""
    base = None
    if faults:
        import os

        base = {**os.environ, FAULTS_ENV: faults}
    local = LocalLauncher(settings.runs_dir, source_dir=source_dir or launcher(settings).source_dir,
                          base_env=base, max_restarts=in_place_restarts(job, conf))
    handle = local.submit(job, plan, placement, worker_env, attempt=conf.attempt)
    from plugins.recovery.faults import fail_gpu

    fail_gpu(conf, list(handle.nodes), settings.node_agents)
    return handle


def in_place_restarts(job: TrainingJob, conf: AttemptConf) -> int:
    """torchrun's `--max-restarts` for the attempt: the spec's fast path, never more than the
    restart budget has left (each in-place restart counts against it)."""
    ft = job.spec.fault_tolerance
    return max(0, min(ft.in_place_restarts, ft.max_restarts - conf.restarts_used))


def excluded_nodes(conf: AttemptConf, state_db: str) -> list[str]:
    """Nodes the attempt must not be placed on: those the run lost, and every cordoned node."""
    from plugins.recovery.state import open_job_state

    return sorted({*conf.exclude_nodes, *open_job_state(state_db).cordoned()})


def begin(job: TrainingJob, conf: AttemptConf, settings: Settings, *, trigger_key: str) -> None:
    """Record the run (opened once per trigger) and the attempt's start in the job state."""
    from plugins.recovery.engine import begin_attempt
    from plugins.recovery.state import open_job_state

    state = open_job_state(settings.state_db)
    if conf.attempt == 0:
        state.open_run(job.name, trigger_key=trigger_key, team=job.metadata.team,
                       project=job.metadata.project, run=conf.run)
    begin_attempt(state, job.name, conf.run, conf.attempt, dag_run_id=trigger_key)


def launched(job: TrainingJob, conf: AttemptConf, settings: Settings, handle: RunHandle, mlflow_run_id: str) -> None:
    """The gang runs: its handle (so `trainyard stop` finds it) and the lifecycle in the job state."""
    from plugins.recovery.state import open_job_state

    state = open_job_state(settings.state_db)
    state.set_handle(job.name, conf.run, conf.attempt, handle)
    state.set_mlflow_run(job.name, conf.run, mlflow_run_id)
    state.transition(job.name, conf.run, "running")
    record_resumed(job, conf, settings, handle, mlflow_run_id)


def conclude_attempt(job: TrainingJob, conf: AttemptConf, handle: RunHandle, settings: Settings, *,
                     status: RunStatus | None, plan: Plan, mlflow_run_id: str, by: str) -> AttemptResult:
    """After the watchers: the evidence, `after_attempt` (classify, decide, bookkeeping) and the
    record of it in the run's MLflow run."""
    from config.cluster import cluster_for
    from plugins.launch.environment import checkpoint_uri
    from plugins.recovery import watch
    from plugins.recovery.decide import DecisionContext
    from plugins.recovery.engine import after_attempt
    from plugins.recovery.evidence import gather, observe_node
    from plugins.recovery.state import open_job_state

    if status is None or not status.finished:
        status = watch.poll(handle)
        if status.finished:
            status = watch.settle(handle, status)
    from plugins.recovery.faults import corrupt_newest_checkpoint

    root = checkpoint_uri(job, settings.object_store, conf.run)
    corrupt_newest_checkpoint(conf, root, endpoint_url=settings.s3_endpoint_url)
    gang = set(handle.nodes or [a.node for a in handle.agents])
    nodes = [observe_node(n, url) for n, url in sorted(settings.node_agents.items()) if n in gang]
    evidence = gather(handle, status, run=conf.run, nodes=nodes, resume_from=conf.resume_from)
    ctx = DecisionContext(checkpoint_uri=root,
                          endpoint_url=settings.s3_endpoint_url, plan=plan,
                          cluster=cluster_for(job.spec.hardware.gpu_type, settings.cluster))
    result = after_attempt(evidence, job, conf, ctx, state=open_job_state(settings.state_db), by=by)
    if result.next_conf is not None and mlflow_run_id:  # every attempt continues the same MLflow run
        result = dataclasses.replace(result, next_conf=result.next_conf.model_copy(
            update={"mlflow_run_id": mlflow_run_id}))
    if mlflow_run_id:
        record_in_mlflow(result, mlflow_run_id, tracking_uri=settings.mlflow_tracking_uri)
    return result


def record_in_mlflow(result: AttemptResult, mlflow_run_id: str, *, tracking_uri: str) -> None:
    """A failure becomes a recovery event of the run (cause, step, what was done, time to detect,
    steps lost); each in-place torchrun restart of the attempt one more; a final action sets the
    run's status. Keyed by run, attempt and cause, so a retried task records each once."""
    from plugins.tracking.runs import log_recovery_event, log_recovery_timings, set_run_status

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
                           key=f"{report.run}/{report.attempt}/{report.outcome}")
        log_recovery_timings(mlflow_run_id, step=report.step or 0, tracking_uri=tracking_uri,
                             time_to_detect_s=report.time_to_detect_s, steps_lost=report.steps_lost)
    if action.retries:
        set_run_status(mlflow_run_id, "recovering", tracking_uri=tracking_uri)
    elif action.kind == "give_up":
        set_run_status(mlflow_run_id, "failed", tracking_uri=tracking_uri)
    elif action.kind == "cancel":
        set_run_status(mlflow_run_id, "cancelled", tracking_uri=tracking_uri)


def record_resumed(job: TrainingJob, conf: AttemptConf, settings: Settings, handle: RunHandle,
                   mlflow_run_id: str) -> float | None:
    """A later attempt's gang started: the previous attempt's time to resume (its detection to
    this start), in its job-state report and as the MLflow metric `recovery/time_to_resume_s`."""
    from plugins.recovery.state import JobStateStore

    if conf.attempt == 0:
        return None
    seconds = JobStateStore(settings.state_db).set_resumed(job.name, conf.run, conf.attempt - 1,
                                                           handle.created_at)
    if seconds is not None and mlflow_run_id:
        from plugins.tracking.runs import log_recovery_timings

        log_recovery_timings(mlflow_run_id, step=0, tracking_uri=settings.mlflow_tracking_uri,
                             time_to_resume_s=seconds)
    return seconds


def register_model(job: TrainingJob, settings: Settings, *, mlflow_run_id: str) -> Any:
    """Export the run's best valid checkpoint (by the spec's `keepBestMetric`, else the newest)
    and register it as the next version of the job's model, alias `candidate`."""
    from plugins.checkpoint.uris import area_for
    from plugins.tracking.registry import register_checkpoint


    return register_checkpoint(mlflow_run_id, tracking_uri=settings.mlflow_tracking_uri,
                               metric=job.spec.checkpoint.keep_best_metric, model_name=job.name,
                               endpoint_url=settings.s3_endpoint_url, area=area_for(job, settings.object_store))


def run_timeline(job: str, run: str, settings: Settings) -> list[tuple[float, str]]:
    """What happened to a training run, from the job state: (seconds since the run opened, event)."""
    from plugins.recovery.state import open_job_state

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


def close_run(job: TrainingJob, settings: Settings, *, run: str, mlflow_run_id: str,
              status: Literal["completed", "failed", "cancelled"] = "completed") -> dict[str, float]:
    """End the run's MLflow run: its end artifacts (loss plot, recovery timeline), its cost —
    device time by phase from the job state (attempts are training, the gaps between them
    recovery), MFU and tokens/s from what the workers streamed — and its final status.
    Returns the cost figures."""
    from config.cluster import cluster_for
    from plugins.recovery.state import open_job_state
    from plugins.tracking.cost import RunAccounting, job_cost, log_job_cost
    from plugins.tracking.lifecycle import close_tracked_run
    from plugins.tracking.rates import load_rates
    from plugins.tracking.runs import client_for

    state = open_job_state(settings.state_db)
    info, attempts = state.get_run(job.name, run), state.attempts(job.name, run)
    spans = [(a.started_at, a.ended_at) for a in attempts if a.ended_at is not None]
    if not spans:
        close_tracked_run(mlflow_run_id, status, tracking_uri=settings.mlflow_tracking_uri, title=job.name)
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
                      timeline=run_timeline(job.name, run, settings), title=f"{job.name} run {run}")
    return {"device_hours": cost.total_gpu_hours, "recovery_device_hours": cost.recovery_gpu_hours,
            "cost_usd": cost.total_cost_usd}
