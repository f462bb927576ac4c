"""The seed's worked examples under the seed's own assumptions, the seed heuristic's known
mistakes, and the published configurations: every one of them ran, so none may be judged
not to fit; the throughput model stays within its documented error on the Megatron rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainyard.plugins.advisor.estimate import evaluate
from trainyard.plugins.advisor.hardware import CATALOG, hardware_from_spec
from trainyard.plugins.advisor.layout import PYTORCH, Layout
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.planner import plan_manual
from trainyard.plugins.advisor.published import (
    accuracy_summary,
    compare,
    published_runs,
    tokens_per_s_error,
)
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.advisor.search import TIE_TOLERANCE, search
from trainyard.plugins.advisor.seed import (
    SEED_EXAMPLE_2_PRINTED,
    seed_example_1,
    seed_example_2,
    seed_greedy_plan,
    seed_layer_params,
)


def test_seed_example_1_is_17_5_gb() -> None:
    items = seed_example_1()
    assert items["weights"] + items["gradients"] + items["optimizer"] == pytest.approx(13.4e9)
    # The seed writes 128 MB/layer (MiB) × 32 = "4.1 GB": 4 GiB, i.e. 4.29e9 bytes.
    assert items["activations"] == 4 * 1024**3
    assert sum(items.values()) == pytest.approx(17.5e9, rel=0.015)


def test_seed_example_2_printed_figures_halve_the_per_gpu_parameters() -> None:
    """Seed §3 prints 6.25 / 6.25 / 37.5 / 1.15 GB ('~51.4 GB'); its formulas give twice that
    model state (200e9 / (8·4) = 6.25e9 parameters, not bytes) and twice the activations."""
    items = seed_example_2()
    assert items["weights"] == pytest.approx(12.5e9)
    assert items["optimizer"] == pytest.approx(75e9)
    for key in ("weights", "gradients", "optimizer"):
        assert items[key] == pytest.approx(2 * SEED_EXAMPLE_2_PRINTED[key])
    # 24·2·4096·4·12288·2/8 = 2.42e9 B; the seed prints 1.15 GB (half of it, rounded down).
    assert items["activations"] == pytest.approx(2 * SEED_EXAMPLE_2_PRINTED["activations"], rel=0.06)
    assert sum(SEED_EXAMPLE_2_PRINTED.values()) == pytest.approx(51.4e9, rel=0.01)
    assert sum(items.values()) > 80e9  # as written, the seed's layout does not fit an H100


def test_seed_layout_for_200b_fits_only_with_a_sharded_optimizer() -> None:
    """What our model says of the seed's TP=8, PP=4, DP=8 (micro-batch 4, 32 micro-batches,
    checkpointing): no fit with replicated optimizer state, a fit once it is sharded."""
    model = ModelProfile(hidden_size=12288, num_layers=96, num_heads=96, num_kv_heads=96,
                         ffn_hidden_size=49152, vocab_size=50304, sequence_length=4096,
                         global_batch_size=1024, activation="gelu")
    h100 = hardware_from_spec(CATALOG["H100"])
    layout = Layout(RankLayout(tp=8, pp=4, dp=8), micro_batch_size=4, num_micro_batches=32, recompute="full",
                    sequence_parallel=True)
    assert not evaluate(model, h100, layout, impl=PYTORCH).fits
    assert evaluate(model, h100, replace(layout, zero_stage=1), impl=PYTORCH).fits


def test_seed_heuristic_cannot_plan_its_own_200b_example() -> None:
    # One 200B layer fits at TP=1, so TP stays 1 and PP would have to exceed 32.
    assert seed_layer_params(12288, 49152) * 16 < 80e9 * 0.85
    with pytest.raises(ValueError, match="PP=32"):
        seed_greedy_plan(params=200e9, hidden=12288, layers=96, ffn=49152, seq=4096,
                         global_batch=1024, gpus=256)


def test_seed_heuristic_ignores_the_global_batch() -> None:
    plan = seed_greedy_plan(params=6.7e9, hidden=4096, layers=32, ffn=11008, seq=4096,
                            global_batch=256, gpus=8)
    assert (plan.degrees.tp, plan.degrees.pp, plan.degrees.dp) == (1, 2, 4)  # its prose example says FSDP over 8
    assert plan.micro_batch_size * plan.num_micro_batches * plan.degrees.dp != 256


RUNS = published_runs()


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r.source}-{r.name}-{r.gpus}")
def test_configurations_that_ran_are_never_judged_not_to_fit(run) -> None:
    comparison = compare(run, memory_fraction=1.0)
    assert comparison.estimate.fits, (
        f"{run.name} ran on {run.hardware.gpu.name}, but the advisor estimates "
        f"{comparison.estimate.memory_bytes / 2**30:.1f} GiB")


@pytest.mark.parametrize("run", [r for r in RUNS if r.source in ("[N21] Table 1", "[K22] Tables 3, 5")],
                         ids=lambda r: f"{r.name}-{r.gpus}")
def test_megatron_throughput_within_the_documented_error(run) -> None:
    comparison = compare(run)
    for metric in ("tflops_per_gpu", "mfu"):
        error = comparison.error(metric)
        if error is not None:
            assert abs(error) < 0.25, f"{metric}: {error:+.0%}"


def test_torchtitan_memory_within_the_documented_error() -> None:
    for run in (r for r in RUNS if "memory_gib" in r.reported):
        error = compare(run).error("memory_gib")
        assert error is not None and abs(error) < 0.2


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r.source}-{r.name}-{r.gpus}")
def test_auto_mode_is_at_least_as_fast_as_the_published_configuration(run) -> None:
    """By its own estimate, `strategy: auto` on the same model, devices and implementation
    finds a layout no slower than what the authors ran (up to the 1 % tie the simpler layout
    wins). Llama 3 405B needs the uneven split: 126 layers on PP16."""
    published = compare(run).estimate
    result = search(run.model, run.hardware, run.gpus, impl=run.impl, memory_fraction=1.0, top_k=0)
    assert result.best is not None
    assert result.best.step_s <= published.step_s * (1 + TIE_TOLERANCE), (
        f"auto picks {result.best.layout.describe()} at {result.best.step_s:.2f} s; "
        f"{run.layout.describe()} runs in {published.step_s:.2f} s")


def test_accuracy_over_the_published_table() -> None:
    """The table's summary (benchmarks/advisor.py prints it too). The issue's target is 80 % of
    rows within ±20 % tokens/s; we reach 27 of 32 (84 %): every Megatron-LM model-parallel row
    ([N21] Table 1, [K22]), every DeepSpeed ZeRO-3 row ([N21] Table 2) and every torchtitan A100
    row is within; the Llama 3 rows and torchtitan's 500 W rows are not (docs/advisor.md says why)."""
    summary = accuracy_summary([compare(run) for run in RUNS])
    assert summary["rows"] == sum(1 for r in RUNS if r.reported) == 32
    assert summary["false_oom"] == 0
    assert summary["within_20pct"] >= 0.8 * summary["rows"]
    assert summary["median_abs_err"] < 0.15


