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
    out = check(run_torchrun(JOB, nproc=2, fork_ranks=tmp_path / "run", timeout=180)).stdout
    got = {(rank, fail): tuple(rest) for rank, fail, *rest in
           (json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line)}
    assert got[(0, False)] == got[(1, False)] == ("value", "the manifest")
    assert got[(0, True)] == ("FileNotFoundError", "no jsonl shards under file:///nowhere")
    assert got[(1, True)] == ("RankZeroFailed", "rank 0 failed: FileNotFoundError: no jsonl shards under file:///nowhere")
