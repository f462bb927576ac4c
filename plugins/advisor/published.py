"""Published training configurations, and how the advisor's estimates compare with what their
authors reported. `python -m trainyard.plugins.advisor.published` prints the table in `docs/advisor.md`;
the unit tests check that none of these configurations — all of which ran — is judged not to fit.

Where a paper leaves a knob out (micro-batch size, virtual stages), the row uses the reading
that needs the least memory and says so in `assumed`: a configuration that ran must fit under
its most favourable reading, or the memory model is too pessimistic.

Sources
- [N21] Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", SC 2021 — Table 1 (weak scaling, full recomputation, s = 2048, V = 51,200,
  A100 80 GB) and Table 2 (ZeRO-3 without model parallelism, DeepSpeed).
- [K22] Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
  MLSys 2023 (arXiv 2205.05198) — Tables 3 and 5 (sequence parallel + selective recompute).
- [L3] Llama Team, "The Llama 3 Herd of Models", arXiv 2407.21783, Table 4 (405B on up to
  16,384 H100 80 GB; 8K sequences trained without activation checkpointing, §3.3.2).
- [TT] torchtitan docs/performance.md (Liang et al., "TorchTitan", ICLR 2025): Llama 3.1 8B,
  FSDP, bf16, H100 96 GB HBM2e at 500 W, local batch 2, selective (op) AC.
- [TT-A100] torchtitan docs/performance.md as first published (2024; pytorch/torchtitan at
  0413364): FSDP2 on 64 A100 80 GB, bf16, Llama 3 at sequence 8,192 (local batch 1) and
  Llama 2 at 4,096 (local batch 1 or 2), activation checkpointing none, selective op or full;
  WPS = tokens/s per GPU. Its MFU column is not used (a definition of its own).
- [B22] BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model", arXiv
  2211.05100, §3.4: 384 A100 80 GB (48 nodes), TP4 · PP12 · DP8, ZeRO stage 1, bf16; 70
  layers, h 14336, 112 heads, vocabulary 250,880, sequence 2048, global batch 2048. A
  feasibility row only (no throughput figure is used): 70 layers on 12 stages is an uneven
  split (5, 6 ×10, 5), the kind `PP_LAYER_MISMATCH` used to refuse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from trainyard.plugins.advisor.estimate import Estimate, evaluate
from trainyard.plugins.advisor.hardware import CATALOG, GB, GiB, Hardware, hardware_from_spec
from trainyard.plugins.advisor.layout import (
    DEEPSPEED_ZERO3,
    FUSED,
    MEGATRON,
    TORCHTITAN,
    TORCHTITAN_2024,
    Implementation,
    Layout,
)
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.rank_layout import RankLayout

A100_SELENE = hardware_from_spec(CATALOG["A100_80GB"], nodes_per_rack=20)
"""Selene: DGX A100 (8 × 200 Gb/s HDR per node), non-blocking fat tree."""
LLAMA3_STACK = replace(FUSED, name="llama3", pipeline_inside_data=True)
"""Meta's training stack: fused kernels, ranks ordered [TP, CP, PP, DP] ([L3] §3.3.2)."""
H100_META_ROCE = hardware_from_spec(CATALOG["H100"], nodes_per_rack=384, oversubscription=7.0)
"""Llama 3's RoCE cluster: full bisection inside a 3,072-GPU pod, 1:7 between pods."""
H100_96GB_500W = hardware_from_spec(replace(
    CATALOG["H100"], name="H100_96GB", memory_bytes=int(96 * GB), memory_bandwidth=2400 * GB))
"""torchtitan's Grand Teton hosts: H100 with 96 GB HBM2e (2.4 TB/s) at a 500 W limit; peak
FLOP/s below the SXM part's, unknown — we keep 989 TFLOP/s, as torchtitan does for MFU."""


def gpt(layers: int, hidden: int, heads: int, *, seq: int = 2048, vocab: int = 51200,
        batch: int, precision: str = "fp16") -> ModelProfile:
    """A GPT-3-style model of [N21]/[K22]: GELU MLP of 4h, multi-head attention."""
    return ModelProfile(hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=heads,
                        ffn_hidden_size=4 * hidden, vocab_size=vocab, sequence_length=seq,
                        global_batch_size=batch, precision=precision,  # type: ignore[arg-type]
                        activation="gelu", tie_embeddings=True)


