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


def test_on_a_kueue_cluster_the_placer_never_evicts_and_hands_the_gang_to_the_queue(tmp_path: Path) -> None:
    """Kueue is the one preemptor there: a higher-priority gang that does not fit is placed on
    the fleet without a reservation (Kueue admits it, or evicts for it) and the running gang keeps
    its devices and its reservation."""
    from trainyard.plugins.attempt.preempt import queue_admits

    settings = Settings(home=tmp_path / "home")
    store, jobs = open_state(settings.state_db), JobStateStore(settings.state_db)
    local = load_cluster("local")
    kueue = local.model_copy(update={"spec": local.spec.model_copy(update={
        "mode": "kubernetes", "launcher": {"queueing": "kueue"}})})
    assert queue_admits(kueue) and not queue_admits(local)
    assert not queue_admits(kueue.model_copy(update={"spec": kueue.spec.model_copy(update={"launcher": {}})}))
    low = make_job("low-one", gpu_count=4)
    low = low.model_copy(update={"metadata": low.metadata.model_copy(update={"priority": "low"})})
    high = make_job("high-one", gpu_count=2)
    high = high.model_copy(update={"metadata": high.metadata.model_copy(update={"priority": "critical"})})
    first = place_preempting(low, Plan(layout=RankLayout(dp=4)), kueue, store, jobs, load_teams(), Runtime(settings),
                             run="r-low", attempt=0)
    assert not first.queued and store.placement("low-one", 0, run="r-low") is not None
    second = place_preempting(high, Plan(layout=RankLayout(dp=2)), kueue, store, jobs, load_teams(),
                              Runtime(settings), run="r-high", attempt=0)
    assert second.queued and second.evicted == [] and second.placement.layout.world_size == 2
    assert store.placement("high-one", 0, run="r-high") is None  # nothing reserved: Kueue admits it
    assert store.placement("low-one", 0, run="r-low") is not None  # and nobody evicted here
