"""`place_preempting` without processes: a gang that neither fits nor may preempt (everything
running outranks it) waits for capacity when asked — a requeued attempt — and is placed as soon
as the devices come back; without `wait_s` it fails at once with why preempting cannot help."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.unit.tracking.factories import make_job
from trainyard.config.cluster import load_cluster
from trainyard.config.settings import Settings
from trainyard.config.teams import load_teams
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.attempt.launchers import Runtime
from trainyard.plugins.attempt.preempt import place_preempting
from trainyard.plugins.placement.model import NotSchedulableNow
from trainyard.plugins.state.jobs import JobStateStore
from trainyard.plugins.state.reservations import open_state


def test_a_requeued_gang_waits_for_capacity_and_takes_it_when_it_returns(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    store, jobs = open_state(settings.state_db), JobStateStore(settings.state_db)
    cluster, teams = load_cluster("local"), load_teams()
    big = make_job("big-one", gpu_count=4)
    small = make_job("small-one", gpu_count=2)
    placed = place_preempting(big, Plan(layout=RankLayout(dp=4)), cluster, store, jobs, teams, Runtime(settings), run="r-big", attempt=0)
    assert placed.placement.layout.world_size == 4
    with pytest.raises(NotSchedulableNow, match="no running gang has a lower effective priority"):
        place_preempting(small, Plan(layout=RankLayout(dp=2)), cluster, store, jobs, teams, Runtime(settings), run="r-small", attempt=1)
    # Same priority: nothing to preempt. The devices come back while the requeued attempt waits.
    timer = threading.Timer(1.0, store.release, args=("big-one", 0), kwargs={"run": "r-big"})
    timer.start()
    try:
        result = place_preempting(small, Plan(layout=RankLayout(dp=2)), cluster, store, jobs, teams, Runtime(settings), run="r-small", attempt=1,
                                  wait_s=120, poll_s=0.2)
    finally:
        timer.cancel()
    assert result.evicted == [] and result.placement.layout.world_size == 2 and result.waited_s > 0
    assert store.placement("small-one", 1, run="r-small") is not None