def llama3(size: str, *, seq: int = 8192, batch: int) -> ModelProfile:
    shapes = {"8B": (32, 4096, 32, 14336), "70B": (80, 8192, 64, 28672),
              "405B": (126, 16384, 128, 53248)}
    layers, hidden, heads, ffn = shapes[size]
    return ModelProfile(hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=8,
                        ffn_hidden_size=ffn, vocab_size=128256, sequence_length=seq,
                        global_batch_size=batch)


def megatron_flops(model: ModelProfile) -> float:
    """[N21] equation (3): FLOPs per iteration with full recomputation, 96·B·s·l·h²(1 + s/6h + V/16lh)."""
    b, s, layers, h, v = (model.global_batch_size, model.sequence_length, model.num_layers,
                          model.hidden_size, model.vocab_size)
    return 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


IN_SAMPLE_SOURCES = ("[N21] Table 1", "[N21] Table 2")
"""Rows a constant of the model was read off: Table 1 fits the A100's GEMM curve
(`fit_gemm_curve`, `hardware.GEMM_K_OVERHEAD`), Table 2 gave DeepSpeed's flat collectives
(`layout.DEEPSPEED_ZERO3`). Every other row is held out: nothing was fitted to it."""


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str
    model: ModelProfile
    hardware: Hardware
    layout: Layout
    impl: Implementation
    reported: dict[str, float]
    """Any of: tflops_per_gpu ([N21]'s formula), mfu, step_s, tokens_per_s_per_gpu, memory_gib."""
    assumed: str = ""
    note: str = ""

    @property
    def gpus(self) -> int:
        return self.layout.degrees.world_size

    @property
    def in_sample(self) -> bool:
        return self.source in IN_SAMPLE_SOURCES


@dataclass(frozen=True)
class Comparison:
    run: PublishedRun
    estimate: Estimate
    predicted: dict[str, float] = field(default_factory=dict)

    def error(self, metric: str) -> float | None:
        if metric not in self.run.reported or metric not in self.predicted:
            return None
        return self.predicted[metric] / self.run.reported[metric] - 1


