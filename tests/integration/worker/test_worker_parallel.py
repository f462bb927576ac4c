"""Every way `parallelize` can split the model trains like one process does.

One torchrun launch (2 processes, gloo) trains the same tiny Llama on the same 20 batches with
each plan, and a single-process reference with the same global batch. Data parallelism only
reorders the sums inside the gradient mean, so DDP and FSDP2 must match the reference within
1e-5 (relative, per step); tensor and pipeline parallelism also split the matmuls and the
micro-batches, so within 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.worker.equivalence_job import PLANS
from tests.support.procs import check, run_torchrun

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("equivalence_job.py")

TOLERANCE = {
    "ddp": 1e-5, "ddp_accumulate": 1e-5, "fsdp": 1e-5, "fsdp_zero2_selective_ac": 1e-5,
    "tp": 1e-4, "tp_sp_full_ac": 1e-4, "pp_1f1b": 1e-4, "pp_interleaved": 1e-4,
}


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    out = tmp_path_factory.mktemp("equivalence") / "losses.json"
    check(run_torchrun(JOB, [str(out), *PLANS], nproc=2, timeout=600, fork_ranks=out.parent))
    return json.loads(out.read_text())


def test_reference_learns(trajectories: dict[str, list[float]]) -> None:
    ref = trajectories["reference"]
    assert len(ref) == 20
    assert ref[-1] < 0.8 * ref[0], f"the reference run did not learn: {ref[0]:.3f} → {ref[-1]:.3f}"


@pytest.mark.parametrize("name", sorted(TOLERANCE))
def test_plan_matches_single_process(trajectories: dict[str, list[float]], name: str) -> None:
    ref, got = trajectories["reference"], trajectories[name]
    assert len(got) == len(ref)
    worst = max(abs(g - r) / abs(r) for g, r in zip(got, ref, strict=True))
    assert worst <= TOLERANCE[name], (
        f"{name} ({PLANS[name].describe()}) drifts from one process by {worst:.2e} "
        f"(tolerance {TOLERANCE[name]:.0e})\nreference {ref}\n{name} {got}")


def test_every_plan_is_checked() -> None:
    assert set(TOLERANCE) == set(PLANS)
