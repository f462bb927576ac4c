"""When the control plane calls a gang hung, and whom it blames (`watching.hang_stop`), on
heartbeat files as the worker writes them: the rank that froze is named only once its own
last progress is older than `hangTimeout` — never earlier, because a peer that finished the
same step a moment sooner crossed the timeout first (CI: a hang reported 29.97 s after the
named rank's last step, with a 30 s timeout)."""

from __future__ import annotations

import time
from pathlib import Path

from trainyard.plugins.attempt.watching import hang_stop
from trainyard.plugins.run.heartbeat import Heartbeat, heartbeat_path
from trainyard.plugins.run.model import RankStatus, RunHandle, RunStatus

TIMEOUT_S = 30.0


def _gang(tmp_path: Path, now: float, *, waiting_age_s: float, frozen_age_s: float) -> tuple[RunHandle, RunStatus]:
    """Rank 0 finished step 7 `waiting_age_s` ago and waits in the next collective, showing
    life; rank 1 finished step 7 `frozen_age_s` ago and has shown nothing since (stopped)."""
    beats = tmp_path / "heartbeats"
    ranks = []
    for rank, age, alive_at in ((0, waiting_age_s, now - 1.0), (1, frozen_age_s, now - frozen_age_s)):
        path = heartbeat_path(beats, rank)  # the file as the worker's writer leaves it
        path.parent.mkdir(exist_ok=True)
        path.write_text(Heartbeat(job="j", rank=rank, pid=100 + rank, step=7, time=now - age, alive_at=alive_at,
                                  hang_timeout_s=TIMEOUT_S).model_dump_json())
        ranks.append(RankStatus(rank=rank, pid=100 + rank, step=7, heartbeat_age_s=age, hung=age > TIMEOUT_S))
    handle = RunHandle(kind="local", job="j", attempt=0, world_size=2, heartbeat_dir=str(beats))
    return handle, RunStatus(state="running", ranks=ranks, step=7)


def test_no_hang_while_the_frozen_rank_is_not_yet_past_the_timeout(tmp_path: Path) -> None:
    handle, status = _gang(tmp_path, time.time(), waiting_age_s=30.01, frozen_age_s=29.97)
    assert status.ranks[0].hung and not status.ranks[1].hung
    assert hang_stop(status, handle) is None  # the waiting peer crossed first: not the culprit


def test_the_frozen_rank_is_named_once_past_the_timeout(tmp_path: Path) -> None:
    handle, status = _gang(tmp_path, time.time(), waiting_age_s=31.04, frozen_age_s=31.0)
    stop = hang_stop(status, handle)
    assert stop is not None and stop.reason == "hang" and stop.ranks == [1], stop


def test_all_stale_ranks_are_named_when_nothing_tells_them_apart(tmp_path: Path) -> None:
    handle, status = _gang(tmp_path, time.time(), waiting_age_s=31.0, frozen_age_s=31.0)
    stop = hang_stop(status, handle.model_copy(update={"heartbeat_dir": ""}))  # no files: nothing frozen
    assert stop is not None and stop.ranks == [0, 1], stop
