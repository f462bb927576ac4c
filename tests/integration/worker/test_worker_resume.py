"""DESIGN §5: for a fixed world size, an interrupted-and-resumed run ends with the same weights
as an uninterrupted one — bit for bit (FSDP2, 2 processes, the real train.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.worker.conftest import committed_steps, fsdp_plan, launch, tiny_job
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout

pytestmark = pytest.mark.slow


def test_sigkill_and_resume_ends_bit_identical(object_store: str, tmp_path: Path) -> None:
    plan = fsdp_plan()
    straight = launch(tiny_job("straight", max_steps=40, interval_steps=20), plan,
                      object_store=object_store, run_dir=tmp_path / "straight")
    assert straight.exit_codes() == [0, 0], straight.logs()

    job = tiny_job("interrupted", max_steps=40, interval_steps=20)
    killed = launch(job, plan, object_store=object_store, run_dir=tmp_path / "attempt-0",
                    faults="sigkill_after_checkpoint@20")
    assert killed.exit_codes() == [-9, -9], killed.logs()
    steps = committed_steps(object_store, "interrupted")
    assert steps == [20], f"expected only step 20 committed before the kill, found {steps}"

    resumed = launch(job, plan, object_store=object_store, run_dir=tmp_path / "attempt-1", attempt=1)
    assert resumed.exit_codes() == [0, 0], resumed.logs()
    assert "resumed from step 20" in resumed.rank_log(0), resumed.logs()

    a, b = straight.summary(), resumed.summary()
    assert sorted(map(int, b["losses"])) == list(range(21, 41)), "the resumed run must run steps 21..40"
    assert [b["losses"][str(s)] for s in range(21, 41)] == [a["losses"][str(s)] for s in range(21, 41)]
    assert b["params_sha256"] == a["params_sha256"]
    assert a["losses"]["40"] < a["losses"]["1"]


def test_interleaved_pipeline_resume_ends_bit_identical(object_store: str, tmp_path: Path) -> None:
    """Pipeline stages restore through `ParallelModel.state_module` (several stages per rank)."""
    plan = Plan(layout=RankLayout(pp=2), vpp=2, micro_batch_size=2, num_micro_batches=4, global_batch_size=8)
    straight = launch(tiny_job("pp-straight", max_steps=12, interval_steps=6, numLayers=4), plan,
                      object_store=object_store, run_dir=tmp_path / "straight")
    assert straight.exit_codes() == [0, 0], straight.logs()
    job = tiny_job("pp-interrupted", max_steps=12, interval_steps=6, numLayers=4)
    killed = launch(job, plan, object_store=object_store, run_dir=tmp_path / "attempt-0",
                    faults="sigkill_after_checkpoint@6")
    assert killed.exit_codes() == [-9, -9], killed.logs()
    resumed = launch(job, plan, object_store=object_store, run_dir=tmp_path / "attempt-1", attempt=1)
    assert resumed.exit_codes() == [0, 0], resumed.logs()
    assert resumed.summary()["params_sha256"] == straight.summary()["params_sha256"]
