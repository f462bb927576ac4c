"""The streaming reader's promise under torchrun: a checkpoint taken on 2 data-parallel ranks
resumes on 1 (and one taken on 1 resumes on 2) and continues the same global sample order —
with 2 stripes (`trainyard.plugins.data.stripes`), so the 2 ranks each read their own shards and the
checkpoint joins their stripes' positions (an all-gather as it saves).

The evidence is the loss: every step's global batch is the same 8 samples whichever data-
parallel size reads them, so the resumed runs' losses match an uninterrupted run's up to the
reordering of sums (1e-6 here), while a single repeated or skipped sample would move a step's
loss by far more than the tolerance. The sample-level proof (every sample exactly once per
epoch) is `tests/unit/data/test_data_stream.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.worker.conftest import committed_steps, launch, tiny_job
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout

pytestmark = pytest.mark.slow

STEPS, KILL_AT = 14, 7


def ddp(dp: int) -> Plan:
    return Plan(layout=RankLayout(dp=dp), micro_batch_size=8 // dp, global_batch_size=8, sequence_length=32)


def test_resume_onto_another_data_parallel_size_continues_the_sample_order(
        object_store: str, tmp_path: Path) -> None:
    straight = launch(tiny_job("reshard-straight", max_steps=STEPS, interval_steps=KILL_AT, stripes=2), ddp(2),
                      object_store=object_store, run_dir=tmp_path / "straight")
    assert straight.exit_codes() == [0, 0], straight.logs()
    reference = straight.summary()["losses"]
    for before, after in ((2, 1), (1, 2)):
        job = tiny_job(f"reshard-{before}-to-{after}", max_steps=STEPS, interval_steps=KILL_AT, stripes=2)
        killed = launch(job, ddp(before), object_store=object_store, run_dir=tmp_path / f"{before}-0",
                        faults=f"sigkill_after_checkpoint@{KILL_AT}")
        assert killed.exit_codes() == [-9] * before, killed.logs()
        assert committed_steps(object_store, job.metadata.name) == [KILL_AT]
        resumed = launch(job, ddp(after), object_store=object_store, run_dir=tmp_path / f"{before}-1",
                         attempt=1)
        assert resumed.exit_codes() == [0] * after, resumed.logs()
        assert f"resumed from step {KILL_AT}" in resumed.rank_log(0), resumed.logs()
        losses = resumed.summary()["losses"]
        assert sorted(map(int, losses)) == list(range(KILL_AT + 1, STEPS + 1))
        for step in range(KILL_AT + 1, STEPS + 1):
            assert losses[str(step)] == pytest.approx(reference[str(step)], rel=1e-4), (
                f"{before}→{after} ranks: step {step} saw other samples than the uninterrupted run")
        beat = resumed.heartbeat(0)
        assert beat.prefetch_depth is not None and beat.cache_hit_rate is not None
        assert beat.data_stall_s is not None and beat.data_stall_s >= 0
