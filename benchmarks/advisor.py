"""Advisor benchmark: planning time and plans evaluated for four model/cluster sizes, and the
accuracy of the estimates against the published runs.

    .venv/bin/python benchmarks/advisor.py [--repeat 5]

Cases, on the H100 fleet's hardware (`config/clusters/h100-fleet.yaml`): Llama 2 7B on 8 GPUs
(seq 4096, 256 sequences per step), Llama 3 70B on 512 GPUs and Llama 3 405B on 16,384 GPUs
(seq 8192, 16M tokens per step), plus a 128-layer variant of the 405B model whose layer count
every power-of-two pipeline depth divides (the real 405B's 126 layers are split unevenly at
PP 4 … 64, `trainyard.config.pipeline`).

Per case: `ms` is the median wall time of `plan_auto` (search, ranking, building the top five
`Plan`s) over `--repeat` runs; `plans_evaluated` the layouts whose memory (and, when they fit,
time) was computed; `plans_considered` every combination counted. The baseline, measured in
the same run, is the same search without pruning (`baseline_ms`, `baseline_plans_evaluated`);
both must return the same best plan (`same_best`). Target: < 1000 ms for 16,384 GPUs.

`accuracy`: `trainyard.plugins.advisor.published.accuracy_summary` over the table in docs/advisor.md —
`rows` (runs with a throughput figure), `within_20pct` (rows whose estimated tokens/s is within
±20 % of the reported), `median_abs_err`, `false_oom` (configurations that ran but are judged
not to fit at memory_fraction 1.0) — over every row, then apart (`split_summary`) for
`in_sample` (the rows a constant was read off: [N21] Tables 1 and 2) and `held_out` (every other
row: [K22], Llama 3, torchtitan on H100 and on A100, BLOOM). `gemm_curve_fit` refits the A100's GEMM curve on the
in-sample rows (`fit_gemm_curve`: gemm_efficiency, gemm_k_overhead) — the catalog holds its
result; `cpu_count` and `load_avg_1m` describe the machine.

Every run starts with cold caches. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainyard.config.cluster import load_cluster
from trainyard.plugins.advisor.comm import group_levels
from trainyard.plugins.advisor.hardware import hardware_for
from trainyard.plugins.advisor.memory import layer_activation_bytes
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.advisor.planner import plan_auto
from trainyard.plugins.advisor.published import (
    accuracy_summary,
    compare,
    fit_gemm_curve,
    llama3,
    published_runs,
    split_summary,
)
from trainyard.plugins.advisor.search import search
from trainyard.plugins.advisor.timing import layer_cost, wave_efficiency

TARGET_MS = 1000.0

CASES = [
    ("llama2-7b", 8, ModelProfile(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                                  ffn_hidden_size=11008, vocab_size=32000, sequence_length=4096,
                                  global_batch_size=256)),
    ("llama3-70b", 512, llama3("70B", batch=2048)),
    ("llama3-405b", 16384, llama3("405B", batch=2048)),
    ("405b-128-layers", 16384, replace(llama3("405B", batch=2048), num_layers=128)),
]


def cold_caches() -> None:
    """Each run starts from empty shape caches, so neither search profits from the other."""
    for cached in (layer_activation_bytes, layer_cost, group_levels, wave_efficiency):
        cached.cache_clear()


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        cold_caches()
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    hw = hardware_for(load_cluster("h100-fleet"), "H100")
    hw = replace(hw, total_gpus=None)  # what-if sizes: do not cap at the fleet's healthy count
    cases = []
    for name, gpus, model in CASES:
        ms, result = timed(lambda m=model, g=gpus: plan_auto(m, hw, g), args.repeat)
        base_ms, base = timed(lambda m=model, g=gpus: search(m, hw, g, prune=False), max(1, args.repeat // 2))
        best = result.best.describe() if result.best else None
        cases.append({
            "name": name, "gpus": gpus, "plans_evaluated": result.plans_evaluated, "ms": round(ms, 1),
            "plans_considered": result.plans_considered, "best": best,
            "baseline_ms": round(base_ms, 1), "baseline_plans_evaluated": base.plans_evaluated,
            "same_best": (base.best.layout.describe() if base.best else None) == best,
        })
    worst = max(c["ms"] for c in cases if c["gpus"] == 16384)
    comparisons = [compare(run) for run in published_runs()]
    accuracy = accuracy_summary(comparisons)
    print(json.dumps({"cases": cases, "target_ms": TARGET_MS, "met": worst < TARGET_MS,
                      **accuracy, **split_summary(comparisons), "gemm_curve_fit": fit_gemm_curve(),
                      "cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
