"""Build the `RunView` of one training run from where each fact lives.

| part | source |
|---|---|
| lifecycle, attempts, causes, timings | the platform state (`trainyard.plugins.state.jobs.JobStateStore`) |
| plan and placement of each attempt | the same state's `layouts(job, run)` (kept after the release) |
| device capacity and budget | the cluster (`hardware_for`) and `Settings.memory_fraction` |
| checkpoints | the run's checkpoint root in the object store (`trainyard.plugins.checkpoint.catalog`) |
| live step / loss / tokens/s | the live attempt's heartbeat files; MLflow's latest metrics otherwise |
| each rank's state and last log lines | the live attempt's launcher (`poll`, `logs`: what `trainyard logs` reads) |
| MFU | `trainyard.plugins.tracking.cost.run_mfu` (the one MFU) on the measured tokens/s |
| what a recovery cost | `trainyard.plugins.tracking.recovery_timing` over the attempt's report and MLflow's points |

Each source may be missing or down (a run opened but never launched has no layout, an MLflow
server restarts, a job's spec was removed): the part is left out and `RunView.notes` says
why. Nothing here writes anywhere; the view never changes what it shows.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.plugins.control_room.model import (
    AttemptView,
    CheckpointRow,
    DeviceCell,
    Live,
    LiveUpdate,
    MemoryBar,
    NodeBox,
    PlacementView,
    PlanView,
    RackBox,
    RankLive,
    RunView,
)
from trainyard.plugins.state.jobs import airflow_dag_run_id

if TYPE_CHECKING:
    from mlflow.entities import Run

    from trainyard.config.cluster import Cluster
    from trainyard.config.settings import Settings
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.placement.model import Placement
    from trainyard.plugins.state.jobs import AttemptInfo, JobStateStore, RunInfo

log = logging.getLogger(__name__)

CURVE_POINTS = 300
"""Points of the loss sparkline (thinned evenly; the first and last kept)."""
LOG_LINES = 8
"""Last log lines shown per rank of a live attempt."""


@dataclass
class _Context:
    """What the parts share while one view is built, and what they could not read."""

    settings: Settings
    info: RunInfo
    job: TrainingJob | None
    cluster: Cluster | None
    mlflow: Run | None = None
    notes: list[str] = field(default_factory=list)
    histories: dict[str, list[tuple[int, float, int]]] = field(default_factory=dict)
    """Metric key → its points, read once per view."""


def build_run_view(store: JobStateStore, info: RunInfo, settings: Settings, *, airflow_base: str = "",
                   now: datetime | None = None, runtime: Runtime | None = None) -> RunView:
    """The view of `info`'s run. `airflow_base`: the Airflow UI's root as the browser reaches it
    (`''` under the same origin), for the links to each attempt's DAG run. `runtime`: how the
    live attempt's launcher is asked from this process (default: the settings' kubeconfig)."""
    now = now or datetime.now(UTC)
    job, spec_note = find_job(info.job, settings.jobs_dir)
    ctx = _Context(settings=settings, info=info, job=job, cluster=None, notes=[spec_note] if spec_note else [])
    ctx.mlflow = _mlflow_run(ctx)
    attempts = store.attempts(info.job, info.run)
    layouts = store.layouts(info.job, info.run)
    plan, placement = _latest_layout(layouts, ctx)
    if placement is not None:
        ctx.cluster = _cluster(placement.gpu_type, ctx)
    live_attempt = next((a for a in reversed(attempts) if a.state == "running"), None)
    ranks, waiting = rank_views(live_attempt, settings, runtime)
    return RunView(
        job=info.job, run=info.run, dag_id=info.job, state=info.state, team=info.team, project=info.project,
        created_at=info.created_at, updated_at=info.updated_at, final_reason=info.final_reason,
        plan=plan_view(plan, _capacity(placement, ctx), settings.memory_fraction) if plan else None,
        placement=with_rack_neighbours(placement_view(placement, _beats(live_attempt, placement)), ctx.cluster)
        if placement else None,
        live=_live(ctx, live_attempt, placement),
        ranks=ranks,
        waiting=waiting,
        checkpoints=_checkpoints(ctx, now),
        checkpoint_root=_checkpoint_root(ctx),
        attempts=_attempts(ctx, attempts, layouts, airflow_base),
        mlflow_run_id=info.mlflow_run_id,
        mlflow_url=_mlflow_url(ctx),
        notes=ctx.notes,
    )


def build_live_update(store: JobStateStore, info: RunInfo, settings: Settings, *,
                      runtime: Runtime | None = None) -> LiveUpdate:
    """What a live run's page polls: state, progress (without the loss history) and ranks."""
    job, _ = find_job(info.job, settings.jobs_dir)
    ctx = _Context(settings=settings, info=info, job=job, cluster=None)
    ctx.mlflow = _mlflow_run(ctx)
    live_attempt = store.live_attempt(info.job, info.run)
    _, placement = _latest_layout(store.layouts(info.job, info.run), ctx) if live_attempt else (None, None)
    ranks, waiting = rank_views(live_attempt, settings, runtime)
    return LiveUpdate(state=info.state, updated_at=info.updated_at, final=info.final, final_reason=info.final_reason,
                      attempt=live_attempt.attempt if live_attempt else None,
                      live=_live(ctx, live_attempt, placement, with_curve=False), ranks=ranks, waiting=waiting)


