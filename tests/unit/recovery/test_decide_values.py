"""`decide` over values alone: what it asks of the run's checkpoints (`checkpoint_query`), and
the action it returns from the answer it is handed — no catalog, no object store behind it
(test_decide.py holds the same rules against a real catalog, through the attempt engine)."""

from __future__ import annotations

import pytest

from tests.unit.recovery.test_decide import job, report
from trainyard.plugins.recovery.decide import DecisionContext, checkpoint_query, decide
from trainyard.plugins.recovery.model import (
    AttemptConf,
    AttemptRecord,
    CheckpointQuery,
    CheckpointRef,
    RejectedCheckpoint,
    ResumeCheckpoints,
)

ROOT = "file:///nowhere/jobs/demo-tiny-lm/runs/r-0001/checkpoints"


def ref(step: int) -> CheckpointRef:
    return CheckpointRef(step=step, manifest_uri=f"{ROOT}/step-{step:08d}/MANIFEST.json")


def test_the_query_asks_only_what_the_decision_reads() -> None:
    conf = AttemptConf()
    assert checkpoint_query(report("completed"), job(), conf) == CheckpointQuery(select=False, list_committed=True)
    assert checkpoint_query(report("cancelled"), job(), conf) is None
    assert checkpoint_query(report("user_error"), job(), conf) is None
    assert checkpoint_query(report("worker_crash"), job(), conf) == CheckpointQuery()
    assert checkpoint_query(report("diverged", onset_step=61), job(), conf) == CheckpointQuery(
        before_step=61, list_committed=True)
    assert checkpoint_query(report("diverged"), job(), conf) is None  # no onset: gives up unseen
    corrupt = report("checkpoint_corrupt", corrupt_checkpoint=ref(100).manifest_uri)
    assert checkpoint_query(corrupt, job(), conf) == CheckpointQuery(before_step=100)
    spent = AttemptConf(restarts_used=3, history=[AttemptRecord(attempt=0, outcome="hang")])
    assert checkpoint_query(report("worker_crash", attempt=1), job(max_restarts=3), spent) is None


def test_a_rollback_is_decided_from_the_checkpoints_handed_in() -> None:
    given = ResumeCheckpoints(chosen=ref(50), rejected=[RejectedCheckpoint(**ref(60).model_dump(), reason="bit rot")],
                              committed=[ref(50), ref(60), ref(100), ref(150)])
    action = decide(report("diverged", onset_step=61), job(), AttemptConf(), DecisionContext(checkpoints=given))
    assert (action.kind, action.resume_from, action.resume_step) == ("rollback", ref(50).manifest_uri, 50)
    # the quarantine is a value in the action: the attempt engine writes the markers
    assert action.quarantine == [ref(100).manifest_uri, ref(150).manifest_uri, ref(60).manifest_uri]


def test_a_restart_names_the_rejected_checkpoints_it_quarantines() -> None:
    given = ResumeCheckpoints(chosen=ref(50), rejected=[RejectedCheckpoint(**ref(100).model_dump(), reason="bit rot")])
    action = decide(report("hang"), job(), AttemptConf(), DecisionContext(checkpoints=given))
    assert (action.kind, action.resume_step, action.quarantine) == ("restart", 50, [ref(100).manifest_uri])
    assert "checkpoint step 100 does not verify (bit rot): quarantined" in action.reason


def test_a_decision_that_reads_checkpoints_refuses_to_guess_without_them() -> None:
    with pytest.raises(ValueError, match="checkpoint_query"):
        decide(report("worker_crash"), job(), AttemptConf(), DecisionContext())
    assert decide(report("cancelled"), job(), AttemptConf(), DecisionContext()).kind == "cancel"
