"""`watching.waiting_note`: what the training trigger writes on the DAG run's note while the
attempt's gang waits to start (on Kueue, in its team's queue, with Kueue's reason)."""

from __future__ import annotations

from trainyard.plugins.attempt.watching import waiting_note
from trainyard.plugins.run.model import RunStatus


def test_a_gang_waiting_in_its_queue_notes_why_once_per_reason_then_that_it_started() -> None:
    """What the training trigger writes on the DAG run's note while the gang waits (Kueue's reason)."""
    quota = ("Job phase Pending: Job suspended; not started: Kueue: pending: couldn't assign flavors to pod set "
             "main: insufficient unused quota for cpu in flavor trainyard-accelerators, 1 more needed")
    first = waiting_note(RunStatus(state="pending", message=quota), 1)
    assert first == f"attempt 1: waiting to start — {quota}"
    assert waiting_note(RunStatus(state="pending", message=quota), 1, first) == ""  # said once
    started = waiting_note(RunStatus(state="running", message="Job phase Running (2 active)"), 1, first)
    assert started == "attempt 1: started after waiting in its queue"
    assert waiting_note(RunStatus(state="running"), 1, started) == ""
    assert waiting_note(RunStatus(state="running"), 0) == ""  # a gang that never waited: no note