# -- the job and its cluster ---------------------------------------------------------------------

def find_job(name: str, jobs_dir: Path) -> tuple[TrainingJob | None, str]:
    """The spec of job `name` in the jobs folder (DAGs are built from it), and a note when it
    is not there: the view then shows what the state and MLflow hold, without the spec."""
    from trainyard.config.loader import read_spec_file

    for path in sorted(Path(jobs_dir).glob("*.y*ml")):
        job, _ = read_spec_file(path)
        if job is not None and job.name == name:
            return job, ""
    return None, f"no spec of job {name!r} in {jobs_dir}: MFU and the spec's checkpoint storage are not shown"


def _cluster(gpu_type: str, ctx: _Context) -> Cluster | None:
    from trainyard.config.cluster import cluster_for

    try:
        return cluster_for(gpu_type, ctx.settings.cluster)
    except (OSError, ValueError) as e:
        ctx.notes.append(f"cluster {ctx.settings.cluster!r} could not be read ({e}): no device capacity")
        return None


def _capacity(placement: Placement | None, ctx: _Context) -> int | None:
    if placement is None or ctx.cluster is None:
        return None
    from trainyard.plugins.advisor.hardware import hardware_for

    try:
        return hardware_for(ctx.cluster, placement.gpu_type).memory_bytes
    except ValueError as e:
        ctx.notes.append(f"no capacity for {placement.gpu_type}: {e}")
        return None


# -- plan and placement ------------------------------------------------------------------------

def _latest_layout(layouts: dict[int, tuple[str, str]], ctx: _Context) -> tuple[Plan | None, Placement | None]:
    """The plan and placement of the newest attempt that launched."""
    from pydantic import ValidationError

    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.placement.model import Placement

    if not layouts:
        return None, None
    attempt = max(layouts)
    plan_json, placement_json = layouts[attempt]
    try:
        return (Plan.model_validate_json(plan_json) if plan_json else None,
                Placement.model_validate_json(placement_json) if placement_json else None)
    except ValidationError as e:
        ctx.notes.append(f"attempt {attempt}'s recorded layout does not parse: {e.error_count()} error(s)")
        return None, None


def plan_view(plan: Plan, capacity_bytes: int | None, memory_fraction: float) -> PlanView:
    """The plan as the page shows it: layout, memory bar, step-time split."""
    budget = int(capacity_bytes * memory_fraction) if capacity_bytes else None
    return PlanView(
        label=plan.describe(), layout=plan.layout, zero_stage=plan.zero_stage,
        fsdp=plan.zero_stage == 3, micro_batch_size=plan.micro_batch_size, num_micro_batches=plan.num_micro_batches,
        recompute=plan.activation_checkpointing, global_batch_size=plan.global_batch_size,
        sequence_length=plan.sequence_length,
        memory=MemoryBar(items=dict(plan.memory_breakdown), total_bytes=plan.memory_per_gpu_bytes,
                         budget_bytes=budget, capacity_bytes=capacity_bytes),
        step_time_s=plan.step_time_s, step_split=step_split(plan), tokens_per_s=plan.tokens_per_s, mfu=plan.mfu,
    )


