"""Placement benchmark: the topology-aware gang search against first-fit, on the 10k-GPU fleet.

    .venv/bin/python benchmarks/placement.py [--seed 0] [--repeat 3]

On `config/clusters/h100-fleet.yaml` (10,000 H100 in 160 racks, two nodes unhealthy) it places
the seed's job mix — 150 jobs × 8 GPUs, 40 × 64, 10 × 256 — arriving in one random order, once
with `place_gang` and once with first-fit (same hard constraints, rack-blind), in the same run.
Plans: 8 GPUs = TP8 (one node); 64 = TP8·PP4·DP2; 256 = TP8·PP4·DP8 (seed §3's 200B job), so
every multi-node job has pipelines of 4 nodes to keep inside a rack.

Figures:
- `p50_ms`, `p99_ms`: wall time of one `place_gang` call (search + scoring + group map), per
  job, over `--repeat` passes of the mix (different arrival orders);
- `violations`: hard-constraint violations found by the independent checker, both placers;
- `pp_groups_in_one_rack`: fraction of PP groups (pp > 1) whose stages share one rack;
- `utilization`: GPUs allocated / GPUs in the fleet after the mix (jobs that fit are placed;
  `placed` / `baseline_placed` count them);
- `pipelines_of_4_left` (and `baseline_…`): after the mix, how many more 4-node pipelines
  still fit inside a rack (Σ over racks of ⌊wholly free nodes / 4⌋) — the fragmentation each
  placer leaves behind for the next large job;
- `reserve_p50_ms`: committing each placement to the allocation store (SQLite file), to show
  the state database is not the bottleneck.
Targets: p99 < 100 ms, zero violations, more PP groups in a rack than first-fit.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainyard.config.cluster import load_cluster  # noqa: E402
from trainyard.plugins.advisor.rank_layout import RankLayout  # noqa: E402
from trainyard.plugins.placement.baseline import place_first_fit  # noqa: E402
from trainyard.plugins.placement.constraints import hard_violations  # noqa: E402
from trainyard.plugins.placement.gang import place_gang  # noqa: E402
from trainyard.plugins.placement.inventory import Inventory  # noqa: E402
from trainyard.plugins.placement.model import GangRequest, Placement, Unschedulable  # noqa: E402

MIX = ((150, RankLayout(tp=8, pp=1, dp=1)), (40, RankLayout(tp=8, pp=4, dp=2)),
       (10, RankLayout(tp=8, pp=4, dp=8)))


def job_mix(rng: random.Random) -> list[GangRequest]:
    jobs = [GangRequest(job=f"j{layout.world_size}-{i}", team="bench", gpu_type="H100", layout=layout)
            for count, layout in MIX for i in range(count)]
    rng.shuffle(jobs)
    return jobs


def run_pass(inv: Inventory, jobs: list[GangRequest], placer: str, store: object | None = None) -> dict:
    free = inv.free_map()
    times: list[float] = []
    reserve_times: list[float] = []
    violations = placed = gpus = in_rack = pp_total = 0
    for request in jobs:
        start = time.perf_counter()
        try:
            placement: Placement = (place_gang(request, inv, free) if placer == "search"
                                    else place_first_fit(request, inv, free))
        except Unschedulable:
            times.append(time.perf_counter() - start)
            continue
        times.append(time.perf_counter() - start)
        violations += len(hard_violations(placement, request, inv, free))
        if store is not None:
            t = time.perf_counter()
            store.reserve(placement, lease_s=3600)  # type: ignore[attr-defined]
            reserve_times.append(time.perf_counter() - t)
        for node in placement.nodes:
            free[node.name] -= node.slots
        placed += 1
        gpus += placement.layout.world_size
        a, b = placement.pp_groups_in_one_rack()
        in_rack += a
        pp_total += b
    left = sum(sum(1 for n in nodes if n.healthy and free[n.name] == n.gpus) // 4 for nodes in inv.racks.values())
    return {"times": times, "reserve": reserve_times, "violations": violations, "placed": placed,
            "pipelines_of_4_left": left,
            "utilization": gpus / inv.total_gpus(), "pp_in_rack": in_rack / pp_total if pp_total else 1.0}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="passes of the mix (new arrival order each)")
    args = parser.parse_args()

    inv = Inventory.from_cluster(load_cluster("h100-fleet"))
    rng = random.Random(args.seed)
    search_times: list[float] = []
    reserve_times: list[float] = []
    results, baselines = [], []
    for i in range(args.repeat):
        jobs = job_mix(rng)
        store = None
        if i == 0:
            from trainyard.plugins.state.reservations import StateStore

            tmp = tempfile.mkdtemp(prefix="trainyard-bench-")
            store = StateStore(f"sqlite:///{tmp}/state.db")
        result = run_pass(inv, jobs, "search", store)
        if store is not None:
            store.close()
        search_times += result["times"]
        reserve_times += result["reserve"]
        results.append(result)
        baselines.append(run_pass(inv, jobs, "first-fit"))

    def mean(key: str, rows: list[dict]) -> float:
        return round(statistics.fmean(r[key] for r in rows), 4)

    print(json.dumps({
        "p50_ms": round(percentile(search_times, 0.50) * 1000, 3),
        "p99_ms": round(percentile(search_times, 0.99) * 1000, 3),
        "violations": sum(r["violations"] for r in results),
        "pp_groups_in_one_rack": mean("pp_in_rack", results),
        "utilization": mean("utilization", results),
        "baseline_pp_groups_in_one_rack": mean("pp_in_rack", baselines),
        "baseline_utilization": mean("utilization", baselines),
        "baseline_violations": sum(r["violations"] for r in baselines),
        "placed": mean("placed", results), "baseline_placed": mean("placed", baselines),
        "pipelines_of_4_left": mean("pipelines_of_4_left", results),
        "baseline_pipelines_of_4_left": mean("pipelines_of_4_left", baselines),
        "jobs": sum(c for c, _ in MIX), "passes": args.repeat,
        "baseline_p99_ms": round(percentile([t for b in baselines for t in b["times"]], 0.99) * 1000, 3),
        "reserve_p50_ms": round(percentile(reserve_times, 0.50) * 1000, 3) if reserve_times else None,
        "targets": {
            "p99_under_100ms": percentile(search_times, 0.99) < 0.1,
            "zero_violations": sum(r["violations"] for r in results) == 0,
            "more_pp_in_rack_than_first_fit": mean("pp_in_rack", results) > mean("pp_in_rack", baselines),
        },
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
