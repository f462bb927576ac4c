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
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

    try:
        parsed = AttemptConf.model_validate({k: v for k, v in (conf or {}).items() if v is not None})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'conf'}: {err['msg']} "
                             f"(got {err.get('input')!r})" for err in e.errors())
        raise InvalidConf(f"the run's conf is invalid: {problems}") from e
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


def resume_point(conf: AttemptConf, *, tracking_uri: str) -> str:
    """The manifest URI the attempt restores, or '' for the run's newest valid checkpoint.

    A later attempt restores what the recovery decision named (a rollback, a fall-back) or, with
    nothing named, the newest valid checkpoint of its own run. A first attempt starts fresh unless
    its trigger asked to start from a checkpoint or a registered model (`models:/name@alias`:
    the checkpoint the version was exported from, recorded in its lineage tags).
    """
    if conf.attempt > 0:
        return conf.resume_from
    start = conf.start_from.strip()
    if not start.startswith("models:/"):
        return start
    from plugins.tracking.runs import client_for

    name, sep, alias = start.removeprefix("models:/").partition("@")
    if not sep or not name or not alias:
        raise InvalidConf(f"start_from {start!r}: write models:/<name>@<alias>")
    version = client_for(tracking_uri).get_model_version_by_alias(name, alias)
    uri = version.tags.get("trainyard.checkpoint.uri", "")
    if not uri:
        raise InvalidConf(f"model {name} version {version.version} (alias {alias!r}) records no "
                          "checkpoint it was exported from (tag trainyard.checkpoint.uri)")
    return uri


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
    from plugins.recovery.state import JobStateStore

    return sorted({*conf.exclude_nodes, *JobStateStore(state_db).cordoned()})


def begin(job: TrainingJob, conf: AttemptConf, settings: Settings, *, trigger_key: str) -> None:
    """Record the run (opened once per trigger) and the attempt's start in the job state."""
    from plugins.recovery.engine import begin_attempt
    from plugins.recovery.state import JobStateStore

    state = JobStateStore(settings.state_db)
    if conf.attempt == 0:
        state.open_run(job.name, trigger_key=trigger_key, team=job.metadata.team,
                       project=job.metadata.project, run=conf.run)
    begin_attempt(state, job.name, conf.run, conf.attempt, dag_run_id=trigger_key)


def launched(job: TrainingJob, conf: AttemptConf, settings: Settings, handle: RunHandle, mlflow_run_id: str) -> None:
    """The gang runs: its handle (so `trainyard stop` finds it) and the lifecycle in the job state."""
    from plugins.recovery.state import JobStateStore

    state = JobStateStore(settings.state_db)
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
    from plugins.recovery.state import JobStateStore

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
    result = after_attempt(evidence, job, conf, ctx, state=JobStateStore(settings.state_db), by=by)
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
    from plugins.tracking.registry import register_checkpoint
    from plugins.tracking.runs import set_run_status

    version = register_checkpoint(mlflow_run_id, tracking_uri=settings.mlflow_tracking_uri,
                                  metric=job.spec.checkpoint.keep_best_metric, model_name=job.name,
                                  endpoint_url=settings.s3_endpoint_url)
    set_run_status(mlflow_run_id, "completed", tracking_uri=settings.mlflow_tracking_uri)
    return version
