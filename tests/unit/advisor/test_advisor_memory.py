"""Memory per device: ZeRO sharding, pipeline stages and in-flight micro-batches, buffers."""

from __future__ import annotations

import pytest

from trainyard.config.pipeline import rank_layer_counts, stage_layer_counts
from trainyard.plugins.advisor.estimate import evaluate
from trainyard.plugins.advisor.hardware import CATALOG, GiB, hardware_from_spec
from trainyard.plugins.advisor.layout import FUSED, MEGATRON, PYTORCH, Layout
from trainyard.plugins.advisor.memory import (
    MemoryModel,
    inflight_layer_microbatches,
    memory_breakdown,
    state_bytes_per_param,
)
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.rank_layout import RankLayout

H100 = hardware_from_spec(CATALOG["H100"])
LLAMA7B = ModelProfile(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                       ffn_hidden_size=11008, vocab_size=32000, sequence_length=4096,
                       global_batch_size=256)


def state(layout: Layout, impl=FUSED) -> dict[str, int]:
    items, _ = memory_breakdown(LLAMA7B, H100, impl, layout)
    return {k: items[k] for k in ("weights", "gradients", "optimizer")}


def test_mixed_precision_state_is_2_4_12_bytes_and_fp32_is_4_4_8() -> None:
    assert state_bytes_per_param(LLAMA7B, FUSED) == (2, 4, 12)
    from dataclasses import replace

    assert state_bytes_per_param(replace(LLAMA7B, precision="fp32"), FUSED) == (4, 4, 8)
    assert state_bytes_per_param(LLAMA7B, replace(FUSED, fp32_grads=False)) == (2, 2, 12)  # ZeRO paper


@pytest.mark.parametrize("zero,sharded", [(0, ()), (1, ("optimizer",)), (2, ("optimizer", "gradients")),
                                          (3, ("optimizer", "gradients", "weights"))])
def test_zero_stages_shard_what_rajbhandari_says(zero: int, sharded: tuple[str, ...]) -> None:
    base = Layout(RankLayout(dp=8), micro_batch_size=1, num_micro_batches=32)
    full = state(base)
    this = state(Layout(RankLayout(dp=8), zero_stage=zero, micro_batch_size=1, num_micro_batches=32))
    for item in ("weights", "gradients", "optimizer"):
        expected = full[item] / 8 if item in sharded else full[item]
        assert this[item] == pytest.approx(expected, rel=1e-6), item


def test_fsdp2_runs_zero1_as_zero2() -> None:
    one = Layout(RankLayout(dp=8), zero_stage=1, micro_batch_size=1, num_micro_batches=32)
    two = Layout(RankLayout(dp=8), zero_stage=2, micro_batch_size=1, num_micro_batches=32)
    assert state(one, PYTORCH) == state(two, PYTORCH)
    assert state(one, FUSED) != state(two, FUSED)


def test_tensor_and_pipeline_parallel_divide_the_state() -> None:
    whole = sum(state(Layout(RankLayout(dp=8), micro_batch_size=1, num_micro_batches=32)).values())
    split = MemoryModel(LLAMA7B, H100, FUSED)
    layout = Layout(RankLayout(tp=4, pp=2), micro_batch_size=1, num_micro_batches=256)
    first = split.stage(layout, 0, 16)
    per_param = sum(state_bytes_per_param(LLAMA7B, FUSED))
    assert sum(first[k] for k in ("weights", "gradients", "optimizer")) == pytest.approx(
        per_param * (16 * LLAMA7B.layer_parameters() + LLAMA7B.embedding_parameters()) / 4)
    assert whole == pytest.approx(per_param * LLAMA7B.parameter_count(), rel=1e-6)