def _megatron_rows() -> list[PublishedRun]:
    table1 = [  # params(B), heads, hidden, layers, tp, pp, gpus, batch, TFLOP/s per GPU
        (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
        (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
    ]
    rows = []
    for params, heads, hidden, layers, tp, pp, gpus, batch, tflops in table1:
        dp = gpus // (tp * pp)
        rows.append(PublishedRun(
            name=f"GPT {params:g}B", source="[N21] Table 1", model=gpt(layers, hidden, heads, batch=batch),
            hardware=A100_SELENE, impl=MEGATRON,
            layout=Layout(RankLayout(tp=tp, pp=pp, dp=dp), micro_batch_size=1, num_micro_batches=batch // dp,
                          recompute="full"),
            reported={"tflops_per_gpu": tflops}, assumed="micro-batch 1, 1F1B (not given)"))
    table2 = [  # model, layers, hidden, heads, gpus, batch, micro-batch, TFLOP/s per GPU
        ("GPT 174.6B", 96, 12288, 96, 384, 1536, 4, 144), ("GPT 174.6B", 96, 12288, 96, 768, 1536, 2, 88),
        ("GPT 174.6B", 96, 12288, 96, 1536, 1536, 1, 44), ("GPT 529.6B", 105, 20480, 128, 640, 2560, 4, 138),
        ("GPT 529.6B", 105, 20480, 128, 1120, 2240, 2, 98), ("GPT 529.6B", 105, 20480, 128, 2240, 2240, 1, 48),
    ]
    for name, layers, hidden, heads, gpus, batch, mbs, tflops in table2:
        rows.append(PublishedRun(
            name=f"{name} ZeRO-3", source="[N21] Table 2", model=gpt(layers, hidden, heads, batch=batch),
            hardware=A100_SELENE, impl=DEEPSPEED_ZERO3,
            layout=Layout(RankLayout(dp=gpus), zero_stage=3, micro_batch_size=mbs,
                          num_micro_batches=batch // (gpus * mbs), recompute="full"),
            reported={"tflops_per_gpu": tflops}))
    return rows


def _korthikanti_rows() -> list[PublishedRun]:
    table = [  # name, heads, hidden, layers, tp, pp, gpus, batch, vpp, MFU, iteration s
        ("GPT 22B", 64, 6144, 48, 8, 1, 8, 4, 1, 0.415, 1.10, 4),
        ("GPT-3 175B", 96, 12288, 96, 8, 8, 64, 64, 3, 0.514, 13.75, 1),
        ("MT-NLG 530B", 128, 20480, 105, 8, 35, 280, 280, 3, 0.560, 37.83, 1),
        ("GPT 1T", 160, 25600, 128, 8, 64, 512, 512, 1, 0.563, 71.49, 1),
        ("MT-NLG 530B DP8", 128, 20480, 105, 8, 35, 2240, 2240, 3, 0.542, 39.15, 1),
    ]
    rows = []
    for name, heads, hidden, layers, tp, pp, gpus, batch, vpp, mfu, step, mbs in table:
        dp = gpus // (tp * pp)
        rows.append(PublishedRun(
            name=name, source="[K22] Tables 3, 5", model=gpt(layers, hidden, heads, batch=batch),
            hardware=A100_SELENE, impl=MEGATRON,
            layout=Layout(RankLayout(tp=tp, pp=pp, dp=dp), vpp=vpp, micro_batch_size=mbs,
                          num_micro_batches=batch // (dp * mbs), recompute="selective",
                          sequence_parallel=True),
            reported={"mfu": mfu, "step_s": step}))
    return rows


def _llama3_rows() -> list[PublishedRun]:
    table = [  # gpus, tp, cp, pp, dp, seq, sequences per DP replica, TFLOP/s, MFU, assumed vpp
        (8192, 8, 1, 16, 64, 8192, 32, 430, 0.43, 1), (16384, 8, 1, 16, 128, 8192, 16, 400, 0.41, 4),
        (16384, 8, 16, 16, 8, 131072, 16, 380, 0.38, 4),
    ]
    rows = []
    for gpus, tp, cp, pp, dp, seq, per_dp, tflops, mfu, vpp in table:
        batch = per_dp * dp
        rows.append(PublishedRun(
            name=f"Llama 3 405B, {gpus:,} GPUs" + (f", {seq // 1024}K" if cp > 1 else ""),
            source="[L3] Table 4", model=llama3("405B", seq=seq, batch=batch),
            hardware=H100_META_ROCE, impl=LLAMA3_STACK,
            layout=Layout(RankLayout(tp=tp, pp=pp, dp=dp, cp=cp), vpp=vpp, micro_batch_size=1,
                          num_micro_batches=per_dp, zero_stage=2, recompute="none",
                          sequence_parallel=True),
            reported={"tflops_per_gpu": tflops, "mfu": mfu},
            assumed=("interleaved schedule, virtual stages not given: v = 4 where m = p (no extra "
                     "memory), 1F1B where m = 2p (v = 2 would not fit our memory model); "
                     "FSDP without resharding after forward = ZeRO-2"),
            note="126 layers on 16 stages: first and last stage hold 7 layers, the others 8"))
    return rows


def _torchtitan_rows() -> list[PublishedRun]:
    rows = []
    for gpus, tps, mem in ((8, 5762, 82.4), (128, 5605, 67.0)):
        rows.append(PublishedRun(
            name=f"Llama 3.1 8B FSDP, {gpus} GPUs", source="[TT] Tables 1, 3",
            model=llama3("8B", batch=2 * gpus), hardware=H100_96GB_500W, impl=TORCHTITAN,
            layout=Layout(RankLayout(dp=gpus), zero_stage=3, micro_batch_size=2, num_micro_batches=1,
                          recompute="selective"),
            reported={"tokens_per_s_per_gpu": tps, "memory_gib": mem},
            note="500 W power limit: clocks below the 989 TFLOP/s peak we assume"))
    return rows


def llama2(size: str, *, seq: int = 4096, batch: int) -> ModelProfile:
    shapes = {"13B": (40, 5120, 40, 40, 13824), "70B": (80, 8192, 64, 8, 28672)}
    layers, hidden, heads, kv_heads, ffn = shapes[size]
    return ModelProfile(hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                        ffn_hidden_size=ffn, vocab_size=32000, sequence_length=seq,
                        global_batch_size=batch)


def _torchtitan_a100_rows() -> list[PublishedRun]:
    """Held out, on the A100 the GEMM curve was fitted for: small and mid-size models (hidden
    4,096 … 8,192) under FSDP alone, where the per-layer fixed costs weigh most."""
    table = [  # model, local batch, recompute, tokens/s per GPU
        ("Llama 3 8B", llama3("8B", batch=64), 1, "selective", 2973),
        ("Llama 3 70B", llama3("70B", batch=64), 1, "full", 331),
        ("Llama 2 13B", llama2("13B", batch=128), 2, "none", 2162),
        ("Llama 2 13B", llama2("13B", batch=128), 2, "selective", 1904),
        ("Llama 2 70B", llama2("70B", batch=64), 1, "selective", 355),
        ("Llama 2 70B", llama2("70B", batch=128), 2, "full", 353),
    ]
    label = {"none": "no AC", "selective": "op AC", "full": "full AC"}
    return [PublishedRun(
        name=f"{name} FSDP, 64 A100, {label[recompute]}", source="[TT-A100] performance.md",
        model=replace(model, precision="bf16"), hardware=A100_SELENE, impl=TORCHTITAN_2024,
        layout=Layout(RankLayout(dp=64), zero_stage=3, micro_batch_size=local, num_micro_batches=1,
                      recompute=recompute),  # type: ignore[arg-type]
        reported={"tokens_per_s_per_gpu": tps},
        assumed="the A100 cluster's network is not given: Selene's (8 x 200 Gb/s per node)")
        for name, model, local, recompute, tps in table]


def _bloom_rows() -> list[PublishedRun]:
    model = replace(gpt(70, 14336, 112, vocab=250880, batch=2048), precision="bf16")
    return [PublishedRun(
        name="BLOOM-176B", source="[B22] §3.4", model=model, hardware=A100_SELENE, impl=MEGATRON,
        # Jean Zay's network differs from Selene's; only memory is compared, which it does not touch.
        layout=Layout(RankLayout(tp=4, pp=12, dp=8), zero_stage=1, micro_batch_size=1, num_micro_batches=256,
                      recompute="full"),
        reported={},
        assumed="micro-batch 1 and full recomputation (the least memory; not used for throughput)",
        note="70 layers on 12 stages: 5, 6 ×10, 5")]


def published_runs() -> list[PublishedRun]:
    return (_megatron_rows() + _korthikanti_rows() + _llama3_rows() + _torchtitan_rows()
            + _torchtitan_a100_rows() + _bloom_rows())


def compare(run: PublishedRun, *, memory_fraction: float = 1.0) -> Comparison:
    est = evaluate(run.model, run.hardware, run.layout, impl=run.impl, memory_fraction=memory_fraction)
    step = est.step_s
    predicted = {
        "tflops_per_gpu": (megatron_flops(run.model) / step / run.gpus / 1e12
                           if run.source.startswith("[N21]") else est.mfu * run.hardware.gpu.peak_flops / 1e12),
        "mfu": est.mfu,
        "step_s": step,
        "tokens_per_s_per_gpu": est.tokens_per_s / run.gpus,
        "memory_gib": est.memory_bytes / GiB,
    }
    return Comparison(run, est, predicted)


METRICS = (("tflops_per_gpu", "TFLOP/s/GPU", "{:.0f}"), ("mfu", "MFU", "{:.1%}"),
           ("step_s", "step s", "{:.2f}"), ("tokens_per_s_per_gpu", "tokens/s/GPU", "{:,.0f}"),
           ("memory_gib", "memory GiB", "{:.1f}"))
THROUGHPUT_METRICS = ("tflops_per_gpu", "mfu", "tokens_per_s_per_gpu", "step_s")
"""Each is tokens/s times a constant of the row (FLOPs per token, peak, batch), so one row's
throughput error is the same whichever of them its source reports (step time: inverted)."""
WITHIN = 0.20


def tokens_per_s_error(comparison: Comparison) -> float:
    """advisor / reported − 1 of the row's tokens/s, from the first throughput figure it reports."""
    for metric in THROUGHPUT_METRICS:
        error = comparison.error(metric)
        if error is not None:
            return 1 / (1 + error) - 1 if metric == "step_s" else error
    raise ValueError(f"{comparison.run.name} reports no throughput figure")


def accuracy_summary(comparisons: list[Comparison]) -> dict[str, float]:
    """`{"rows", "within_20pct", "median_abs_err", "false_oom"}` over the published runs: rows
    with a throughput figure, how many are within ±20 % tokens/s, the median |error|, and how
    many configurations that ran the advisor judges not to fit (at memory_fraction 1.0)."""
    errors = sorted(abs(tokens_per_s_error(c)) for c in comparisons
                    if any(m in c.run.reported for m in THROUGHPUT_METRICS))
    n = len(errors)
    median = (errors[n // 2] if n % 2 else (errors[n // 2 - 1] + errors[n // 2]) / 2) if n else 0.0
    return {"rows": n, "within_20pct": sum(e <= WITHIN for e in errors),
            "median_abs_err": round(median, 4),
            "false_oom": sum(not c.estimate.fits for c in comparisons)}


def split_summary(comparisons: list[Comparison]) -> dict[str, dict[str, float]]:
    """`accuracy_summary` of the in-sample rows and of the held-out rows, apart."""
    return {"in_sample": accuracy_summary([c for c in comparisons if c.run.in_sample]),
            "held_out": accuracy_summary([c for c in comparisons if not c.run.in_sample])}


FIT_SOURCE = "[N21] Table 1"
FIT_EFFICIENCIES = tuple(round(0.60 + 0.01 * i, 2) for i in range(26))
FIT_K_OVERHEADS = tuple(64.0 * i for i in range(17))


def in_sample_loss(runs: list[PublishedRun], gemm_efficiency: float, gemm_k_overhead: float) -> float:
    """Σ log(estimated / reported tokens/s)² over `runs`, with their GPU's GEMM curve replaced."""
    total = 0.0
    for run in runs:
        gpu = replace(run.hardware.gpu, gemm_efficiency=gemm_efficiency, gemm_k_overhead=gemm_k_overhead)
        error = tokens_per_s_error(compare(replace(run, hardware=replace(run.hardware, gpu=gpu))))
        total += math.log1p(error) ** 2
    return total


def fit_gemm_curve(runs: list[PublishedRun] | None = None) -> tuple[float, float]:
    """(gemm_efficiency, gemm_k_overhead) of the A100 that minimise `in_sample_loss` over the
    `FIT_SOURCE` rows, on the grid `FIT_EFFICIENCIES` × `FIT_K_OVERHEADS` (ties: the first)."""
    rows = [r for r in (runs if runs is not None else published_runs()) if r.source == FIT_SOURCE]
    return min(((g, k) for g in FIT_EFFICIENCIES for k in FIT_K_OVERHEADS),
               key=lambda gk: in_sample_loss(rows, *gk))


def markdown_table(comparisons: list[Comparison]) -> str:
    lines = ["| run | source | GPUs | layout | metric | reported | advisor | error | est. memory GiB |",
             "|---|---|---:|---|---|---:|---:|---:|---:|"]
    for c in comparisons:
        if not c.run.reported:  # a feasibility row: it ran, so it must fit
            lines.append(
                f"| {c.run.name} | {c.run.source} | {c.run.gpus:,} | {c.run.layout.describe()} | fits | "
                f"ran | {'fits' if c.estimate.fits else 'does not fit'} | — | "
                f"{c.estimate.memory_bytes / GiB:.1f} |")
        for key, label, fmt in METRICS:
            if key not in c.run.reported:
                continue
            err = c.error(key)
            lines.append(
                f"| {c.run.name} | {c.run.source} | {c.run.gpus:,} | {c.run.layout.describe()} | {label} | "
                f"{fmt.format(c.run.reported[key])} | {fmt.format(c.predicted[key])} | "
                f"{err:+.0%} | {c.estimate.memory_bytes / GiB:.1f} |")
    return "\n".join(lines)


def main() -> None:
    comparisons = [compare(run) for run in published_runs()]
    print(markdown_table(comparisons))
    errors = [abs(c.error(k) or 0) for c in comparisons for k, _, _ in METRICS if k in c.run.reported
              and k != "memory_gib"]
    print(f"\nthroughput: mean |error| {sum(errors) / len(errors):.1%}, max {max(errors):.1%} "
          f"over {len(errors)} figures")
    misses = [c.run.name for c in comparisons if not c.estimate.fits]
    print("judged not to fit:", misses or "none")
    summary = accuracy_summary(comparisons)
    print(f"rows within ±20 % tokens/s: {summary['within_20pct']} of {summary['rows']}, median "
          f"|error| {summary['median_abs_err']:.1%}")


if __name__ == "__main__":
    main()
