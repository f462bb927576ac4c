"""A pipeline whose stages do not divide the layers trains like one process does: a 5-layer
tiny Llama on PP2 (stages of 3 + 2 layers, `trainyard.config.pipeline.stage_layer_counts`) and on PP2
with 2 virtual stages (1, 2, 1, 1), one torchrun launch of 2 processes (gloo), 20 steps,
loss within 1e-4 (relative, per step) of a single-process run of the same 5-layer model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.worker.equivalence_job import PLANS_UNEVEN
from tests.support.procs import check, run_torchrun
from trainyard.config.pipeline import stage_layer_counts

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("equivalence_job.py")
LAYERS = 5


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    out = tmp_path_factory.mktemp("equivalence-uneven") / "losses.json"
    check(run_torchrun(JOB, [str(out), f"--layers={LAYERS}", *PLANS_UNEVEN], nproc=2, timeout=600, fork_ranks=out.parent))
    return json.loads(out.read_text())


def test_the_plans_really_are_uneven() -> None:
    for plan in PLANS_UNEVEN.values():
        counts = stage_layer_counts(LAYERS, plan.layout.pp * plan.vpp)
        assert max(counts) > min(counts) and sum(counts) == LAYERS


@pytest.mark.parametrize("name", sorted(PLANS_UNEVEN))
def test_uneven_pipeline_matches_single_process(trajectories: dict[str, list[float]], name: str) -> None:
    ref, got = trajectories["reference"], trajectories[name]
    assert len(got) == len(ref) == 20
    assert ref[-1] < 0.8 * ref[0], f"the reference run did not learn: {ref[0]:.3f} → {ref[-1]:.3f}"
    worst = max(abs(g - r) / abs(r) for g, r in zip(got, ref, strict=True))
    assert worst <= 1e-4, (f"{name} ({PLANS_UNEVEN[name].describe()}) drifts from one process by "
                           f"{worst:.2e}\nreference {ref}\n{name} {got}")
