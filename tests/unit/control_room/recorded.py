"""A training run recorded the way the platform records one, without training: the demo job
planned by the real advisor and placed by the real placer on the local cluster, two attempts
in a real job-state database (attempt 0 crashed at step 19 and resumed from step 10, attempt 1
completed), committed checkpoints in a real object store, and its MLflow run in a real store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.support.procs import REPO_ROOT
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.placement.model import Placement
from trainyard.plugins.state.jobs import JobStateStore

JOB = "demo-tiny-lm"
RUN = "20260501t120000-abc123"
FIRST_DAG_RUN = "manual__2026-05-01T12:00:00+00:00"
T0 = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
STEP_S = 0.5
"""Seconds per training step of the recorded run."""


@dataclass
class Recorded:
    settings: Settings
    store: JobStateStore
    job: TrainingJob
    plan: Plan
    placement: Placement
    mlflow_run_id: str
    checkpoint_root: str


def settings_for(home: Path, tracking_uri: str) -> Settings:
    return Settings(home=home, jobs_dir=REPO_ROOT / "config" / "jobs", mlflow_tracking_uri=tracking_uri,
                    state_db=f"sqlite:///{home / 'state.db'}", mlflow_ui_url="http://mlflow.example:5000")


def plan_and_place(job: TrainingJob, attempt: int) -> tuple[Plan, Placement]:
    from trainyard.config.cluster import load_cluster
    from trainyard.plugins.advisor import plan_job
    from trainyard.plugins.placement.gang import place_gang
    from trainyard.plugins.placement.inventory import Inventory
    from trainyard.plugins.placement.model import GangRequest

    cluster = load_cluster("local")
    plan = plan_job(job, cluster).best
    assert plan is not None
    placement = place_gang(GangRequest.for_job(job, plan, run=RUN, attempt=attempt), Inventory.from_cluster(cluster))
    return plan, placement


def record_run(home: Path, tracking_uri: str) -> Recorded:
    from tests.unit.checkpoint.fabricate import make_checkpoint
    from trainyard.config.loader import load_spec_file
    from trainyard.plugins.launch.environment import checkpoint_uri
    from trainyard.plugins.recovery.model import FailureReport, RecoveryAction
    from trainyard.plugins.run.model import RunHandle
    from trainyard.plugins.storage.store import open_store
    from trainyard.plugins.tracking import runs

    settings = settings_for(home, tracking_uri)
    job = load_spec_file(REPO_ROOT / "config" / "jobs" / f"{JOB}.yaml")
    store = JobStateStore(settings.state_db)
    plan, placement = plan_and_place(job, 0)
    rid = runs.start_or_resume_run(job, plan, tracking_uri=tracking_uri, attempt=0, trigger_id=RUN)
    root = checkpoint_uri(job, settings.object_store, RUN)
    objects = open_store(root)

    store.open_run(JOB, trigger_key=f"{JOB}/{FIRST_DAG_RUN}", team="demo", project="tiny-lm", run=RUN,
                   now=T0)
    store.transition(JOB, RUN, "scheduling", now=T0)
    store.transition(JOB, RUN, "starting", now=T0)
    handle0 = RunHandle(kind="local", job=JOB, run=RUN, attempt=0, world_size=2, created_at=T0 + timedelta(seconds=2),
                        nodes=placement.node_names, heartbeat_dir=str(home / "no-such-heartbeats"))
    store.start_attempt(JOB, RUN, 0, dag_run_id=f"{JOB}/{FIRST_DAG_RUN}", handle=handle0, now=T0)
    store.set_layout(JOB, RUN, 0, plan=plan.model_dump_json(), placement=placement.model_dump_json())
    store.set_mlflow_run(JOB, RUN, rid)
    store.transition(JOB, RUN, "running", now=T0)
    client = runs.client_for(tracking_uri)
    _train(client, rid, range(1, 20), T0 + timedelta(seconds=5))
    for step in (5, 10):  # committed and recorded by the checkpoint watcher
        manifest = make_checkpoint(objects, step, metrics={"loss": 5.0 - 0.1 * step},
                                   created_at=T0 + timedelta(seconds=5 + step * STEP_S))
        runs.log_committed_checkpoint(rid, f"{root}/step-{step:08d}/MANIFEST.json", tracking_uri=tracking_uri)
        assert manifest.step == step

    failed_at = T0 + timedelta(seconds=15)
    detected_at = failed_at + timedelta(seconds=0.26)
    crash = FailureReport(job=JOB, run=RUN, attempt=0, outcome="worker_crash", reason="rank 1 was killed by SIGKILL",
                          rank=1, step=19, exit_code=-9, started_at=T0, ended_at=detected_at, failed_at=failed_at,
                          detected_at=detected_at, resume_step=10)
    store.finish_attempt(crash, RecoveryAction(kind="restart", reason="restart from step 10", resume_step=10),
                         now=detected_at)
    resumed_at = detected_at + timedelta(seconds=8)
    store.transition(JOB, RUN, "scheduling", now=resumed_at)
    store.transition(JOB, RUN, "starting", now=resumed_at)
    plan1, placement1 = plan_and_place(job, 1)
    handle1 = RunHandle(kind="local", job=JOB, run=RUN, attempt=1, world_size=2, created_at=resumed_at,
                        nodes=placement1.node_names)
    store.start_attempt(JOB, RUN, 1, dag_run_id=f"{JOB}/{RUN}__attempt-1", handle=handle1, now=resumed_at)
    store.set_layout(JOB, RUN, 1, plan=plan1.model_dump_json(), placement=placement1.model_dump_json())
    store.set_resumed(JOB, RUN, 0, resumed_at)
    store.transition(JOB, RUN, "running", now=resumed_at)
    # attempt 1 restores step 10 and trains 11.. again: the first step after the restore is
    # logged 12 s after the resume (the replay of 11..19 goes to loss.replay)
    _train(client, rid, range(11, 31), resumed_at + timedelta(seconds=12))
    make_checkpoint(objects, 20, metrics={"loss": 3.0}, created_at=resumed_at + timedelta(seconds=20))
    runs.log_committed_checkpoint(rid, f"{root}/step-{20:08d}/MANIFEST.json", tracking_uri=tracking_uri)
    make_checkpoint(objects, 30, metrics={"loss": 2.0}, created_at=resumed_at + timedelta(seconds=30))  # not logged
    ended = resumed_at + timedelta(seconds=30)
    done = FailureReport(job=JOB, run=RUN, attempt=1, outcome="completed", reason="all ranks exited 0", step=30,
                         started_at=resumed_at, ended_at=ended, detected_at=ended)
    store.finish_attempt(done, RecoveryAction(kind="register", reason="completed"), now=ended)
    # the registration ends the run (`steps.register`), as it does in the DAG
    store.transition(JOB, RUN, "completed", reason=f"registered {JOB} version 1 from step 30; candidate moved: "
                     "no version held it", now=ended)
    return Recorded(settings, store, job, plan, placement, rid, root)


def _train(client: object, rid: str, steps: range, start: datetime) -> None:
    """Points as the streamer logs them: `loss`, `tokens_per_s`, `step_time_s` at each step,
    stamped `STEP_S` apart; a step the run already has goes to `loss.replay`."""
    from mlflow.entities import Metric

    from trainyard.plugins.tracking.metrics import replay_key

    have = {m.step for m in client.get_metric_history(rid, "loss")}  # type: ignore[attr-defined]
    metrics = []
    for i, step in enumerate(steps):
        ts = int((start + timedelta(seconds=i * STEP_S)).timestamp() * 1000)
        loss_key = replay_key("loss") if step in have else "loss"
        metrics += [Metric(loss_key, 5.0 - 0.1 * step, ts, step), Metric("tokens_per_s", 2048.0, ts, step),
                    Metric("step_time_s", STEP_S, ts, step)]
    client.log_batch(rid, metrics=metrics, synchronous=True)  # type: ignore[attr-defined]
