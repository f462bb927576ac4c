"""The view model of a recorded run (`recorded.py`): what the Trainyard view says, checked
against what the platform recorded — plan and memory from the advisor, the placement from the
placer, checkpoints from the store, the recovery's figures computed by hand."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.unit.control_room.recorded import FIRST_DAG_RUN, JOB, RUN, STEP_S, Recorded, record_run
from trainyard.plugins.control_room.build import build_run_view
from trainyard.plugins.control_room.locate import run_of_dag_run
from trainyard.plugins.control_room.model import RunView
from trainyard.plugins.state.jobs import RunNotFound


def view_of(rec: Recorded, **kwargs: object) -> RunView:
    return build_run_view(rec.store, rec.store.get_run(JOB, RUN), rec.settings, **kwargs)  # type: ignore[arg-type]


def test_the_plan_and_its_memory_against_the_budget_and_the_device(recorded: Recorded) -> None:
    from trainyard.config.cluster import load_cluster
    from trainyard.plugins.advisor.hardware import hardware_for

    plan = view_of(recorded).plan
    assert plan is not None
    assert plan.label == recorded.plan.describe() and (plan.layout.tp, plan.layout.pp, plan.layout.dp) == (1, 1, 2)
    capacity = hardware_for(load_cluster("local"), "cpu").memory_bytes
    assert plan.memory.capacity_bytes == capacity == 4 << 30  # config/clusters/local.yaml: 4GiB a slot
    assert plan.memory.budget_bytes == int(capacity * recorded.settings.memory_fraction)
    assert plan.memory.total_bytes == recorded.plan.memory_per_gpu_bytes
    assert sum(plan.memory.items.values()) == plan.memory.total_bytes  # the bar's items add up to the estimate
    assert plan.step_split and sum(plan.step_split.values()) == pytest.approx(recorded.plan.step_time_s)
    assert plan.step_split["comm dp"] == pytest.approx(recorded.plan.communication_s["dp"])


def test_the_placement_map_holds_every_rank_with_its_groups(recorded: Recorded) -> None:
    placement = view_of(recorded).placement
    assert placement is not None
    assert [r.name for r in placement.racks] == ["local-rack"]
    nodes = placement.racks[0].nodes
    assert [n.name for n in nodes] == ["local-0", "local-1"]  # the unused one drawn beside it
    cells = [c for n in nodes for c in n.devices]
    assert sorted(c.rank for c in cells) == [0, 1]
    assert {c.groups["dp"] for c in cells} == {0}  # DP2: both ranks in one DP group
    assert {c.groups["tp"] for c in cells} == {0, 1}  # TP1: a group per rank
    used = {n.name for n in nodes if n.used}
    assert used == set(recorded.placement.node_names)


def test_checkpoints_say_which_one_a_resume_takes(recorded: Recorded) -> None:
    rows = view_of(recorded).checkpoints
    assert [r.step for r in rows] == [30, 20, 10, 5]
    assert [r.resume_pick for r in rows] == [True, False, False, False]
    assert [r.verified_at_commit for r in rows] == [False, True, True, True]  # 30 was never recorded
    assert all(r.files_ok and r.size_bytes > 0 for r in rows)


def test_the_recovery_figures_of_the_crash(recorded: Recorded) -> None:
    first, second = view_of(recorded).attempts
    assert (first.outcome, first.action, first.step, first.resume_step) == ("worker_crash", "restart", 19, 10)
    t = first.timing
    assert t is not None and second.timing is None
    assert t.detect_s == pytest.approx(0.26) and t.restart_s == pytest.approx(8.0)
    # failure → detection 0.26 s → gang started 8 s later → first step after the restore 12 s later
    assert t.time_to_train_again_s == pytest.approx(0.26 + 8 + 12)
    assert t.steps_lost == 9
    assert t.device_hours_lost == pytest.approx(2 * (20.26 + 9 * STEP_S) / 3600)


def test_links_to_each_attempts_dag_run_and_the_mlflow_run(recorded: Recorded) -> None:
    view = view_of(recorded, airflow_base="/af")
    first, second = view.attempts
    assert first.dag_run_id == FIRST_DAG_RUN and second.dag_run_id == f"{RUN}__attempt-1"
    assert first.dag_run_url == f"/af/dags/{JOB}/runs/manual__2026-05-01T12%3A00%3A00%2B00%3A00"
    assert second.dag_run_url == f"/af/dags/{JOB}/runs/{RUN}__attempt-1"
    assert view.mlflow_url.startswith("http://mlflow.example:5000/#/experiments/")
    # the model-training pages, not MLflow 3.17's GenAI default (`tracking.ui_links.WORKFLOW_QUERY`)
    assert view.mlflow_url.endswith(f"/runs/{recorded.mlflow_run_id}?workflowType=machine_learning")


def test_a_finished_run_shows_mlflows_latest_progress(recorded: Recorded) -> None:
    live = view_of(recorded).live
    assert (live.source, live.step, live.max_steps) == ("mlflow", 30, 200)
    assert live.loss == pytest.approx(5.0 - 0.1 * 30) and live.tokens_per_s == 2048.0
    assert live.mfu is not None and 0 < live.mfu < 1
    assert [s for s, _ in live.loss_curve] == list(range(1, 31))


def test_every_dag_run_of_the_chain_names_the_training_run(recorded: Recorded) -> None:
    for dag_run in (FIRST_DAG_RUN, f"{RUN}__attempt-1"):
        assert run_of_dag_run(recorded.store, JOB, dag_run).run == RUN
    with pytest.raises(RunNotFound):
        run_of_dag_run(recorded.store, JOB, "manual__1999-01-01T00:00:00+00:00")
    with pytest.raises(RunNotFound):
        run_of_dag_run(recorded.store, "another-job", FIRST_DAG_RUN)


def test_a_checkpoint_missing_a_file_is_not_what_a_resume_takes(tmp_path: Path) -> None:
    rec = _own_run(tmp_path)
    shard = next(Path(rec.checkpoint_root.removeprefix("file://"), "step-00000030").glob("__*"))
    shard.unlink()
    rows = {r.step: r for r in view_of(rec).checkpoints}
    assert not rows[30].files_ok and "missing" in rows[30].problem
    assert (rows[30].resume_pick, rows[20].resume_pick) == (False, True)


def test_a_live_attempt_shows_its_ranks_heartbeats(tmp_path: Path) -> None:
    from trainyard.plugins.run.heartbeat import Heartbeat, write_heartbeat
    from trainyard.plugins.run.model import RunHandle
    from trainyard.plugins.tracking.cost import run_mfu

    rec = _own_run(tmp_path)
    beats = tmp_path / "beats"
    beats.mkdir()
    state = rec.store
    state.transition(JOB, RUN, "completed")  # the recorded run ended; a second one trains now
    run2 = "20260502t090000-def456"
    state.open_run(JOB, trigger_key=f"{JOB}/manual__2", run=run2)
    handle = RunHandle(kind="local", job=JOB, run=run2, attempt=0, world_size=2, heartbeat_dir=str(beats))
    state.start_attempt(JOB, run2, 0, dag_run_id=f"{JOB}/manual__2", handle=handle)
    state.set_layout(JOB, run2, 0, plan=rec.plan.model_dump_json(),
                     placement=rec.placement.model_copy(update={"run": run2}).model_dump_json())
    now = time.time()
    for rank, step in ((0, 42), (1, 41)):
        write_heartbeat(beats, Heartbeat(job=JOB, run=run2, attempt=0, rank=rank, pid=1, step=step, time=now,
                                         loss=1.5, tokens_per_s=4096.0))
    view = build_run_view(state, state.get_run(JOB, run2), rec.settings)
    live = view.live
    assert (live.source, live.step, live.ranks_reporting, live.loss) == ("heartbeats", 41, 2, 1.5)
    assert live.mfu == pytest.approx(run_mfu(rec.job, 4096.0))
    assert live.updated_at is not None and abs(live.updated_at - datetime.fromtimestamp(now, UTC)) < timedelta(seconds=1)
    steps = {c.rank: c.step for n in view.placement.racks[0].nodes for c in n.devices}  # type: ignore[union-attr]
    assert steps == {0: 42, 1: 41}


def _own_run(tmp_path: Path) -> Recorded:
    """A recorded run of the test's own, for a test that changes it."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()
    return record_run(tmp_path / "home", uri)