def test_step_time_errors_count_as_inverse_throughput_errors() -> None:
    """[K22] rows report MFU and step time: the MFU error is the row's; a row with only a step
    time gets the inverse, and the two agree (same configuration, same FLOPs)."""
    comparison = compare(next(r for r in RUNS if r.source.startswith("[K22]")))
    mfu_error, step_error = comparison.error("mfu"), comparison.error("step_s")
    assert mfu_error is not None and step_error is not None
    assert tokens_per_s_error(comparison) == mfu_error
    # A row reporting only its step time: 10 % too slow is −9.1 % tokens/s.
    only_step = replace(comparison.run, reported={"step_s": comparison.run.reported["step_s"]})
    derived = tokens_per_s_error(replace(comparison, run=only_step))
    assert derived == pytest.approx(1 / (1 + step_error) - 1)
    # The paper's MFU and step time are rounded apart (41.5 %, 1.10 s): they agree to about half
    # a point of tokens/s, whatever the model's own error (a relative tolerance shrank with it).
    assert derived == pytest.approx(mfu_error, abs=0.01)


def _in_headroom(run, fraction: float = 0.9) -> bool:  # type: ignore[no-untyped-def]
    return compare(run).estimate.memory_bytes > fraction * run.hardware.memory_bytes


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r.source}-{r.name}-{r.gpus}")
def test_configurations_that_ran_plan_at_the_platform_budget(run) -> None:
    """At the platform's 90 % budget every one of them is a plan; those whose estimate is above
    the budget (inside the headroom) come with a warning giving both margins."""
    result = plan_manual(run.model, run.hardware, run.layout, impl=run.impl, memory_fraction=0.9,
                         top_k=0)
    assert result.feasible and result.best is not None
    if _in_headroom(run):
        assert result.headroom_warning is not None
        assert "over the budget" in result.headroom_warning and "to spare" in result.headroom_warning
    else:
        assert result.headroom_warning is None


def test_some_configurations_that_ran_needed_the_headroom_and_keeping_it_refuses_them() -> None:
    """Llama 3 405B on 16,384 H100s: an estimated 73.4 GiB against a 72 GiB budget. It ran, so
    it plans by default; a spec that keeps 10 % of the device free is refused it."""
    crowded = [r for r in RUNS if _in_headroom(r)]
    assert {r.name for r in crowded} >= {"Llama 3 405B, 16,384 GPUs"}
    for run in crowded:
        kept = plan_manual(run.model, run.hardware, run.layout, impl=run.impl, memory_fraction=0.9,
                           keep_headroom=0.1, top_k=0)
        assert not kept.feasible and kept.limit_bytes == int(0.9 * run.hardware.memory_bytes)