def step_split(plan: Plan) -> dict[str, float]:
    """The estimated step by phase, summing to `step_time_s`: the communication the advisor left
    on the critical path (`communication_s`, by dimension), the pipeline bubble
    (`bubble_fraction` of the step) and the rest, compute. Empty without a time estimate."""
    if not plan.step_time_s:
        return {}
    comm = {f"comm {dim}": s for dim, s in sorted(plan.communication_s.items()) if s > 0}
    bubble = plan.step_time_s * (plan.bubble_fraction or 0.0)
    compute = max(0.0, plan.step_time_s - bubble - sum(comm.values()))
    return {"compute": compute, **({"pipeline bubble": bubble} if bubble > 0 else {}), **comm}


def placement_view(placement: Placement, steps: dict[int, int] | None = None) -> PlacementView:
    """Racks → nodes → devices; each device with its rank and its TP/PP/DP/CP group indices
    (the index of the group among `RankLayout.groups(kind)`)."""
    layout = placement.layout
    group_of: dict[str, dict[int, int]] = {
        kind: {rank: i for i, group in enumerate(layout.groups(kind)) for rank in group}  # type: ignore[arg-type]
        for kind in ("tp", "pp", "dp", "cp")}
    racks: dict[str, list[NodeBox]] = {}
    for node in placement.nodes:
        indices = node.devices or list(range(node.slots))
        cells = [DeviceCell(index=dev, rank=rank, groups={k: g[rank] for k, g in group_of.items()},
                            step=(steps or {}).get(rank))
                 for dev, rank in zip(indices, node.ranks, strict=False)]
        racks.setdefault(node.rack, []).append(
            NodeBox(name=node.name, address=node.address, capacity=max(node.node_gpus, len(cells)), devices=cells))
    return PlacementView(attempt=placement.attempt, gpu_type=placement.gpu_type, strategy=placement.strategy,
                         score=placement.score, racks=[RackBox(name=r, nodes=n) for r, n in racks.items()],
                         group_sizes={kind: getattr(layout, kind) for kind in ("tp", "pp", "dp", "cp")})


def with_rack_neighbours(view: PlacementView, cluster: Cluster | None, *, per_rack: int = 8) -> PlacementView:
    """`view` with the other nodes of its racks drawn empty (up to `per_rack` a rack, the rest
    counted): where the gang sits among what it could have had."""
    if cluster is None:
        return view
    racks = []
    for rack in view.racks:
        used = {n.name for n in rack.nodes}
        others = [n for n in cluster.nodes if n.rack == rack.name and n.name not in used]
        extra = [NodeBox(name=n.name, address=n.address, capacity=n.gpus, devices=[], used=False)
                 for n in others[:per_rack]]
        order = {n.name: i for i, n in enumerate(cluster.nodes)}
        nodes = sorted([*rack.nodes, *extra], key=lambda n: order.get(n.name, len(order)))
        racks.append(rack.model_copy(update={"nodes": nodes, "more_nodes": max(0, len(others) - per_rack)}))
    return view.model_copy(update={"racks": racks})


# -- live ----------------------------------------------------------------------------------------

def _beats(attempt: AttemptInfo | None, placement: Placement | None) -> dict[int, int]:
    """Rank → its last heartbeat step, for the live attempt whose placement is shown."""
    if attempt is None or placement is None or placement.attempt != attempt.attempt:
        return {}
    return {rank: beat.step for rank, beat in _heartbeats(attempt, placement.layout.world_size).items()
            if beat.progress_step is not None}


def _heartbeats(attempt: AttemptInfo, world_size: int) -> dict[int, Any]:
    """The beats of the attempt's ranks where its heartbeat folder is readable from here (the
    embedded stack, a shared volume); {} elsewhere (then MLflow tells the progress)."""
    from trainyard.plugins.run.heartbeat import read_heartbeats

    handle = attempt.run_handle
    if handle is None or not handle.heartbeat_dir or not Path(handle.heartbeat_dir).is_dir():
        return {}
    beats = read_heartbeats(handle.heartbeat_dir, range(world_size))
    return {r: b for r, b in beats.items() if b.run in ("", attempt.run) and b.attempt == attempt.attempt}


