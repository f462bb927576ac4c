"""Preemption with real torchrun gangs (the launcher's tiny job, which answers SIGTERM with its
"emergency checkpoint" exit 43): a high-priority gang that does not fit evicts the running
low-priority one, whose evidence classifies as `preempted` and is requeued outside the restart
budget; the requeued attempt is placed again once the devices come back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.launch.test_local_launcher import ENTRYPOINT, wait_for
from tests.support import procs
from tests.support.procs import REPO_ROOT
from trainyard.config.cluster import load_cluster
from trainyard.config.loader import load_spec_file
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.config.teams import load_teams
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.attempt.bookkeeping import DecisionInputs, decide_from_catalog
from trainyard.plugins.attempt.evidence import gather
from trainyard.plugins.attempt.launchers import Runtime
from trainyard.plugins.attempt.preempt import place_preempting
from trainyard.plugins.attempt.watching import read_stop_reason
from trainyard.plugins.launch.environment import build_worker_env
from trainyard.plugins.launch.local import LocalLauncher
from trainyard.plugins.placement.model import NotSchedulableNow
from trainyard.plugins.recovery.classify import classify
from trainyard.plugins.recovery.model import AttemptConf
from trainyard.plugins.state.jobs import JobStateStore
from trainyard.plugins.state.reservations import open_state

pytestmark = pytest.mark.slow
RUN_LOW, RUN_HIGH = "20260101t000000-10w10w", "20260101t000001-4164a4"


def spec(tmp_path: Path, name: str, priority: str, gpus: int, args: list[str]) -> TrainingJob:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "training.platform/v1", "kind": "TrainingJob",
        "metadata": {"name": name, "team": "demo", "priority": priority},
        "spec": {"source": {"entrypoint": ENTRYPOINT, "args": args},
                 "hardware": {"gpuType": "cpu", "gpuCount": gpus, "nodesPreferred": 2},
                 "parallelism": {"strategy": "manual"}, "dataset": {"source": "datasets/none/"},
                 "training": {"maxSteps": 3}, "faultTolerance": {"hangTimeout": "5m"}},
    }))
    return load_spec_file(path)


def test_a_higher_priority_gang_evicts_the_low_one_which_is_requeued_and_placed_again(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    cluster, teams = load_cluster("local"), load_teams()  # 2 nodes × 2 slots
    store, jobs = open_state(settings.state_db), JobStateStore(settings.state_db)
    low = spec(tmp_path, "tiny-low", "low", 2, ["--steps", "100000", "--sleep", "0.2"])
    high = spec(tmp_path, "tiny-high", "high", 4, [])
    kw: dict[str, Any] = {"grace_s": 20.0}

    placed = place_preempting(low, Plan(layout=RankLayout(dp=2)), cluster, store, jobs, teams, Runtime(settings), run=RUN_LOW, attempt=0, **kw)
    assert placed.evicted == [] and sorted(placed.placement.node_names) == ["local-0", "local-1"]
    # Reserved but not launched (no handle in the job state): nothing the platform can stop.
    with pytest.raises(NotSchedulableNow, match="no running gang has a lower effective priority"):
        place_preempting(high, Plan(layout=RankLayout(dp=4)), cluster, store, jobs, teams, Runtime(settings), run=RUN_HIGH, attempt=0, **kw)

    jobs.open_run(low.name, trigger_key="t-low", team="demo", run=RUN_LOW)
    jobs.start_attempt(low.name, RUN_LOW, 0)
    launcher = LocalLauncher(settings.runs_dir, source_dir=REPO_ROOT, base_env=procs.test_env({"OMP_NUM_THREADS": "1"}))
    handle = launcher.submit(low, Plan(layout=RankLayout(dp=2)), placed.placement,
                             build_worker_env(low, Plan(layout=RankLayout(dp=2)), settings, run=RUN_LOW, attempt=0), attempt=0)
    jobs.set_handle(low.name, RUN_LOW, 0, handle)
    wait_for(launcher, handle, lambda s: s.step is not None and s.step >= 2)

    result = place_preempting(high, Plan(layout=RankLayout(dp=4)), cluster, store, jobs, teams, Runtime(settings), run=RUN_HIGH, attempt=0, **kw)
    (eviction,) = result.evicted
    assert (eviction.victim.job, eviction.victim.run, eviction.freed) == (low.name, RUN_LOW, 2)
    assert result.placement.layout.world_size == 4 and store.placement(high.name, 0, run=RUN_HIGH) is not None
    assert store.placement(low.name, 0, run=RUN_LOW) is None  # the victim's devices were freed
    status = eviction.status
    assert status is not None and status.state == "stopped" and not status.processes_alive
    codes = [r.exit_code for r in status.ranks]
    assert 43 in codes and set(codes) <= {43, 1}, codes  # SIGTERM → the emergency checkpoint exit
    stop = read_stop_reason(handle.run_dir)
    assert stop is not None and stop.reason == "preempted" and "tiny-high" in stop.detail

    report = classify(gather(handle, status, launcher=launcher, run=RUN_LOW))
    assert report.outcome == "preempted" and "emergency checkpoint committed" in report.reason, report
    action = decide_from_catalog(report, low, AttemptConf(run=RUN_LOW), DecisionInputs(checkpoint_uri=(tmp_path / "c").as_uri()))
    assert action.kind == "requeue" and not action.counts_against_budget
    requeued = AttemptConf(run=RUN_LOW).next_attempt(report, action)
    assert requeued.attempt == 1 and requeued.restarts_used == 0

    # The requeued attempt cannot preempt its preemptor (higher priority): it waits for capacity…
    with pytest.raises(NotSchedulableNow):
        place_preempting(low, Plan(layout=RankLayout(dp=2)), cluster, store, jobs, teams, Runtime(settings), run=RUN_LOW, attempt=1, wait_s=0, **kw)
    store.release(high.name, 0, run=RUN_HIGH)  # …which returns when the high-priority gang ends
    again = place_preempting(low, Plan(layout=RankLayout(dp=2)), cluster, store, jobs, teams, Runtime(settings), run=RUN_LOW, attempt=1, wait_s=30,
                             poll_s=0.5, **kw)
    assert again.evicted == [] and again.placement.layout.world_size == 2
