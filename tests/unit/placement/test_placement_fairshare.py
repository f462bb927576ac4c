from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.placement.placement_fixtures import inventory
from trainyard.config.teams import Teams
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.placement.fairshare import RunningGang, effective_priority, plan_preemption
from trainyard.plugins.placement.model import GangRequest, Unschedulable

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TEAMS = Teams.model_validate({"teams": {"lender": {"share": 0.5}, "borrower": {"share": 0.25},
                                        "other": {"share": 0.25}}})
SOLO = Teams.model_validate({"teams": {"solo": {"share": 1.0}}})
"""One team: every gang carries the same over-share penalty, so base priority decides."""


def gang(job: str, team: str, priority: str, nodes: list[str], *, ckpt_min_ago: float | None = None) -> RunningGang:
    return RunningGang(job=job, team=team, priority=priority, gpu_type="H100", nodes=dict.fromkeys(nodes, 8),
                       started_at=NOW - timedelta(hours=3),
                       last_checkpoint_at=None if ckpt_min_ago is None else NOW - timedelta(minutes=ckpt_min_ago))


def test_effective_priority_follows_the_seed() -> None:
    assert effective_priority("normal", 100, 100) == 500
    assert effective_priority("normal", 130, 100) == pytest.approx(200)  # 30 % over: −300
    assert effective_priority("critical", 50, 100) == 1000
    assert effective_priority("low", 0, 100, waiting_s=3 * 3600) == pytest.approx(260)
    assert effective_priority("low", 0, 100, waiting_s=100 * 3600) == 400  # bonus capped at 200
    assert effective_priority("normal", 8, 0) == pytest.approx(500 - 7000)  # no share: all borrowed
    with pytest.raises(ValueError, match="unknown priority 'urgent'"):
        effective_priority("urgent", 0, 1)


def test_no_victims_when_the_job_fits() -> None:
    inv = inventory([(4, 8, "H100")])
    plan = plan_preemption(GangRequest(job="j", team="lender", gpu_type="H100", layout=RankLayout(tp=8)), inv, inv.free_map(),
                           [], TEAMS, now=NOW)
    assert plan.victims == [] and len(plan.placement.nodes) == 1


def test_lowest_priority_first_then_least_work_lost_and_only_what_is_needed() -> None:
    inv = inventory([(4, 8, "H100")])
    running = [
        gang("old-ckpt", "solo", "low", ["r0-n0"], ckpt_min_ago=50),
        gang("fresh-ckpt", "solo", "low", ["r0-n1"], ckpt_min_ago=2),
        gang("normal", "solo", "normal", ["r0-n2"]),
        gang("spot", "solo", "preemptible", ["r0-n3"], ckpt_min_ago=90),
    ]
    free = inv.free_map({n: 8 for g in running for n in g.nodes})
    request = GangRequest(job="new", team="solo", priority="normal", gpu_type="H100", layout=RankLayout(tp=8, dp=2))
    plan = plan_preemption(request, inv, free, running, SOLO, now=NOW)
    # Preemptible goes first (lowest), then the low job with the most recent checkpoint; the
    # running normal job has the pending job's priority and is never a candidate.
    assert [v.job for v in plan.victims] == ["spot", "fresh-ckpt"]
    assert plan.victims[1].work_at_risk_s == 120
    assert set(plan.placement.node_names) == {"r0-n1", "r0-n3"}


def test_ranks_other_teams_by_fair_share_before_base_priority() -> None:
    inv = inventory([(4, 8, "H100")])  # 32 GPUs: "other" deserves 8
    running = [gang("other-low", "other", "low", ["r0-n0"]),          # other at 16 of 8: −1000
               gang("other-low2", "other", "low", ["r0-n1"]),
               gang("spot", "borrower", "preemptible", ["r0-n2"])]    # borrower at its share
    free = inv.free_map({n: 8 for g in running for n in g.nodes} | {"r0-n3": 8})
    plan = plan_preemption(GangRequest(job="new", team="lender", priority="normal", gpu_type="H100", layout=RankLayout(tp=8)),
                           inv, free, running, TEAMS, now=NOW)
    assert [v.job for v in plan.victims] == ["other-low"]
    assert plan.victims[0].effective_priority == -800


def test_over_share_team_yields_to_an_under_share_team() -> None:
    inv = inventory([(4, 8, "H100")])
    # The borrower (share 8 GPUs) holds 24: 200 % over → its normal jobs rank below the lender's.
    running = [gang(f"b{i}", "borrower", "normal", [f"r0-n{i}"]) for i in range(3)]
    running.append(gang("l0", "lender", "normal", ["r0-n3"]))
    free = inv.free_map({n: 8 for g in running for n in g.nodes})
    plan = plan_preemption(GangRequest(job="new", team="lender", priority="normal", gpu_type="H100", layout=RankLayout(tp=8)),
                           inv, free, running, TEAMS, now=NOW)
    assert len(plan.victims) == 1 and plan.victims[0].team == "borrower"
    # The other way round: the borrower may not evict the lender's job of equal base priority.
    with pytest.raises(Unschedulable, match="no running gang has a lower effective priority"):
        plan_preemption(GangRequest(job="more", team="borrower", priority="normal", gpu_type="H100", layout=RankLayout(tp=8)),
                        inv, free, [g for g in running if g.team == "lender"], TEAMS, now=NOW)


def test_whole_gangs_are_evicted_even_when_part_would_do() -> None:
    inv = inventory([(4, 8, "H100")])
    running = [gang("wide", "other", "low", ["r0-n0", "r0-n1", "r0-n2", "r0-n3"])]
    free = inv.free_map({n: 8 for n in running[0].nodes})
    plan = plan_preemption(GangRequest(job="new", team="lender", priority="high", gpu_type="H100", layout=RankLayout(tp=8)),
                           inv, free, running, TEAMS, now=NOW)
    assert [v.job for v in plan.victims] == ["wide"]
    assert plan.victims[0].nodes == dict.fromkeys(["r0-n0", "r0-n1", "r0-n2", "r0-n3"], 8)
    assert plan.victims[0].gpus == 32


def test_refuses_when_evicting_everything_eligible_is_not_enough() -> None:
    inv = inventory([(2, 8, "H100")])
    running = [gang("crit", "solo", "critical", ["r0-n0"]), gang("low", "solo", "low", ["r0-n1"])]
    free = inv.free_map({"r0-n0": 8, "r0-n1": 8})
    with pytest.raises(Unschedulable) as e:
        plan_preemption(GangRequest(job="new", team="solo", priority="high", gpu_type="H100", layout=RankLayout(tp=8, dp=2)),
                        inv, free, running, SOLO, now=NOW)
    assert "preempting all 1 lower-priority gangs (8 devices" in e.value.reason.message
    assert "needs 2 healthy H100 nodes" in e.value.reason.message