def rank_views(attempt: AttemptInfo | None, settings: Settings,
               runtime: Runtime | None = None) -> tuple[list[RankLive], str]:
    """Each rank of the live attempt as its launcher sees it, with its last `LOG_LINES` lines,
    and — while its gang has not started — why, in the launcher's words (on Kueue the queue's
    own: "Kueue: pending: couldn't assign flavors … insufficient unused quota for cpu …");
    ([], '') without a live attempt, or where its launcher cannot be asked from here."""
    if attempt is None or attempt.run_handle is None:
        return [], ""
    from trainyard.plugins.attempt.launchers import Runtime, launcher_for

    handle = attempt.run_handle
    try:
        launcher = launcher_for(handle, runtime or Runtime(settings))
        status = launcher.poll(handle)
    except Exception as e:  # noqa: BLE001 - a launcher that cannot answer here: the page shows the rest
        log.info("ranks of %s/%s not shown: %s: %s", handle.job, handle.run, type(e).__name__, e)
        return [], ""
    waiting = status.message if status.state == "pending" else ""
    views = []
    for r in sorted(status.ranks, key=lambda r: r.rank):
        try:
            tail = launcher.logs(handle, rank=r.rank, tail=LOG_LINES).splitlines()[-LOG_LINES:]
        except Exception:  # noqa: BLE001 - the log of one rank unreadable: its state still shows
            tail = []
        views.append(RankLive(rank=r.rank, node=r.node, state=rank_state(r), step=r.step,
                              heartbeat_age_s=r.heartbeat_age_s, log_tail=tail))
    return views, waiting


def rank_state(rank: Any) -> str:
    """One word or phrase for a rank (`RankStatus`): its exit's meaning once it exited."""
    if rank.exit_code is not None:
        return rank.outcome or f"exited {rank.exit_code}"
    return "hung" if rank.hung else "running"


def _live(ctx: _Context, attempt: AttemptInfo | None, placement: Placement | None, *, with_curve: bool = True) -> Live:
    max_steps = _max_steps(ctx)
    curve = _loss_curve(ctx) if with_curve else []
    if attempt is not None:
        world = placement.layout.world_size if placement is not None else (attempt.run_handle.world_size
                                                                   if attempt.run_handle else 1)
        beats = _heartbeats(attempt, world)
        if beats:
            first = beats[min(beats)]
            steps = [b.progress_step for b in beats.values() if b.progress_step is not None]
            return Live(source="heartbeats", step=min(steps) if steps else None, max_steps=max_steps,
                        loss=first.loss, tokens_per_s=first.tokens_per_s, mfu=_mfu(ctx, first.tokens_per_s),
                        updated_at=datetime.fromtimestamp(max(b.time for b in beats.values()), UTC),
                        ranks_reporting=len(beats), loss_curve=curve)
    run = ctx.mlflow
    if run is None:
        return Live(source="none", max_steps=max_steps)
    latest = {m.key: m for m in run.data._metric_objs}  # the latest point of each key, with its step
    loss = latest.get("loss")
    tps = latest.get("tokens_per_s")
    mfu = latest.get("mfu")
    stamp = max((m.timestamp for m in latest.values() if m.key in ("loss", "tokens_per_s")), default=None)
    return Live(source="mlflow", step=loss.step if loss else None, max_steps=max_steps,
                loss=loss.value if loss else None, tokens_per_s=tps.value if tps else None,
                mfu=mfu.value if mfu else _mfu(ctx, tps.value if tps else None),
                updated_at=datetime.fromtimestamp(stamp / 1000, UTC) if stamp else None, loss_curve=curve)


def _max_steps(ctx: _Context) -> int | None:
    """The run's max steps as it was launched (the MLflow param holds the trigger form's
    override), else the spec's."""
    if ctx.mlflow is not None:
        value = ctx.mlflow.data.params.get("spec.training.maxSteps")
        if value and value.isdigit():
            return int(value)
    return ctx.job.spec.training.max_steps if ctx.job is not None else None


def _mfu(ctx: _Context, tokens_per_s: float | None) -> float | None:
    if tokens_per_s is None or ctx.job is None:
        return None
    from trainyard.plugins.tracking.cost import run_mfu

    try:
        return run_mfu(ctx.job, tokens_per_s, cluster=ctx.cluster)
    except ValueError:
        return None