def test_first_stage_holds_a_whole_models_worth_of_activations_under_1f1b() -> None:
    """Korthikanti §4.2.3: p micro-batches of L/p layers on stage 0, whatever p."""
    for pp in (2, 4, 8):
        layout = Layout(RankLayout(pp=pp), micro_batch_size=1, num_micro_batches=64)
        assert inflight_layer_microbatches(32 // pp, 0, layout) == 32
        assert inflight_layer_microbatches(32 // pp, pp - 1, layout) == 32 // pp


def test_interleaving_costs_korthikantis_factor() -> None:
    p, v, layers = 4, 2, 32
    layout = Layout(RankLayout(pp=p), vpp=v, micro_batch_size=1, num_micro_batches=64)
    held = inflight_layer_microbatches(layers // p, 0, layout)
    assert held == pytest.approx(layers * (1 + (p - 1) / (p * v)))


def test_few_micro_batches_cap_what_is_in_flight() -> None:
    layout = Layout(RankLayout(pp=8), micro_batch_size=1, num_micro_batches=8)
    assert inflight_layer_microbatches(4, 0, layout) == 32
    layout = Layout(RankLayout(pp=4), vpp=4, micro_batch_size=1, num_micro_batches=4)
    assert inflight_layer_microbatches(8, 0, layout) == 8 / 4 * 16  # every chunk of every micro-batch


def test_uneven_stages_give_the_fewer_layers_to_the_ends() -> None:
    assert stage_layer_counts(126, 16) == [7] + [8] * 14 + [7]
    assert stage_layer_counts(32, 4) == [8, 8, 8, 8]
    assert stage_layer_counts(10, 3) == [3, 4, 3]
    assert stage_layer_counts(5, 2) == [3, 2]
    with pytest.raises(ValueError, match="exceed the model's num_layers \\(4\\)"):
        stage_layer_counts(4, 8)
    # Interleaved: 126 layers on 16 ranks × 2 virtual stages = 32 stages of 3, 4 ×30, 3; rank 0
    # holds stages 0 and 16 (3 + 4), rank 15 stages 15 and 31 (4 + 3), the others 8.
    assert rank_layer_counts(126, 16, 2) == [7] + [8] * 14 + [7]


def test_uneven_split_memory_is_the_busiest_stage() -> None:
    """5 layers on PP2: the first rank holds 3 layers (and the embedding), the last 2 (and the
    head); the memory reported is the larger of the two, with the right layer count."""
    model = ModelProfile(hidden_size=1024, num_layers=5, num_heads=8, num_kv_heads=8,
                         ffn_hidden_size=4096, vocab_size=1024, sequence_length=1024,
                         global_batch_size=8)
    mem = MemoryModel(model, H100, PYTORCH)
    layout = Layout(RankLayout(pp=2), micro_batch_size=1, num_micro_batches=8)
    assert mem.stage_counts(2) == [3, 2]
    first, last = (sum(mem.stage(layout, i, n).values()) for i, n in enumerate(mem.stage_counts(2)))
    assert mem.total(layout) == max(first, last)
    items, stage = mem.breakdown(layout)
    kept, _ = mem.activations(layout)
    assert stage == 0 and items["activations"] == int(kept * 3 * 2)  # 3 layers × 2 in flight


def test_more_micro_batch_or_less_recomputation_never_needs_less_memory() -> None:
    model = MemoryModel(LLAMA7B, H100, PYTORCH)
    previous = 0.0
    for mbs in (1, 2, 4, 8):
        for ac in ("full", "selective", "none"):
            layout = Layout(RankLayout(dp=8), zero_stage=3, micro_batch_size=mbs, num_micro_batches=32 // mbs,
                            recompute=ac)  # type: ignore[arg-type]
            total = model.total(layout)
            assert total >= previous
            previous = total
        previous = model.total(Layout(RankLayout(dp=8), zero_stage=3, micro_batch_size=mbs,
                                      num_micro_batches=32 // mbs, recompute="full"))


def test_last_stage_carries_the_logits_and_zero3_its_gather_buffers() -> None:
    items, stage = memory_breakdown(LLAMA7B, H100, PYTORCH, Layout(RankLayout(dp=8), zero_stage=3, micro_batch_size=2,
                                                                 num_micro_batches=16))
    assert stage == 0
    assert items["logits"] == 2 * 4096 * 32000 * (2 + 8)
    assert items["fsdp_buffers"] > 0
    assert items["framework"] == H100.gpu.framework_bytes


def test_budget_is_the_fraction_of_device_memory() -> None:
    est = evaluate(LLAMA7B, H100, Layout(RankLayout(dp=8), zero_stage=3, micro_batch_size=1, num_micro_batches=32,
                                         recompute="full"), memory_fraction=0.5)
    assert est.budget_bytes == 40 * GiB
    with pytest.raises(ValueError, match="memory_fraction"):
        evaluate(LLAMA7B, H100, Layout(RankLayout(dp=8), micro_batch_size=1, num_micro_batches=32), memory_fraction=0)


def test_megatron_eager_attention_is_what_selective_recompute_removes() -> None:
    model = ModelProfile(hidden_size=12288, num_layers=96, num_heads=96, num_kv_heads=96,
                         ffn_hidden_size=4 * 12288, vocab_size=51200, sequence_length=2048,
                         global_batch_size=64, precision="fp16", activation="gelu")
    mm = MemoryModel(model, hardware_from_spec(CATALOG["A100_80GB"]), MEGATRON)
    base = Layout(RankLayout(tp=8, pp=8), micro_batch_size=1, num_micro_batches=64, sequence_parallel=True)
    from dataclasses import replace

    none, _ = mm.activations(base)
    selective, _ = mm.activations(replace(base, recompute="selective"))
    # GPT-3: 5as/h = 80 against 34 — selective recompute saves 70 % (Korthikanti §5).
    assert 1 - selective / none == pytest.approx(80 / 114, rel=1e-3)
