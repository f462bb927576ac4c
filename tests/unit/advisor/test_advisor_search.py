"""The search: valid layouts only, pruning that loses nothing, ranking, pins, manual plans,
and what the advisor says when nothing fits."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from trainyard.config.cluster import load_cluster
from trainyard.config.loader import load_spec_file
from trainyard.config.spec import Parallelism
from trainyard.plugins.advisor.estimate import Evaluator
from trainyard.plugins.advisor.hardware import CATALOG, hardware_from_spec
from trainyard.plugins.advisor.layout import PYTORCH, Layout
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.planner import PLAN_JSON_KEYS, plan_auto, plan_job, plan_manual
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.advisor.search import (
    REJECT_FEW_MICRO,
    REJECT_INTERLEAVE,
    REJECT_MEMORY,
    TIE_TOLERANCE,
    divisors,
    search,
)

JOBS = Path(__file__).resolve().parents[3] / "config" / "jobs"
H100 = hardware_from_spec(CATALOG["H100"])
LLAMA7B = ModelProfile(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                       ffn_hidden_size=11008, vocab_size=32000, sequence_length=4096,
                       global_batch_size=256)
SMALL = ModelProfile(hidden_size=2048, num_layers=8, num_heads=16, num_kv_heads=4,
                     ffn_hidden_size=5632, vocab_size=32000, sequence_length=2048,
                     global_batch_size=32)


def test_demo_spec_plans_plain_data_parallelism_on_the_local_cluster() -> None:
    result = plan_job(load_spec_file(JOBS / "demo-tiny-lm.yaml"), load_cluster("local"))
    plan = result.best
    assert result.feasible and plan is not None
    assert (plan.layout.tp, plan.layout.pp, plan.layout.cp, plan.layout.dp) == (1, 1, 1, 2)
    assert plan.micro_batch_size * plan.num_micro_batches * plan.layout.dp == 16
    assert plan.memory_per_gpu_bytes is not None and plan.memory_per_gpu_bytes <= result.budget_bytes
    assert plan.nccl_env == {}  # gloo on CPU
    from trainyard.worker.distributed import parallelize as worker
    from trainyard.worker.models import llama

    job = load_spec_file(JOBS / "demo-tiny-lm.yaml")
    worker.check_plan(plan, llama.Llama(llama.LlamaConfig.from_hints(job.spec.parallelism.hints)))


def test_every_ranked_plan_is_valid_and_fits() -> None:
    found = search(LLAMA7B, H100, 16, top_k=20)
    assert found.ranked
    for est in found.ranked:
        lay = est.layout
        assert lay.degrees.world_size == 16
        assert lay.micro_batch_size * lay.num_micro_batches * lay.degrees.dp == LLAMA7B.global_batch_size
        assert LLAMA7B.num_heads % lay.degrees.tp == 0 and LLAMA7B.num_layers % lay.degrees.pp == 0
        assert lay.degrees.tp <= H100.gpus_per_node
        assert lay.degrees.pp == 1 or lay.num_micro_batches >= lay.degrees.pp
        assert est.memory_bytes <= found.budget_bytes
        assert not (lay.sequence_parallel and lay.degrees.tp == 1)


def test_ties_go_to_the_simpler_layout_and_the_rest_is_by_time() -> None:
    found = search(LLAMA7B, H100, 16, top_k=30)
    best, rest = found.ranked[0], found.ranked[1:]
    fastest = min(e.step_s for e in found.ranked)
    tied = [e for e in found.ranked if e.step_s <= fastest * (1 + TIE_TOLERANCE)]
    assert best.layout.complexity() == min(e.layout.complexity() for e in tied)
    assert [e.step_s for e in rest] == sorted(e.step_s for e in rest)


def test_pruned_search_finds_what_an_exhaustive_one_finds() -> None:
    """Brute force over the same space without pruning: same fitting set, same best."""
    gpus, evaluator = 8, Evaluator(SMALL, replace(H100, gpu=replace(H100.gpu, memory_bytes=12 * 1024**3)))
    found = search(SMALL, evaluator.hw, gpus, top_k=10_000)
    fitting = set()
    tps = [t for t in (1, 2, 4, 8) if SMALL.num_kv_heads % t == 0]  # TP splits the 4 KV heads
    for tp, pp in itertools.product(tps, divisors(SMALL.num_layers)):
        if gpus % (tp * pp):
            continue
        dp = gpus // (tp * pp)
        local = SMALL.global_batch_size // dp
        for mbs, vpp, sp, ac, zero in itertools.product(
                divisors(local), [1, 2, 4, 8], [False, True], ["none", "selective", "full"], [0, 1, 3]):
            m = local // mbs
            if (sp and tp == 1) or (vpp > 1 and (pp == 1 or (SMALL.num_layers // pp) % vpp or m % pp)) \
                    or (pp > 1 and m < pp) or (dp == 1 and zero) or vpp > SMALL.num_layers // pp:
                continue
            layout = Layout(RankLayout(tp=tp, pp=pp, dp=dp), vpp=vpp, zero_stage=zero, micro_batch_size=mbs,
                            num_micro_batches=m, recompute=ac, sequence_parallel=sp)  # type: ignore[arg-type]
            if evaluator.memory_bytes(layout) <= evaluator.limit:  # the device, headroom included
                fitting.add(layout)
    assert found.plans_fitting == len(fitting) > 0
    assert {e.layout for e in found.ranked} == fitting
    assert found.plans_considered == found.plans_fitting + sum(
        found.rejected.get(k, 0) for k in (REJECT_MEMORY, REJECT_FEW_MICRO, REJECT_INTERLEAVE))


def test_pinned_degrees_pin_the_search() -> None:
    pins = Parallelism(tensor_parallel=2, activation_checkpointing="selective", micro_batch_size=1)
    found = search(LLAMA7B, H100, 16, pins=pins, top_k=50)
    assert found.ranked
    assert all(e.layout.degrees.tp == 2 and e.layout.recompute == "selective" and e.layout.micro_batch_size == 1
               for e in found.ranked)


def test_seven_b_on_one_node_is_sharded_data_parallelism() -> None:
    """Seed §3 example 1: FSDP over 8 GPUs, no TP or PP."""
    result = plan_auto(LLAMA7B, H100, 8)
    assert result.best is not None
    assert (result.best.layout.tp, result.best.layout.pp, result.best.layout.dp) == (1, 1, 8)
    assert result.best.zero_stage >= 1


def test_nothing_fits_says_what_would() -> None:
    big = ModelProfile(hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8,
                       ffn_hidden_size=28672, vocab_size=128256, sequence_length=8192,
                       global_batch_size=64)
    result = plan_auto(big, H100, 4)
    assert not result.feasible and result.best is None
    assert result.rejected.get(REJECT_MEMORY, 0) > 0
    assert result.smallest_memory_bytes is not None and result.smallest_memory_bytes > result.budget_bytes
    assert any(s.startswith("more devices:") for s in result.suggestions)
    assert result.to_json() == {"feasible": False, "plan": None, "alternatives": [],
                                "rejected": result.rejected}


def test_manual_plan_is_evaluated_as_given() -> None:
    layout = Layout(RankLayout(tp=2, pp=2, dp=2), micro_batch_size=2, num_micro_batches=64, recompute="full")
    result = plan_manual(LLAMA7B, H100, layout)
    assert result.feasible and result.best is not None
    assert (result.best.layout.tp, result.best.layout.pp, result.best.layout.dp, result.best.micro_batch_size,
            result.best.activation_checkpointing) == (2, 2, 2, 2, "full")
    assert result.plans_evaluated == 1


def test_manual_plan_that_does_not_fit_gets_fixes_and_an_auto_plan() -> None:
    layout = Layout(RankLayout(dp=8), micro_batch_size=4, num_micro_batches=8)
    result = plan_manual(LLAMA7B, H100, layout)
    assert not result.feasible and result.evaluated is not None
    assert result.evaluated.memory_per_gpu_bytes > result.budget_bytes
    assert any("zeroStage: 3" in s or "activationCheckpointing" in s for s in result.suggestions)
    assert any(s.startswith("strategy: auto finds") for s in result.suggestions)
    doc = result.to_json()
    assert doc["feasible"] is False and doc["plan"]["tp"] == 1 and doc["plan"]["micro_batch_size"] == 4


def test_json_has_exactly_the_issue_shape() -> None:
    doc = plan_auto(LLAMA7B, H100, 8, top_k=2).to_json()
    assert list(doc) == ["feasible", "plan", "alternatives", "rejected"]
    assert list(doc["plan"]) == list(PLAN_JSON_KEYS)
    assert len(doc["alternatives"]) == 2
    assert sum(doc["plan"]["memory_breakdown"].values()) == doc["plan"]["memory_per_gpu_bytes"]


def test_interleaving_shrinks_the_bubble_by_v() -> None:
    ev = Evaluator(LLAMA7B, H100, impl=PYTORCH)
    base = Layout(RankLayout(pp=4, dp=2), micro_batch_size=1, num_micro_batches=128, recompute="full")
    plain, inter = ev.evaluate(base), ev.evaluate(replace(base, vpp=2))
    assert plain.time.bubble_fraction == pytest.approx(3 / 128)
    assert inter.time.bubble_fraction == pytest.approx(3 / 256)
    assert inter.memory_bytes > plain.memory_bytes


def test_first_fit_stops_early() -> None:
    full = search(LLAMA7B, H100, 8)
    first = search(LLAMA7B, H100, 8, first_fit=True)
    assert first.best is not None and first.plans_evaluated < full.plans_evaluated


def test_mixture_of_experts_plans_use_expert_parallelism() -> None:
    moe = replace(SMALL, num_experts=8, expert_top_k=2, global_batch_size=64)
    result = plan_auto(moe, H100, 16, top_k=10)
    assert result.best is not None
    for plan in (result.best, *result.alternatives):
        assert moe.num_experts % plan.ep == 0 and (plan.layout.dp * plan.layout.cp) % plan.ep == 0
    with_ep = [p for p in (result.best, *result.alternatives) if p.ep > 1]
    assert with_ep and all(p.communication_s["ep"] > 0 for p in with_ep)


def test_replanning_after_an_oom_demands_less_memory() -> None:
    from trainyard.plugins.advisor.planner import replan_after_oom

    job = load_spec_file(JOBS.parent / "examples" / "llama-7b-finetune.yaml")
    fleet = load_cluster("h100-fleet")
    first = plan_job(job, fleet).best
    assert first is not None and first.memory_per_gpu_bytes is not None
    again = replan_after_oom(job, fleet, first).best
    assert again is not None
    assert again.memory_per_gpu_bytes is not None
    assert again.memory_per_gpu_bytes <= 0.9 * first.memory_per_gpu_bytes


def test_search_offers_uneven_pipeline_splits() -> None:
    """Llama 3 405B's 126 layers: PP16 (7, 8 ×14, 7) is a candidate, as Meta ran it, and so is
    interleaving that keeps the busiest rank at 8 layers (every v up to 7; v = 8 would need
    128 stages)."""
    from trainyard.plugins.advisor.published import llama3
    from trainyard.plugins.advisor.search import _vpp_options

    model = llama3("405B", batch=2048)
    found = search(model, H100, 16384, pins=Parallelism(tensor_parallel=8, pipeline_parallel=16), top_k=50)
    assert found.ranked and all(e.layout.degrees.pp == 16 for e in found.ranked)
    assert _vpp_options(model, 16, Parallelism()) == [1, 2, 3, 4, 5, 6, 7]
    unpinned = search(model, H100, 16384, top_k=200)
    assert {e.layout.degrees.pp for e in unpinned.ranked} - {1, 2}  # uneven depths are ranked too


def test_five_layers_on_two_stages_is_a_plan() -> None:
    """The worker's uneven split (3 + 2): the search ranks it and `plan_manual` builds it."""
    model = ModelProfile(hidden_size=64, num_layers=5, num_heads=4, num_kv_heads=2,
                         ffn_hidden_size=128, vocab_size=256, sequence_length=32,
                         global_batch_size=8, precision="fp32")
    cpu = hardware_from_spec(CATALOG["cpu"])
    found = search(model, cpu, 2, pins=Parallelism(pipeline_parallel=2), top_k=20)
    assert found.ranked and all(e.layout.degrees.pp == 2 for e in found.ranked)
    result = plan_manual(model, cpu, Layout(RankLayout(pp=2), micro_batch_size=2, num_micro_batches=4))
    assert result.feasible and result.best is not None and result.best.layout.pp == 2


def test_plans_within_the_budget_rank_before_faster_ones_in_the_headroom() -> None:
    hw = replace(H100, gpu=replace(H100.gpu, memory_bytes=12 * 1024**3))
    found = search(SMALL, hw, 8, memory_fraction=0.5, top_k=10_000)
    inside = sum(e.within_budget for e in found.ranked)
    assert 0 < inside < len(found.ranked)
    assert all(e.within_budget for e in found.ranked[:inside])  # then the headroom's, by speed
    assert not min(found.ranked, key=lambda e: e.step_s).within_budget  # the fastest needs it
    everything_over = search(SMALL, hw, 8, memory_fraction=0.01, top_k=3)
    assert everything_over.best is not None and not everything_over.best.within_budget
    kept = search(SMALL, hw, 8, memory_fraction=0.5, keep_headroom=0.5, top_k=10_000)
    assert len(kept.ranked) == inside and all(e.within_budget for e in kept.ranked)