def _loss_curve(ctx: _Context) -> list[tuple[int, float]]:
    points = _history(ctx, "loss")
    if len(points) <= CURVE_POINTS:
        return points
    stride = (len(points) - 1) / (CURVE_POINTS - 1)
    return [points[round(i * stride)] for i in range(CURVE_POINTS)]


def _history(ctx: _Context, key: str) -> list[tuple[int, float]]:
    """(step, value) of a metric, one per step (the later point of a step logged twice)."""
    return [(step, value) for step, value, _ in _points(ctx, key)]


def _points(ctx: _Context, key: str) -> list[tuple[int, float, int]]:
    """(step, value, timestamp ms), one per step, by step; read once per view."""
    if ctx.mlflow is None:
        return []
    if key not in ctx.histories:
        ctx.histories[key] = _read_points(ctx, key)
    return ctx.histories[key]


def _read_points(ctx: _Context, key: str) -> list[tuple[int, float, int]]:
    from trainyard.plugins.tracking.runs import client_for

    try:
        history = client_for(ctx.settings.mlflow_tracking_uri).get_metric_history(ctx.info.mlflow_run_id, key)
    except Exception as e:  # noqa: BLE001 - MLflow down mid-view: say so, show the rest
        ctx.notes.append(f"MLflow metric {key!r} could not be read: {type(e).__name__}: {e}")
        return []
    by_step = {m.step: (m.step, m.value, m.timestamp) for m in sorted(history, key=lambda m: (m.step, m.timestamp))}
    return [by_step[s] for s in sorted(by_step)]


# -- MLflow ----------------------------------------------------------------------------------------

def _mlflow_run(ctx: _Context) -> Run | None:
    if not ctx.info.mlflow_run_id:
        return None
    from trainyard.plugins.tracking.runs import client_for

    try:
        return client_for(ctx.settings.mlflow_tracking_uri).get_run(ctx.info.mlflow_run_id)
    except Exception as e:  # noqa: BLE001 - any failure of the tracking server: the view goes on
        ctx.notes.append(f"MLflow run {ctx.info.mlflow_run_id} could not be read: {type(e).__name__}: {e}")
        return None


def _mlflow_url(ctx: _Context) -> str:
    if ctx.mlflow is None:
        return ""
    from trainyard.plugins.tracking.ui_links import mlflow_run_url

    return mlflow_run_url(ctx.settings.mlflow_ui_url, ctx.mlflow.info.experiment_id, ctx.mlflow.info.run_id)


def _logged_checkpoints(ctx: _Context) -> set[tuple[int, str]]:
    """(step, manifest URI) of the checkpoints the watcher verified and recorded in MLflow."""
    if ctx.mlflow is None:
        return set()
    from trainyard.plugins.tracking.runs import checkpoints

    try:
        return {(c.step, c.manifest_uri) for c in checkpoints(ctx.info.mlflow_run_id,
                                                               tracking_uri=ctx.settings.mlflow_tracking_uri)}
    except Exception as e:  # noqa: BLE001 - see _mlflow_run
        ctx.notes.append(f"MLflow's checkpoint records could not be read: {type(e).__name__}: {e}")
        return set()


# -- checkpoints ---------------------------------------------------------------------------------

def _checkpoint_root(ctx: _Context) -> str:
    from trainyard.plugins.checkpoint.uris import checkpoint_root
    from trainyard.plugins.launch.environment import checkpoint_uri

    if ctx.job is not None:
        return checkpoint_uri(ctx.job, ctx.settings.object_store, ctx.info.run)
    return checkpoint_root(ctx.settings.object_store, ctx.info.job, ctx.info.run)


def _checkpoints(ctx: _Context, now: datetime) -> list[CheckpointRow]:
    """Committed and quarantined checkpoints, newest first. Files are checked for presence and
    size only (a re-hash of every checkpoint per page view would read the whole run); the
    SHA-256 check is the watcher's at commit and the restore's own."""
    from trainyard.plugins.checkpoint.catalog import read_manifest, scan, verify
    from trainyard.plugins.storage.store import open_store

    root = _checkpoint_root(ctx)
    try:
        store = open_store(root, endpoint_url=ctx.settings.s3_endpoint_url)
        found = scan(store)
        quarantined = {}
        for folder, why in found.quarantined.items():
            quarantined[folder] = (read_manifest(store, folder), why)
    except Exception as e:  # noqa: BLE001 - a store down or without credentials here: say so
        ctx.notes.append(f"checkpoints under {root} could not be listed: {type(e).__name__}: {e}")
        return []
    logged = _logged_checkpoints(ctx)
    rows = []
    for record in found.committed:
        report = verify(store, record, hashes=False)
        rows.append(_row(record, logged, report.ok, "" if report.ok else report.reason, ""))
    rows += [_row(record, logged, False, "", why or "quarantined") for record, why in quarantined.values()]
    rows.sort(key=lambda r: r.step, reverse=True)
    pick = next((r for r in rows if r.files_ok and not r.quarantined), None)
    return [r.model_copy(update={"resume_pick": r is pick}) for r in rows]


