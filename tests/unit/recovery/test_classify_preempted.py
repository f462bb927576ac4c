"""A gang evicted for a higher-priority one (`StopReason` `preempted`, `plugins/attempt/preempt.py`)
classifies as `preempted` — with or without its emergency checkpoint — and is requeued outside the
restart budget; a person's stop still wins over it."""

from __future__ import annotations

from pathlib import Path

from tests.unit.recovery.runs import Rank, evidence
from trainyard.plugins.attempt.bookkeeping import DecisionInputs, decide_from_catalog
from trainyard.plugins.recovery.classify import classify
from trainyard.plugins.recovery.evidence import Evidence
from trainyard.plugins.recovery.model import AttemptConf
from trainyard.plugins.run.model import RunStatus


def test_an_evicted_gang_with_its_emergency_checkpoint_is_preempted_and_requeued(tmp_path: Path) -> None:
    from trainyard.config.loader import load_spec_file

    ev, _ = evidence(tmp_path, [Rank(43, ended_at=101)] * 2, stop_reason="preempted: evicted for big-job run r-1")
    report = classify(ev)
    assert report.outcome == "preempted"
    assert report.reason == "preempted by the platform: evicted for big-job run r-1 (emergency checkpoint committed)"
    job = load_spec_file(Path(__file__).resolve().parents[3] / "config" / "jobs" / "demo-tiny-lm.yaml")
    action = decide_from_catalog(report, job, AttemptConf(run="r-0001"), DecisionInputs(checkpoint_uri=(tmp_path / "c").as_uri()))
    assert action.kind == "requeue" and not action.counts_against_budget


def test_an_evicted_gang_killed_before_its_checkpoint_says_so(tmp_path: Path) -> None:
    ev, _ = evidence(tmp_path, [Rank(-9, ended_at=101)] * 2, stop_reason="preempted: evicted for big-job run r-1")
    report = classify(ev)
    assert report.outcome == "preempted" and "no emergency checkpoint" in report.reason


def test_a_gang_kueue_evicted_is_preempted_with_kueues_cause_and_requeued(tmp_path: Path) -> None:
    from trainyard.config.loader import load_spec_file

    cause = "Preempted (InCohortReclamation): Preempted to accommodate a workload (UID: u) due to reclamation"
    ev, _ = evidence(tmp_path, [Rank(43, ended_at=101)] * 2)
    ev = ev.model_copy(update={"status": ev.status.model_copy(update={"state": "failed", "evicted": cause})})
    report = classify(ev)
    assert report.outcome == "preempted"
    assert report.reason == f"preempted by Kueue: {cause} (emergency checkpoint committed)"
    job = load_spec_file(Path(__file__).resolve().parents[3] / "config" / "jobs" / "demo-tiny-lm.yaml")
    action = decide_from_catalog(report, job, AttemptConf(run="r-0001"), DecisionInputs(checkpoint_uri=(tmp_path / "c").as_uri()))
    assert action.kind == "requeue" and not action.counts_against_budget
    # its pods gone before any exit was seen: still preempted, resumed from the newest checkpoint
    gone = classify(Evidence(job="tiny", status=RunStatus(state="failed", evicted=cause)))
    assert gone.outcome == "preempted" and gone.reason.endswith("(resumes from the run's newest checkpoint)")
    # without the eviction the same exits are a SIGTERM from outside
    ev, _ = evidence(tmp_path / "c", [Rank(43, ended_at=101)] * 2)
    assert "from outside the platform" in classify(ev).reason


def _evicted(tmp_path: Path, cause: str, exits: list[Rank] | None = None) -> Evidence:
    ev, _ = evidence(tmp_path, exits or [Rank(43, ended_at=101)] * 2)
    return ev.model_copy(update={"status": ev.status.model_copy(update={"state": "failed", "evicted": cause})})


def test_a_queue_an_administrator_stopped_takes_the_gang_back_as_a_preemption(tmp_path: Path) -> None:
    cause = "ClusterQueueStopped: The ClusterQueue is stopped"
    report = classify(_evicted(tmp_path, cause))
    assert report.outcome == "preempted" and cause in report.reason  # requeued, to wait for the queue


def test_a_workload_a_person_deactivated_is_cancelled_never_restarted(tmp_path: Path) -> None:
    """`spec.active: false` is Kueue's documented way to stop a workload: its ranks' SIGTERM exits
    (43) must not read as a preemption to requeue."""
    report = classify(_evicted(tmp_path, "Deactivated: The workload is deactivated"))
    assert report.outcome == "cancelled" and "deactivated" in report.reason


def test_a_gang_whose_pods_were_not_ready_in_kueues_time_counts_against_the_budget(tmp_path: Path) -> None:
    """Kueue's waitForPodsReady eviction, and its own deactivation once it gave up requeuing: a
    failure to start, restarted within the budget — as a preemption it would come back for ever."""
    from trainyard.config.loader import load_spec_file

    job = load_spec_file(Path(__file__).resolve().parents[3] / "config" / "jobs" / "demo-tiny-lm.yaml")
    for cause in ("PodsReadyTimeout: Exceeded the PodsReady timeout default/w",
                  "DeactivatedDueToRequeuingLimitExceeded: exceeding the maximum number of re-queuing retries"):
        report = classify(_evicted(tmp_path / cause[:8], cause))
        assert report.outcome == "worker_crash" and report.reason == f"the gang did not start: Kueue evicted it: {cause}"
        action = decide_from_catalog(report, job, AttemptConf(run="r-0001"),
                                     DecisionInputs(checkpoint_uri=(tmp_path / "c").as_uri()))
        assert action.counts_against_budget, action


def test_kueue_evicting_the_gang_for_a_failed_node_is_a_lost_node(tmp_path: Path) -> None:
    cause = "NodeFailures: Workload was evicted due to node failures"
    report = classify(_evicted(tmp_path, cause))
    assert report.outcome == "node_lost" and report.reason == f"node lost: Kueue evicted the gang: {cause}"
