"""The steps of one attempt, each a function with explicit inputs and a pydantic output, recording
the job state as it goes (DESIGN §1, §4):

    open_attempt → Opened      the spec with the trigger's overrides, validated for this deployment
                               (schema, rules, memory, quota, dataset, the launcher's devices); the
                               run opened and the attempt started in the job state
    check_data   → DataChecked Great Expectations on the dataset, when the spec asks for it
    plan         → Planned     a re-plan handed over, the advisor's plan, or the manual degrees
    place        → Placed      placed and reserved (lost and cordoned nodes left out; lower-priority
                               gangs preempted when it does not fit; a requeue waits for capacity)
    launch       → Launched    resume point, MLflow run, the launcher's detached submit (idempotent)
    watch_once   → WatchStep   one look at the training (`watching.py`): the trigger loops over it
    conclude     → Concluded   evidence → classify → decide → quarantine, cordon, job state, MLflow
    release      → int         the reservation freed (the DAG's teardown)
    register     → Registered  the best valid checkpoint exported and registered as a model version;
                               the run ends here: completed and registered, or failed
                               (`RegistrationFailed`) — its one outcome (`recovery/outcome.py`)
    close        → Closed      MLflow's end artifacts, the cost, the run's final status

A step that fails for good before the gang runs (nothing fits, nowhere to place it, the launcher
refused) records the attempt as `launch_failed` with the message, so the run ends `failed`
rather than stay `starting`; a transient failure is left to the caller's retry.

Each operator of the job's DAG calls one step; `trainyard launch` runs them in order in one process
(`start_attempt`, then `follow_attempt`). Nothing here imports Airflow, nor calls MLflow: a step
announces its event to the attempt listener in one line (`listener.py`: created, launched,
checkpointed, concluded, registered, closed), and the MLflow listener keeps the run's record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainyard.config.cluster import Cluster
from trainyard.config.problems import Problem
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.planner import PlanResult
from trainyard.plugins.attempt.conf import (
    InvalidConf,
    check_conf_points,
    effective_job,
    in_place_restarts,
    managed_only_params,
    parse_conf,
    plan_attempt,
    resume_point,
    trigger_conf,
)
from trainyard.plugins.attempt.launchers import (
    LaunchOptions,
    Runtime,
    all_problems,
    launcher_for,
    local_script,
)
from trainyard.plugins.attempt.listener import listener_for
from trainyard.plugins.attempt.watching import WatchState, WatchStep, watch_once
from trainyard.plugins.errors import FatalError
from trainyard.plugins.placement.model import Placement
from trainyard.plugins.recovery.model import (
    NOT_REGISTERED,
    AttemptConf,
    FailureReport,
    RecoveryAction,
)
from trainyard.plugins.recovery.outcome import REGISTERED_PREFIX, RunOutcome
from trainyard.plugins.run.model import RunHandle, RunStatus
from trainyard.plugins.state.reservations import RESERVATION_LEASE_S
from trainyard.plugins.validation.data_quality import DataQualityReport

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from trainyard.config.settings import Settings

REQUEUE_WAIT_S = 3600.0
"""A requeued attempt (after preemption) waits this long for capacity in `place`."""


class InvalidJob(FatalError):
    """The spec (with the trigger's overrides) does not validate for this deployment; the message
    is the full report, one problem a line."""


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)


class Opened(_Out):
    job: TrainingJob
    """The spec as this attempt trains it (the trigger's overrides applied)."""
    conf: AttemptConf
    cluster: str
    """The cluster it runs on, as configured (`TRAINYARD_CLUSTER`: a name or a cluster file)."""
    warnings: list[Problem] = Field(default_factory=list)
    advice: PlanResult | None = None
    """The advisor's answer the validation's memory check read (None: offline, or a spec the
    advisor cannot plan): `plan` plans with it instead of searching again."""
    spec_max_steps: int | None = None
    """The spec's own `training.maxSteps`, before the trigger's override: the `candidate` rule
    compares the steps a run reached with it (a 20-step smoke run is not a 200-step model)."""


class DataChecked(_Out):
    checked: bool
    warnings: list[Problem] = Field(default_factory=list)
    report: DataQualityReport | None = None
    """What Great Expectations found; the launch logs it to the MLflow run it opens."""
    fingerprint: str = ""
    """`data_fingerprint` of what passed ('' when it could not be taken): the next attempt's
    conf carries it (`AttemptConf.data_checked`)."""
    unchanged: bool = False
    """Not checked again: an earlier attempt of this run passed the same data and settings."""


class Planned(_Out):
    plan: Plan
    source: str
    advice: PlanResult | None = None
    """The advisor's answer behind the plan — the attempt's one search, carried on so the launch
    explains the plan in MLflow (alternatives, rejections) without searching again."""


class Placed(_Out):
    placement: Placement
    excluded: list[str] = Field(default_factory=list)
    evicted: list[str] = Field(default_factory=list)
    """One line per gang preempted to make room."""
    waited_s: float = 0.0
    queued: bool = False
    """Not reserved: the cluster's queue (Kueue) admits it when its quota allows."""


class Launched(_Out):
    handle: RunHandle
    mlflow_run_id: str
    resume_from: str
    """The manifest restored ('' = the run's newest valid checkpoint)."""


class Concluded(_Out):
    report: FailureReport
    action: RecoveryAction
    next_conf: AttemptConf | None = None
    """The conf of the attempt that carries the action out; None when nothing retries."""

    @property
    def summary(self) -> str:
        """One line for people (the DAG run's note): `attempt 0: worker_crash at step 119
        (rank 1: killed by SIGKILL) → restart from step 100`; a preemption names its cause
        (`… → requeue from step 12 — preempted by Kueue: Preempted (InCohortReclamation): …`)."""
        from trainyard.plugins.run.exit_codes import describe

        r, a = self.report, self.action
        where = f" at step {r.step}" if r.step is not None else ""
        who = (f"rank {r.rank}: {describe(r.exit_code)}" if r.rank is not None and r.exit_code not in (None, 0)
               else f"rank {r.rank}" if r.rank is not None else ", ".join(r.failed_nodes))
        detail = f" ({who})" if who and r.failed else ""
        then = {"register": "registering", "finish": a.reason.removeprefix("completed — ") or NOT_REGISTERED,
                "give_up": "gave up", "cancel": "cancelled"}.get(a.kind, a.kind)
        resume = f" from step {a.resume_step}" if a.retries and a.resume_step is not None else ""
        why = f": {a.reason}" if a.kind in ("give_up", "cancel") else ""
        if r.outcome == "preempted":  # by whom and why: the platform's eviction, or Kueue's in its words
            why = f" — {r.reason}"
        return f"attempt {r.attempt}: {r.outcome}{where}{detail} → {then}{resume}{why}"[:1000]


class Registered(_Out):
    model: str
    version: str
    step: int | None
    mlflow_run_id: str
    candidate_note: str = ""
    """Why `candidate` did or did not move to this version."""
    outcome: RunOutcome
    """The run's outcome, as the job state now records it (completed and registered)."""


class RegistrationFailed(FatalError):
    """The run completed but its model could not be registered: the run ended failed (the
    message is its one-line outcome), which every surface says."""


class Closed(_Out):
    status: Literal["completed", "failed", "cancelled"]
    cost: dict[str, float] = Field(default_factory=dict)


def cluster_of(settings: Settings) -> Cluster:
    """The cluster this deployment launches on (`TRAINYARD_CLUSTER`): no fallback to another
    cluster that has the spec's devices — `launch_problems` names that one instead."""
    from trainyard.config.cluster import load_cluster

    return load_cluster(settings.cluster)


# --- open -----------------------------------------------------------------------------------------


def open_trigger(spec_path: str | Path, params: dict[str, Any], conf: dict[str, Any] | None, *, dag_id: str,
                 dag_run_id: str, when: datetime, runtime: Runtime) -> Opened:
    """`open_attempt` for a DAG run: the trigger form's Params and the run's conf parsed into
    the attempt's conf (a first trigger opens a new run)."""
    parsed = parse_conf(trigger_conf(params, conf), dag_id=dag_id, trigger_run_id=dag_run_id, when=when)
    return open_attempt(spec_path, parsed, trigger_key=f"{dag_id}/{dag_run_id}", runtime=runtime)


def open_attempt(spec_path: str | Path, conf: AttemptConf, *, trigger_key: str, runtime: Runtime,
                 offline: bool = False) -> Opened:
    """Validate the spec for this deployment (every problem, in one report) and record the
    attempt's start: a first attempt opens its run (once per `trigger_key`). `offline` skips the
    checks that need the world (memory fit, dataset, quota), as `trainyard validate --offline`."""
    from trainyard.config.loader import load_spec_file
    from trainyard.config.problems import SpecError
    from trainyard.plugins.validation.memory import advise

    settings = runtime.settings
    try:
        spec = load_spec_file(spec_path)
        job = effective_job(spec, conf)
    except (SpecError, ValueError) as e:
        raise InvalidJob(f"{spec_path}: {e}") from e
    cluster = cluster_of(settings)
    advice = None if offline else advise(job, cluster, memory_fraction=settings.memory_fraction)
    problems = all_problems(job, cluster, settings, offline=offline, advice=advice)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        lines = "\n".join(f"  {p.code.value} {p.render()}" for p in errors)
        raise InvalidJob(f"{job.name} is invalid on cluster {cluster.name!r}: {len(errors)} error(s)\n{lines}")
    check_conf_points(conf, job, object_store=settings.object_store)  # another job's checkpoint: no
    refused = managed_only_params(conf, local_script(job, cluster))
    if refused:
        raise InvalidJob(f"{', '.join(refused)}: only a managed script honours them (one that calls trainyard.init(), "
                         f"docs/bring-your-own.md); {job.spec.source.entrypoint} is a plain script and would ignore "
                         "them — trigger without them, or make the script managed")
    _begin(job, conf, settings, trigger_key=trigger_key)
    return Opened(job=job, conf=conf, cluster=str(settings.cluster), warnings=problems, advice=advice,
                  spec_max_steps=spec.spec.training.max_steps)


def _begin(job: TrainingJob, conf: AttemptConf, settings: Settings, *, trigger_key: str) -> None:
    from trainyard.plugins.attempt.bookkeeping import begin_attempt
    from trainyard.plugins.state.jobs import open_job_state

    state = open_job_state(settings.state_db)
    if conf.attempt == 0:
        state.open_run(job.name, trigger_key=trigger_key, team=job.metadata.team,
                       project=job.metadata.project, run=conf.run)
    begin_attempt(state, job.name, conf.run, conf.attempt, dag_run_id=trigger_key)


def check_data(opened: Opened, runtime: Runtime) -> DataChecked:
    """Great Expectations on the job's dataset when `spec.dataset.quality` is on — once per run
    while the data stays the same: a recovery attempt whose dataset still has the fingerprint
    an earlier attempt passed skips the checks (and their seconds of imports)."""
    dataset = opened.job.spec.dataset
    if dataset is None or not dataset.quality.enabled:
        return DataChecked(checked=False)
    if importlib.util.find_spec("great_expectations") is None:  # the `validation` extra
        with _failing(opened, runtime, "its dataset cannot be checked"):
            raise InvalidJob(f"{opened.job.name} asks for data-quality checks (spec.dataset.quality is on) but Great "
                             "Expectations is not installed where this task runs: install trainyard[validation] "
                             "beside Airflow, or set spec.dataset.quality.enabled: false")
    from trainyard.plugins.validation.data_quality import data_fingerprint, run_data_quality

    try:
        fingerprint = data_fingerprint(opened.job, runtime.settings)
    except Exception as e:  # noqa: BLE001 - the checks below say what is wrong with the data
        log.info("no fingerprint of the dataset (%s): checking it", e)
        fingerprint = ""
    if fingerprint and fingerprint == opened.conf.data_checked:
        return DataChecked(checked=True, fingerprint=fingerprint, unchanged=True)
    report, problems = run_data_quality(opened.job, runtime.settings)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        lines = "\n".join(f"  {p.code.value} {p.render()}" for p in errors)
        with _failing(opened, runtime, "its dataset fails its quality checks"):
            raise InvalidJob(f"the dataset of {opened.job.name} fails its quality checks: {len(errors)} "
                             f"error(s)\n{lines}")
    passed = report is not None and report.success
    return DataChecked(checked=True, warnings=problems, report=report, fingerprint=fingerprint if passed else "")


# --- plan, place -------------------------------------------------------------------------------


class AttemptNotStarted(FatalError):
    """A step before the gang ran refused its input (a `ValueError` from the planner or a
    launcher): retrying the same attempt cannot help."""


@contextlib.contextmanager
def _failing(opened: Opened, runtime: Runtime, what: str) -> Iterator[None]:
    """A fatal error inside — or a `ValueError`, a refusal of the input — ends the attempt as
    `launch_failed` (its message the reason) and the run as failed (nothing ran, nothing to
    recover), then propagates as fatal: the task is not retried."""
    try:
        yield
    except (FatalError, ValueError) as e:
        from trainyard.plugins.state.jobs import open_job_state

        report = FailureReport(job=opened.job.name, run=opened.conf.run, attempt=opened.conf.attempt,
                               outcome="launch_failed", reason=f"{what}: {e}"[:4000])
        action = RecoveryAction(kind="give_up", reason=f"the attempt could not start ({what}): {e}"[:4000],
                                counts_against_budget=False)
        state = open_job_state(runtime.settings.state_db)
        if not state.get_run(opened.job.name, opened.conf.run).final:
            state.finish_attempt(report, action)
        if isinstance(e, FatalError):
            raise
        raise AttemptNotStarted(f"{what}: {e}") from e


def plan(opened: Opened, runtime: Runtime) -> Planned:
    """The attempt's plan, from the advisor's answer its opening already has; an opening that
    skipped the advisor (offline) has it asked here, once."""
    from trainyard.config.cluster import load_cluster
    from trainyard.plugins.validation.memory import advise

    cluster, fraction = load_cluster(opened.cluster), runtime.settings.memory_fraction
    advice = opened.advice if opened.advice is not None else advise(opened.job, cluster, memory_fraction=fraction)
    with _failing(opened, runtime, "no plan fits"):
        chosen, source = plan_attempt(opened.job, cluster, opened.conf, memory_fraction=fraction, advice=advice)
    return Planned(plan=chosen.model_copy(update={"peak_flops_per_device": _peak_flops(opened.job, cluster)}),
                   source=source, advice=advice)


def _peak_flops(job: TrainingJob, cluster: Cluster) -> float | None:
    """One device's peak on this cluster, at the spec's precision (None: no peak is known)."""
    from trainyard.plugins.advisor.flops import peak_flops_per_device

    hints = job.spec.parallelism.hints
    try:
        return peak_flops_per_device(job.spec.hardware.gpu_type, hints.mixed_precision if hints else "bf16", cluster)
    except ValueError:
        return None


def place(opened: Opened, planned: Planned, runtime: Runtime) -> Placed:
    """Place and reserve (idempotent per job, run and attempt: a retry gets the live reservation)."""
    from trainyard.config.cluster import load_cluster
    from trainyard.config.teams import load_teams
    from trainyard.plugins.attempt.preempt import place_preempting
    from trainyard.plugins.state.jobs import open_job_state
    from trainyard.plugins.state.reservations import open_state

    settings, conf = runtime.settings, opened.conf
    jobs = open_job_state(settings.state_db)
    exclude = sorted({*conf.exclude_nodes, *jobs.cordoned()})
    requeued = bool(conf.history) and conf.history[-1].action == "requeue"
    with _failing(opened, runtime, "the gang cannot be placed"):
        result = place_preempting(opened.job, planned.plan, load_cluster(opened.cluster), open_state(settings.state_db),
                                  jobs, load_teams(settings.teams_file), runtime, run=conf.run, attempt=conf.attempt,
                                  exclude=exclude, lease_s=RESERVATION_LEASE_S,
                                  wait_s=REQUEUE_WAIT_S if requeued else 0.0)
    evicted = [f"{e.victim.job} run {e.victim.run} attempt {e.victim.attempt} ({e.freed} devices): "
               f"{e.status.message if e.status else 'no status'}" for e in result.evicted]
    return Placed(placement=result.placement, excluded=exclude, evicted=evicted, waited_s=result.waited_s,
                  queued=result.queued)


# --- launch ---------------------------------------------------------------------------------------


def launch(opened: Opened, planned: Planned, placed: Placed, runtime: Runtime, *,
           max_restarts: int | None = None, checked: DataChecked | None = None) -> Launched | None:
    """Start the attempt's gang detached; a second call for the same attempt re-attaches. None
    for a dry run (it ends the run: validated, planned and placed, nothing launched).
    `max_restarts` overrides the spec's in-place restarts (`trainyard launch --max-restarts`).
    `checked`: `check_data`'s result, whose report the first attempt logs to MLflow; the checks
    run once per attempt, so a check that could not run (its warning said so) is not tried again.
    Without a check (a launch that skipped `check_data`, checks turned off) tracking makes its
    own report, for the record only (`MlflowListener.created`)."""
    from trainyard.config.cluster import load_cluster
    from trainyard.plugins.attempt.faults import fail_gpu
    from trainyard.plugins.attempt.storage_access import issue_for_attempt
    from trainyard.plugins.launch.environment import build_worker_env

    job, conf, settings, listener = opened.job, opened.conf, runtime.settings, listener_for(runtime)
    if conf.dry_run:
        _end_dry_run(opened, runtime)
        return None
    cluster = load_cluster(opened.cluster)
    with _failing(opened, runtime, "the launch failed"):
        resume_from = resume_point(conf, job, tracking_uri=settings.mlflow_tracking_uri,
                                   object_store=settings.object_store)  # refused before anything starts
        # the ranks' own storage keys: this run's dataset, resume point and checkpoints only
        credentials = issue_for_attempt(job, settings, run=conf.run, attempt=conf.attempt, resume_from=resume_from)
        # the same MLflow run for every attempt, with the start artifacts (spec, plan explanation,
        # data-quality report) on the first
        mlflow_run_id = listener.created(opened, planned, checked)
        worker_env = build_worker_env(job, planned.plan, settings, run=conf.run, attempt=conf.attempt,
                                      resume_from=resume_from, mlflow_run_id=mlflow_run_id,
                                      ).model_copy(update={"storage_credentials": credentials})
        if conf.attempt == 0 and conf.faults.worker_faults():
            worker_env = worker_env.model_copy(update={"faults": conf.faults.worker_faults()})
        restarts = in_place_restarts(job, conf) if max_restarts is None else max_restarts
        try:
            launcher = launcher_for(cluster, runtime, LaunchOptions(max_restarts=restarts))
            handle = launcher.submit(job, planned.plan, placed.placement, worker_env, attempt=conf.attempt)
        except (FatalError, ValueError):  # nothing runs: the MLflow run it opened ends failed, not running
            listener.not_launched(mlflow_run_id)
            raise
        if conf.faults.fail_gpu_node.strip():
            from trainyard.plugins.attempt.watching import node_agents

            fail_gpu(conf, list(handle.nodes), node_agents(handle, runtime))
    resumed_after_s = _launched(opened, handle, mlflow_run_id, settings, planned, placed)
    listener.launched(opened, handle, mlflow_run_id, resumed_after_s=resumed_after_s)
    return Launched(handle=handle, mlflow_run_id=mlflow_run_id, resume_from=resume_from)


def _launched(opened: Opened, handle: RunHandle, mlflow_run_id: str, settings: Settings, planned: Planned,
              placed: Placed) -> float | None:
    """The gang runs: its handle (so `trainyard stop` finds it), its plan and placement, and the
    lifecycle in the job state; a later attempt's start ends the previous attempt's recovery.
    Returns that attempt's time to resume (its detection to this start), None for a first."""
    from trainyard.plugins.state.jobs import open_job_state

    job, conf = opened.job, opened.conf
    state = open_job_state(settings.state_db)
    state.set_handle(job.name, conf.run, conf.attempt, handle)
    state.set_layout(job.name, conf.run, conf.attempt, plan=planned.plan.model_dump_json(),
                     placement=placed.placement.model_dump_json())
    state.set_mlflow_run(job.name, conf.run, mlflow_run_id)
    state.transition(job.name, conf.run, "running")
    if conf.attempt == 0:
        return None
    return state.set_resumed(job.name, conf.run, conf.attempt - 1, handle.created_at)


def _end_dry_run(opened: Opened, runtime: Runtime) -> None:
    from trainyard.plugins.state.jobs import open_job_state

    why = "dry run: validated, planned and placed; nothing launched"
    report = FailureReport(job=opened.job.name, run=opened.conf.run, attempt=opened.conf.attempt,
                           outcome="cancelled", reason=why)
    state = open_job_state(runtime.settings.state_db)
    if not state.get_run(opened.job.name, opened.conf.run).final:
        state.finish_attempt(report, RecoveryAction(kind="cancel", reason=why))


def watch_state(opened: Opened, handle: RunHandle, *, timeout_s: float | None = None) -> WatchState:
    """The watch of a launched attempt: stopped past `training.maxRuntime` (or `timeout_s`);
    its reservation renewed, and its loss a reason to stop, except where the cluster's queue
    admits gangs (Kueue: the reservation is only the placer's preference, `preempt.queue_admits`)."""
    from trainyard.config.cluster import load_cluster
    from trainyard.plugins.attempt.preempt import queue_admits

    limit = opened.job.spec.training.max_runtime
    deadline = (handle.created_at + limit).timestamp() if limit else None
    why = "the attempt outlived training.maxRuntime"
    if timeout_s is not None and (deadline is None or time.time() + timeout_s < deadline):
        deadline, why = time.time() + timeout_s, f"--timeout-s {timeout_s:g} reached"
    return WatchState(deadline=deadline, deadline_reason=why, renew_lease=not queue_admits(load_cluster(opened.cluster)))


# --- conclude, release, register, close -------------------------------------------------------------


def conclude(opened: Opened, handle: RunHandle | None, runtime: Runtime, *, status: RunStatus | None,
             plan_used: Plan | None, mlflow_run_id: str, by: str, apply: bool = True,
             checked: DataChecked | None = None) -> Concluded | None:
    """After the watchers: the evidence, classify, decide, the bookkeeping (quarantine, cordon,
    job state), the record in MLflow, the next attempt's conf (with `checked`'s data
    fingerprint). Without a handle: the attempt's `launch_failed` as recorded, or None when
    nothing was started at all (a dry run)."""
    from trainyard.plugins.attempt.bookkeeping import DecisionInputs, after_attempt
    from trainyard.plugins.attempt.evidence import gather, observe_node
    from trainyard.plugins.attempt.faults import corrupt_newest_checkpoint
    from trainyard.plugins.attempt.watching import node_agents, poll, settle
    from trainyard.plugins.launch.environment import checkpoint_uri
    from trainyard.plugins.state.jobs import open_job_state

    job, conf, settings = opened.job, opened.conf, runtime.settings
    state = open_job_state(settings.state_db)
    if handle is None:
        return _not_launched(opened, state)
    if status is None or not status.finished:
        status = poll(handle, runtime)
        if status.finished:
            status = settle(handle, status, runtime)
    handle = _bound(handle, status, state, apply=apply)
    root = checkpoint_uri(job, settings.object_store, conf.run)
    if apply:
        corrupt_newest_checkpoint(conf, root, endpoint_url=settings.s3_endpoint_url)
    nodes = [observe_node(n, url) for n, url in sorted(node_agents(handle, runtime).items())]
    evidence = gather(handle, status, launcher=launcher_for(handle, runtime), run=conf.run, nodes=nodes,
                      resume_from=conf.resume_from)
    from trainyard.config.cluster import load_cluster

    inputs = DecisionInputs(checkpoint_uri=root, endpoint_url=settings.s3_endpoint_url, plan=plan_used,
                            cluster=load_cluster(opened.cluster))
    result = after_attempt(evidence, job, conf, inputs, state=state if apply else None, by=by, apply=apply)
    if result.next_conf is not None:  # every attempt continues the same MLflow run; passed data stays passed
        update = {"mlflow_run_id": mlflow_run_id} if mlflow_run_id else {}
        if checked is not None and checked.fingerprint:
            update["data_checked"] = checked.fingerprint
        result = dataclasses.replace(result, next_conf=result.next_conf.model_copy(update=update))
    if apply:
        listener_for(runtime).concluded(result, mlflow_run_id)
    return Concluded(report=result.report, action=result.action, next_conf=result.next_conf)


def _bound(handle: RunHandle, status: RunStatus, state: Any, *, apply: bool) -> RunHandle:
    """The attempt's handle naming the nodes its pods ran on (`RunHandle.bound`): from `status`
    where it still sees them bound, else as a watcher recorded it in the job state (a stopped
    Job's pods are gone by now) — the nodes the evidence blames and the cordon takes."""
    bound = handle.bound(status)
    if bound is not handle:
        if apply:
            state.set_handle(handle.job, handle.run, handle.attempt, bound)
        return bound
    row = next((a for a in state.attempts(handle.job, handle.run) if a.attempt == handle.attempt), None)
    stored = row.run_handle if row is not None else None
    if stored is not None and stored.uid == handle.uid and stored.nodes:
        return stored
    return handle


def _not_launched(opened: Opened, state: Any) -> Concluded | None:
    """The attempt never got a gang: its `launch_failed` as the failing step recorded it — or,
    when a step failed without a record (its retries spent on a transient error), recorded now,
    so the run ends failed instead of staying `starting`. None for a run already over (a dry run)."""
    job, conf = opened.job.name, opened.conf
    attempt = next((a for a in state.attempts(job, conf.run) if a.attempt == conf.attempt), None)
    report = attempt.failure_report if attempt is not None else None
    if report is None and not state.get_run(job, conf.run).final:
        report = FailureReport(job=job, run=conf.run, attempt=conf.attempt, outcome="launch_failed",
                               reason="a step before the launch failed (its task log says why)")
        state.finish_attempt(report, RecoveryAction(kind="give_up", reason=report.reason, counts_against_budget=False))
    if report is None or report.outcome != "launch_failed":
        return None
    reason = (attempt.action_reason if attempt is not None and attempt.action_reason else "") or report.reason
    return Concluded(report=report, action=RecoveryAction(kind="give_up", reason=reason, counts_against_budget=False))


def release(opened: Opened, runtime: Runtime) -> int:
    """Free the attempt's devices (idempotent: a second release frees nothing)."""
    from trainyard.plugins.state.reservations import open_state

    return open_state(runtime.settings.state_db).release(opened.job.name, opened.conf.attempt, run=opened.conf.run)


def register(opened: Opened, mlflow_run_id: str, runtime: Runtime) -> Registered:
    """Export the run's best valid checkpoint, register it as the next version of the job's
    model (`candidate` moves under the spec's rule) and end the run: completed and registered,
    or — the registration failing for good — failed, saying why (`RegistrationFailed`). A
    transient error (the tracking server down) leaves the run as it is, for the task's retry."""
    from trainyard.plugins.errors import is_retryable
    from trainyard.plugins.state.jobs import open_job_state

    job, run = opened.job.name, opened.conf.run
    state = open_job_state(runtime.settings.state_db)
    try:
        version = listener_for(runtime).registered(opened, mlflow_run_id)
    except Exception as e:
        if is_retryable(e):
            raise
        why = f"registration failed: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        info = state.transition(job, run, "failed", reason=why[:2000])
        raise RegistrationFailed(RunOutcome.of_run(info.state, info.final_reason).line) from e
    reason = (f"{REGISTERED_PREFIX}{version.name} version {version.version}"
              + (f" from step {version.checkpoint_step}" if version.checkpoint_step is not None else "")
              + (f"; {version.candidate_note}" if version.candidate_note else ""))
    info = state.transition(job, run, "completed", reason=reason)
    return Registered(model=version.name, version=str(version.version), step=version.checkpoint_step,
                      mlflow_run_id=mlflow_run_id, candidate_note=version.candidate_note,
                      outcome=RunOutcome.of_run(info.state, info.final_reason))


def run_outcome(opened: Opened, runtime: Runtime) -> RunOutcome:
    """The run's outcome as the job state records it now."""
    from trainyard.plugins.state.jobs import open_job_state

    info = open_job_state(runtime.settings.state_db).get_run(opened.job.name, opened.conf.run)
    return RunOutcome.of_run(info.state, info.final_reason)


def close(opened: Opened, mlflow_run_id: str, runtime: Runtime,
          status: Literal["completed", "failed", "cancelled"] = "completed") -> Closed:
    """End the run's MLflow run: loss plot, recovery timeline, cost, final status; then delete
    the run's storage role (its ranks' keys stop working), after the MLflow record so that an
    IAM error cannot keep the run's record open."""
    from trainyard.plugins.attempt.storage_access import revoke_for_run

    cost = listener_for(runtime).closed(opened, mlflow_run_id, status)
    revoke_for_run(opened.job, runtime.settings, run=opened.conf.run)
    return Closed(status=status, cost=cost)


# --- one process: `trainyard launch` ------------------------------------------------------------


class Started(_Out):
    """An attempt up to its launch; JSON, so a follower process can continue it."""

    opened: Opened
    planned: Planned
    placed: Placed
    launched: Launched

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)  # the spec in its own (camelCase) spelling

    @classmethod
    def from_json(cls, text: str) -> Started:
        return cls.model_validate_json(text)


def start_attempt(spec_path: str | Path, conf: AttemptConf, runtime: Runtime, *,
                  max_restarts: int | None = None, offline: bool = False) -> Started:
    """open → plan → place → launch, for a caller without Airflow (the reservation is released
    when a later step fails, as the DAG's teardown would)."""
    opened = open_attempt(spec_path, conf, trigger_key=f"cli/{conf.run}", runtime=runtime, offline=offline)
    planned = plan(opened, runtime)
    placed = place(opened, planned, runtime)
    try:
        launched = launch(opened, planned, placed, runtime, max_restarts=max_restarts)
    except BaseException:
        release(opened, runtime)
        raise
    if launched is None:  # only a conf with dry_run set asks for this
        release(opened, runtime)
        raise InvalidConf("dry run: validated, planned and placed; nothing launched")
    return Started(opened=opened, planned=planned, placed=placed, launched=launched)


def follow_attempt(started: Started, runtime: Runtime, *, timeout_s: float | None = None, poll_s: float = 0.5,
                   grace_s: float = 10.0, on_status: Callable[[RunStatus], None] | None = None
                   ) -> tuple[WatchStep, Concluded | None]:
    """watch_once until the attempt is over → conclude → release → close the MLflow run with the
    attempt's status. One attempt: what its action would do next is the caller's to show."""
    handle = started.launched.handle
    state = watch_state(started.opened, handle, timeout_s=timeout_s)
    try:
        while True:
            step = watch_once(handle, state, runtime, grace_s=grace_s)
            state, handle = step.state, step.handle or handle
            if on_status is not None:
                on_status(step.status)
            if step.finished:
                break
            time.sleep(poll_s)
    finally:
        release(started.opened, runtime)
    concluded = conclude(started.opened, handle, runtime, status=step.status, plan_used=started.planned.plan,
                         mlflow_run_id=started.launched.mlflow_run_id, by=f"trainyard launch {handle.run}")
    final: Literal["completed", "failed", "cancelled"] = (
        "completed" if step.status.succeeded else "cancelled" if concluded and concluded.action.kind == "cancel"
        else "failed")
    if concluded is not None and concluded.action.kind == "register":  # one attempt here: no registration
        from trainyard.plugins.state.jobs import open_job_state

        open_job_state(runtime.settings.state_db).transition(
            started.opened.job.name, started.opened.conf.run, "completed",
            reason="completed — not registered: trainyard launch runs one attempt and registers nothing "
                   "(trigger the job's DAG, or trainyard submit, to register)")
    close(started.opened, started.launched.mlflow_run_id, runtime, status=final)
    return step, concluded


# --- checkpoints -------------------------------------------------------------------------------


class CheckpointSeen(_Out):
    step: int
    verified: bool
    problems: list[str] = Field(default_factory=list)
    retired: bool = False
    """Gone before the watcher looked: the worker's retention deleted it (not a corrupt one)."""


def start_point(resume_from: str, committed: list[tuple[int, str]]) -> str:
    """What an attempt's launch starts from, in words for its log: a named checkpoint and its step,
    the run's newest committed one (which the ranks verify, falling back past a bad one), or a
    fresh start. `committed`: (step, manifest URI) of the run's checkpoints, oldest first."""
    if resume_from:
        from trainyard.plugins.checkpoint.manifest import parse_step_dir

        step = parse_step_dir(resume_from.rstrip("/").rsplit("/", 2)[-2]) if resume_from.count("/") >= 2 else None
        return f"resuming from step {step} ({resume_from})" if step is not None else f"resuming from {resume_from}"
    if not committed:
        return "fresh start (the run has no checkpoint yet)"
    step, uri = committed[-1]
    return f"resuming from step {step}, the run's newest checkpoint ({uri}; the ranks verify it first)"


def checkpoints_root(opened: Opened, runtime: Runtime) -> str:
    from trainyard.plugins.launch.environment import checkpoint_uri

    return checkpoint_uri(opened.job, runtime.settings.object_store, opened.conf.run)


def checkpoint_committed(opened: Opened, step: int, manifest_uri: str, runtime: Runtime, *,
                         mlflow_run_id: str) -> CheckpointSeen:
    """A checkpoint the run committed: verify its files' hashes and record it in the MLflow run.
    The worker's rank 0 already recorded it and applied the retention policy at the commit
    (`trainyard.worker.checkpoint_records`): the record is idempotent, and one retention deleted before
    this look is reported `retired`, not as a checkpoint that fails verification."""
    from trainyard.plugins.checkpoint.catalog import verify
    from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME, step_dir
    from trainyard.plugins.storage.store import open_store

    settings, root = runtime.settings, checkpoints_root(opened, runtime)
    result = verify(root, step, endpoint_url=settings.s3_endpoint_url)
    if not result.ok:
        if not open_store(root, endpoint_url=settings.s3_endpoint_url).exists(f"{step_dir(step)}/{MANIFEST_NAME}"):
            return CheckpointSeen(step=step, verified=False, retired=True)
        return CheckpointSeen(step=step, verified=False, problems=list(result.problems))
    listener_for(runtime).checkpointed(mlflow_run_id, manifest_uri)
    return CheckpointSeen(step=step, verified=True)
