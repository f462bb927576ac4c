"""Step time: the small-GEMM efficiency curve, ZeRO-3's per-layer collectives as the group
grows, and the pipeline's pace set by its busiest rank under an uneven split."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainyard.plugins.advisor.comm import all_gather_s, group_levels
from trainyard.plugins.advisor.estimate import evaluate
from trainyard.plugins.advisor.hardware import CATALOG, hardware_from_spec
from trainyard.plugins.advisor.layout import DEEPSPEED_ZERO3, PYTORCH, Layout
from trainyard.plugins.advisor.memory import MemoryModel
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.published import A100_SELENE, gpt
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.advisor.timing import TimeModel, wave_efficiency

H100 = hardware_from_spec(CATALOG["H100"])


def test_wave_efficiency_is_one_for_large_gemms_and_falls_for_small_ones() -> None:
    assert wave_efficiency(16384, 16384, 132) > 0.97
    # 256×512 on 132 SMs: the best tile (64×64) makes 32 tiles, one wave of 132 slots.
    assert wave_efficiency(256, 512, 132) == pytest.approx(32 / 132)
    # A wave and one tile more: 133 tiles of 128×128 take 2 waves (tile 64×64 does better).
    assert wave_efficiency(128 * 7, 128 * 19, 132) == pytest.approx(
        max(133 / 264, (14 * 38) / (5 * 132)))
    assert wave_efficiency(7, 9, None) == 1.0  # CPU: no SM waves


def test_small_gemms_run_below_the_large_gemm_efficiency() -> None:
    """The same FLOPs in one big GEMM or in 64 narrow ones: the narrow ones are slower."""
    from trainyard.plugins.advisor.timing import _gemm_s

    peak = H100.gpu.peak_flops
    big = _gemm_s(H100, peak, 2, 8192, 8192, 8192)
    narrow = 64 * _gemm_s(H100, peak, 2, 8192, 8192, 128)
    k_efficiency = 8192 / (8192 + H100.gpu.gemm_k_overhead)
    assert big == pytest.approx(2 * 8192**3 / (peak * H100.gpu.gemm_efficiency * k_efficiency
                                               * wave_efficiency(8192, 8192, 132)))
    assert narrow > 1.1 * big


def test_zero3_throughput_falls_as_the_group_grows_at_a_fixed_batch() -> None:
    """[N21] Table 2's trend: 174.6B under DeepSpeed ZeRO-3 at a global batch of 1536 on 384,
    768, 1536 GPUs (reported 144, 88, 44 TFLOP/s per GPU). Each GPU's link carries the whole
    gathered model every micro-batch however many ranks share it, while its compute halves with
    each doubling: the step becomes communication-bound and throughput per GPU falls ~3x."""
    model = gpt(96, 12288, 96, batch=1536)

    def per_gpu_and_exposed(impl):
        per_gpu, exposed = [], []
        for gpus, mbs in ((384, 4), (768, 2), (1536, 1)):
            est = evaluate(model, A100_SELENE, Layout(RankLayout(dp=gpus), zero_stage=3, micro_batch_size=mbs,
                                                      recompute="full"), impl=impl)
            per_gpu.append(est.tokens_per_s / gpus)
            exposed.append(est.time.communication_s["dp"])
        return per_gpu, exposed

    per_gpu, exposed = per_gpu_and_exposed(DEEPSPEED_ZERO3)
    assert per_gpu[0] > per_gpu[1] > per_gpu[2]
    assert per_gpu[0] > 2.5 * per_gpu[2]
    assert exposed[0] < exposed[1] < exposed[2]
    # With NCCL's hierarchical rings (the node's HCAs share the traffic) the same runs stay
    # nearly compute-bound: the property, not the latency term, is what makes them fall.
    hierarchical, _ = per_gpu_and_exposed(replace(DEEPSPEED_ZERO3, hierarchical_collectives=True))
    assert hierarchical[0] < 1.5 * hierarchical[2]


def test_zero3_first_gather_of_each_pass_is_exposed() -> None:
    """With compute windows far longer than the collectives, prefetch hides all but
    (1 − overlap) of each layer's gather — except the first gather of forward and of backward
    and the last reduce-scatter, which nothing can hide."""
    model = ModelProfile(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                         ffn_hidden_size=14336, vocab_size=128256, sequence_length=8192,
                         global_batch_size=64, tie_embeddings=True)
    mem = MemoryModel(model, H100, PYTORCH)
    tm = TimeModel(model, H100, PYTORCH, mem)
    layout = Layout(RankLayout(dp=8), zero_stage=3, micro_batch_size=8)
    levels = group_levels(H100, ((1, 1), (8, 1)))
    layers, per_layer = 32, mem.layer_dense + mem.layer_experts
    g = all_gather_s(levels, 2 * per_layer)
    r = all_gather_s(levels, 4 * per_layer)
    rest = 0.1 * (g + (g + r))
    got = tm._zero3_per_microbatch_s(layout, levels, layers * per_layer, layers, 1e3, 1e3)
    assert got == pytest.approx(2 * g + r + (layers - 1) * rest)


def test_uneven_pipeline_runs_at_the_busiest_rank() -> None:
    """5 layers on PP2 (3 + 2): a micro-batch takes as long as the first stage's 3 layers or
    the last's 2 layers plus the head, whichever is longer — more than 4 layers (2 + 2 + head),
    less than 6 (3 + 3 + head)."""
    def microbatch_s(layers: int) -> float:
        model = ModelProfile(hidden_size=2048, num_layers=layers, num_heads=16, num_kv_heads=16,
                             ffn_hidden_size=8192, vocab_size=32000, sequence_length=2048,
                             global_batch_size=16)
        return evaluate(model, H100, Layout(RankLayout(pp=2), micro_batch_size=1, num_micro_batches=16)).time.microbatch_s

    assert microbatch_s(4) < microbatch_s(5) < microbatch_s(6)


def test_uneven_interleaving_spreads_the_stages_round_robin() -> None:
    model = replace(gpt(70, 14336, 112, batch=2048), vocab_size=250880)  # BLOOM-176B's shape
    mem = MemoryModel(model, A100_SELENE, PYTORCH)
    assert mem.stage_counts(12) == [5] + [6] * 10 + [5]
    assert sum(mem.stage_counts(12, 2)) == 70