def _row(record: Any, logged: set[tuple[int, str]], ok: bool, problem: str, quarantined: str) -> CheckpointRow:
    return CheckpointRow(step=record.step, manifest_uri=record.manifest_uri, created_at=record.created_at,
                         size_bytes=sum(f.size for f in record.manifest.files), files_ok=ok, problem=problem,
                         verified_at_commit=(record.step, record.manifest_uri) in logged, quarantined=quarantined)


# -- attempts and recoveries ---------------------------------------------------------------------

def _attempts(ctx: _Context, attempts: list[AttemptInfo], layouts: dict[int, tuple[str, str]],
              airflow_base: str) -> list[AttemptView]:
    from trainyard.plugins.tracking.ui_links import airflow_dag_run_url

    rows = []
    for a in attempts:
        report = a.failure_report
        dag_run = airflow_dag_run_id(ctx.info.job, a.dag_run_id)
        url = airflow_dag_run_url(airflow_base, ctx.info.job, dag_run) if dag_run else ""
        timing = None
        if report is not None and report.failed and report.outcome != "launch_failed":
            timing = _timing(ctx, report, _devices(a, layouts))
        rows.append(AttemptView(
            attempt=a.attempt, dag_run_id=dag_run, state=a.state, started_at=a.started_at, ended_at=a.ended_at,
            outcome=a.outcome, reason=a.reason, action=a.action, action_reason=a.action_reason, step=a.step,
            resume_step=report.resume_step if report else None, restarts_in_place=a.restarts_in_place,
            nodes=_nodes(a, layouts),
            timing=timing, dag_run_url=url))
    return rows


def _nodes(attempt: AttemptInfo, layouts: dict[int, tuple[str, str]]) -> list[str]:
    """The nodes the attempt ran on: its placement's, else what its launcher's handle names."""
    from trainyard.plugins.placement.model import Placement

    placement_json = layouts.get(attempt.attempt, ("", ""))[1]
    if placement_json:
        return Placement.model_validate_json(placement_json).node_names
    handle = attempt.run_handle
    if handle is None:
        return []
    return list(handle.nodes) or list(dict.fromkeys(agent.node for agent in handle.agents))


def _devices(attempt: AttemptInfo, layouts: dict[int, tuple[str, str]]) -> int:
    from trainyard.plugins.placement.model import Placement

    placement_json = layouts.get(attempt.attempt, ("", ""))[1]
    if placement_json:
        return Placement.model_validate_json(placement_json).layout.world_size
    handle = attempt.run_handle
    return handle.world_size if handle is not None else 1


def _timing(ctx: _Context, report: Any, devices: int) -> Any:
    from trainyard.plugins.tracking.metrics import replay_key
    from trainyard.plugins.tracking.recovery_timing import recovery_timing

    trained_again = None
    if report.resume_step is not None:
        after_ms = report.detected_at.timestamp() * 1000
        for key in (replay_key("loss"), "loss"):  # the replayed steps come first when steps were lost
            first = next((t for step, _, t in _points(ctx, key) if step > report.resume_step and t >= after_ms), None)
            if first is not None:
                trained_again = datetime.fromtimestamp(first / 1000, UTC)
                break
    return recovery_timing(failed_at=report.failed_at, detected_at=report.detected_at, resumed_at=report.resumed_at,
                           trained_again_at=trained_again, step=report.step, resume_step=report.resume_step,
                           devices=devices, step_time_s=_step_time(ctx))


def _step_time(ctx: _Context) -> float | None:
    """A typical step of the run: the median of its `step_time_s` points."""
    times = [v for _, v in _history(ctx, "step_time_s")]
    return statistics.median(times) if times else None
