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
