"""`broadcast_from_rank0` across real ranks (torchrun, gloo): rank 0's value reaches every rank,
and rank 0's failure is every rank's failure, named — not a peer's closed connection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.procs import check, run_torchrun

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("objects_job.py")


def test_every_rank_gets_rank_0s_value_or_raises_its_error(tmp_path: Path) -> None:
    check(run_torchrun(JOB, [str(tmp_path)], nproc=2, fork_ranks=tmp_path / "run", timeout=180))
    rank0, rank1 = (json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1))
    assert rank0[0] == rank1[0] == ["value", "the manifest"]
    assert rank0[1] == ["FileNotFoundError", "no jsonl shards under file:///nowhere"]
    assert rank1[1] == ["RankZeroFailed", "rank 0 failed: FileNotFoundError: no jsonl shards under file:///nowhere"]
