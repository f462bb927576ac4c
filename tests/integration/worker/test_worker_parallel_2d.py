"""Two-dimensional plans (FSDP×TP, DDP×TP, PP×DDP, PP×FSDP, PP×TP) over `init_device_mesh`
train like one process does: one torchrun launch of 4 processes (gloo), 20 steps each, loss
within 1e-4 (relative, per step) of a single-process run with the same global batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.worker.equivalence_job import PLANS_2D
from tests.support.procs import check, run_torchrun

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("equivalence_job.py")


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    out = tmp_path_factory.mktemp("equivalence-2d") / "losses.json"
    check(run_torchrun(JOB, [str(out), *PLANS_2D], nproc=4, timeout=600, fork_ranks=out.parent))
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", sorted(PLANS_2D))
def test_2d_plan_matches_single_process(trajectories: dict[str, list[float]], name: str) -> None:
    ref, got = trajectories["reference"], trajectories[name]
    assert len(got) == len(ref) == 20
    worst = max(abs(g - r) / abs(r) for g, r in zip(got, ref, strict=True))
    assert worst <= 1e-4, (f"{name} ({PLANS_2D[name].describe()}) drifts from one process by "
                           f"{worst:.2e}\nreference {ref}\n{name} {got}")
