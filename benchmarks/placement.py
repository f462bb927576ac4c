"""Placement benchmark: the topology-aware gang search against first-fit and a rack-aware
first-fit, on a generated 100,000-GPU fleet (or the seed's 10k-GPU fleet).

    .venv/bin/python benchmarks/placement.py [--gpus 100000] [--seed 0] [--repeat 2] [--check]

`--gpus 10000` (or `--fleet h100-fleet`) uses `config/clusters/h100-fleet.yaml` (10,000 H100 in
160 racks, two nodes unhealthy). Any other `--gpus` generates a fleet with the same rack
templates (`generated_fleet`): nodes of 8 H100 in racks of 8 nodes behind the same 2:1
oversubscribed spine (100,000 GPUs = 12,500 nodes in 1,563 racks, the last one of 4 nodes), one
node in 625 unhealthy as in the seed's fleet. The seed's job mix scales with the fleet — per
10,000 GPUs 150 jobs × 8 GPUs, 40 × 64, 10 × 256 — arriving in one random order per pass, placed
with `place_gang`, with first-fit (same hard constraints, rack-blind) and with rack-aware
first-fit (`place_rack_first_fit` below: each pipeline in the first rack, in inventory order,
that still holds it whole — first-fit that fills rack by rack), in the same run.
Plans: 8 GPUs = TP8 (one node); 64 = TP8·PP4·DP2; 256 = TP8·PP4·DP8 (seed §3's 200B job), so
every multi-node job has pipelines of 4 nodes to keep inside a rack.

Figures:
- `gpus`, `nodes`, `racks`: the fleet;
- `p50_ms`, `p99_ms`: wall time of one `place_gang` call (search + scoring + group map), per
  job, over `--repeat` passes of the mix (different arrival orders); the fleet's column index
  is built with the `Inventory`, before timing, as a long-lived placer holds it, and the free
  map is the inventory's indexed `FreeDevices`, written as each job is placed (no pass over
  the fleet per request); the competitors scan a plain dict;
- `p99_cpu_ms` (and `rack_aware_first_fit_p99_cpu_ms`): the same calls' CPU time (the thread's),
  which leaves out the time other processes on a loaded machine took the core;
- `baseline_p99_ms`, `rack_aware_first_fit_p50_ms`, `rack_aware_first_fit_p99_ms`: wall time
  of the two competitors' calls (the rack-aware one at its best: on the same column index and
  indexed free map as the search; with `--check` its Python loop runs too, must pick the same
  nodes for every job, and `rack_aware_first_fit_scan_p99_ms` is that loop's p99);
- `violations`: hard-constraint violations found by the independent checker, all placers;
- `pp_groups_in_one_rack`: fraction of PP groups (pp > 1) whose stages share one rack;
- `utilization`: GPUs allocated / GPUs in the fleet after the mix (jobs that fit are placed;
  `placed` / `baseline_placed` count them);
- `pipelines_of_4_left` (and `baseline_…`): after the mix, how many more 4-node pipelines
  still fit inside a rack (Σ over racks of ⌊wholly free nodes / 4⌋) — the fragmentation each
  placer leaves behind for the next large job;
- `reserve_p50_ms`: committing the first 200 placements of the first pass to the allocation store
  (SQLite file), to show the state database is not the bottleneck;
- `cpu_count`, `load_avg_1m`: the machine, when the line is printed.
Targets: p99 < 20 ms at 100,000 GPUs, zero violations, more PP groups in a rack than first-fit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from trainyard.config.cluster import CLUSTERS_DIR, Cluster, load_cluster  # noqa: E402
from trainyard.plugins.advisor.rank_layout import RankLayout  # noqa: E402
from trainyard.plugins.placement.baseline import place_first_fit  # noqa: E402
from trainyard.plugins.placement.constraints import hard_violations  # noqa: E402
from trainyard.plugins.placement.gang import build_placement, place_gang, slots_per_node_options  # noqa: E402
from trainyard.plugins.placement.inventory import Inventory  # noqa: E402
from trainyard.plugins.placement.model import (  # noqa: E402
    GangRequest,
    PendingReason,
    Placement,
    Unschedulable,
)
from trainyard.plugins.placement.scoring import ScoreWeights  # noqa: E402

MIX = ((150, RankLayout(tp=8, pp=1, dp=1)), (40, RankLayout(tp=8, pp=4, dp=2)),
       (10, RankLayout(tp=8, pp=4, dp=8)))
"""Jobs per 10,000 GPUs of fleet."""
NODES_PER_RACK, GPUS_PER_NODE, UNHEALTHY_EVERY = 8, 8, 625
RESERVED = 200
"""Placements of the first pass committed to the store (enough for a median; each is a
transaction, and 2,000 of them would be most of the benchmark's time)."""


def generated_fleet(gpus: int) -> Cluster:
    """`gpus` H100 as the seed's fleet file writes them: rack templates of 8-GPU nodes, 8 per
    rack (the remainder in one smaller last rack), the fleet file's network, one node in 625
    unhealthy."""
    doc = yaml.safe_load((CLUSTERS_DIR / "h100-fleet.yaml").read_text())
    nodes = -(-gpus // GPUS_PER_NODE)
    full, rest = divmod(nodes, NODES_PER_RACK)
    node = {"name": "{rack}-n{index}", "gpuType": "H100", "gpusPerNode": GPUS_PER_NODE}
    racks = [{"name": "rack-{index:05d}", "count": full, "nodes": [{**node, "count": NODES_PER_RACK}]}]
    if rest:
        racks.append({"name": "rack-{index:05d}", "start": full, "count": 1, "nodes": [{**node, "count": rest}]})
    doc["metadata"]["name"] = f"generated-{gpus}"
    doc["spec"]["racks"] = racks
    doc["spec"]["health"] = {f"rack-{(i * 7919) % full:05d}-n{i % NODES_PER_RACK}": {"healthy": False}
                             for i in range(nodes // UNHEALTHY_EVERY)}
    return Cluster.model_validate(doc)


def place_rack_first_fit(request: GangRequest, inventory: Inventory, free: Mapping[str, int]) -> Placement:
    """The rack-aware competitor: first-fit that fills rack by rack. Each pipeline (a replica's
    node set, `RankLayout.replica_nodes()`) goes to the first rack, in inventory order, with
    enough eligible nodes left, taking its first eligible nodes; pipelines no rack holds whole
    take the first eligible nodes left anywhere (as first-fit does).

    At its best: it reads the fleet through the same column index and indexed free map as the
    search (`Inventory.free_rows`), counts eligible nodes per rack with numpy, and finds the racks
    that hold the pipelines with a cumulative sum, touching `Node` objects only there
    (`place_rack_first_fit_scan` is the same rule as a Python loop; both pick the same nodes)."""
    per_node = inventory.gpus_per_node(request.gpu_type)
    index = inventory.of_type(request.gpu_type)
    rows = inventory.free_rows(request.gpu_type, free)
    usable = index.healthy.copy()
    usable[index.rows(request.exclude)] = False
    racks = len(index.rack_start) - 1
    for k in slots_per_node_options(request, per_node) if request.layout.tp <= per_node else ():
        layout = request.layout.with_ranks_per_node(k)
        sets = layout.replica_nodes()
        m, units = len(sets[0]), len(sets)
        eligible = usable & (rows >= k)
        counts = np.bincount(index.rack[eligible], minlength=racks)
        if int(counts.sum()) < layout.num_nodes:
            continue
        cumulative = np.cumsum(counts // m)
        last = int(np.searchsorted(cumulative, units)) if cumulative[-1] >= units else racks - 1
        whole: list[list] = []
        loose: list = []
        for rack in np.flatnonzero(counts[:last + 1]).tolist():
            start = int(index.rack_start[rack])
            members = (start + np.flatnonzero(eligible[start:index.rack_start[rack + 1]])).tolist()
            take = min(len(members) // m, units - len(whole))
            whole.extend([index.nodes[r] for r in members[i * m:(i + 1) * m]] for i in range(take))
            loose.extend(index.nodes[r] for r in members[take * m:])
        return _rack_first_fit_placement(request, inventory, free, layout, sets, whole, loose)
    raise Unschedulable.of(PendingReason(code="not_enough_nodes", gpu_type=request.gpu_type,
                                         message="rack-aware first-fit found too few free nodes"))


def place_rack_first_fit_scan(request: GangRequest, inventory: Inventory, free: Mapping[str, int]) -> Placement:
    """`place_rack_first_fit` as a Python loop over every rack's `Node`s (`--check` compares them)."""
    per_node = inventory.gpus_per_node(request.gpu_type)
    for k in slots_per_node_options(request, per_node) if request.layout.tp <= per_node else ():
        layout = request.layout.with_ranks_per_node(k)
        sets = layout.replica_nodes()
        m, units = len(sets[0]), len(sets)
        whole: list[list] = []
        loose: list = []
        for members in inventory.racks.values():
            pool = [n for n in members if n.gpu_type == request.gpu_type and n.healthy
                    and n.name not in request.exclude and int(free.get(n.name, 0)) >= k]
            while len(pool) >= m and len(whole) < units:
                whole.append(pool[:m])
                del pool[:m]
            loose.extend(pool)
            if len(whole) == units:
                break
        if len(whole) * m + len(loose) < layout.num_nodes:
            continue
        return _rack_first_fit_placement(request, inventory, free, layout, sets, whole, loose)
    raise Unschedulable.of(PendingReason(code="not_enough_nodes", gpu_type=request.gpu_type,
                                         message="rack-aware first-fit found too few free nodes"))


def _rack_first_fit_placement(request: GangRequest, inventory: Inventory, free: Mapping[str, int],
                              layout: RankLayout, sets: list, whole: list[list], loose: list) -> Placement:
    """Whole pipelines first, then the loose nodes cut into the rest; nodes put in rank order."""
    m, units = len(sets[0]), len(sets)
    units_nodes = whole + [loose[i * m:(i + 1) * m] for i in range(units - len(whole))]
    ordered: list = [None] * layout.num_nodes
    for positions, nodes in zip(sets, units_nodes, strict=True):
        for position, node in zip(positions, nodes, strict=True):
            ordered[position] = node
    return build_placement(request, layout, ordered, inventory, free, weights=ScoreWeights(),
                           strategy="rack-first-fit")


PLACERS = {"search": place_gang, "first-fit": place_first_fit, "rack-first-fit": place_rack_first_fit,
           "rack-first-fit-scan": place_rack_first_fit_scan}
INDEXED = ("search", "rack-first-fit")
"""Placers that read the indexed free map (the others loop over `Node`s and read a dict)."""


def job_mix(rng: random.Random, gpus: int) -> list[GangRequest]:
    scale = max(1, round(gpus / 10_000))
    jobs = [GangRequest(job=f"j{layout.world_size}-{i}", team="bench", gpu_type="H100", layout=layout)
            for count, layout in MIX for i in range(count * scale)]
    rng.shuffle(jobs)
    return jobs


def run_pass(inv: Inventory, jobs: list[GangRequest], placer: str, store: object | None = None) -> dict:
    # Each placer at its best: the search and the indexed rack-aware first-fit keep the
    # inventory's indexed map between requests (`FreeDevices`: writes update its columns); the
    # Python-loop placers scan a plain dict, whose reads are the fastest such a loop gets.
    free = inv.free_map() if placer in INDEXED else dict(inv.free_map())
    chosen: list[list[str] | None] = []
    times: list[float] = []
    cpu: list[float] = []
    reserve_times: list[float] = []
    violations = placed = gpus = in_rack = pp_total = 0
    for request in jobs:
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            placement: Placement = PLACERS[placer](request, inv, free)
        except Unschedulable:
            times.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
            chosen.append(None)
            continue
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        chosen.append(placement.node_names)
        violations += len(hard_violations(placement, request, inv, free))
        if store is not None and len(reserve_times) < RESERVED:
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
    return {"times": times, "cpu": cpu, "chosen": chosen, "reserve": reserve_times, "violations": violations, "placed": placed,
            "pipelines_of_4_left": left,
            "utilization": gpus / inv.total_gpus(), "pp_in_rack": in_rack / pp_total if pp_total else 1.0}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=2, help="passes of the mix (new arrival order each)")
    parser.add_argument("--gpus", type=int, default=100_000, help="fleet size; 10000 = the seed's fleet file")
    parser.add_argument("--check", action="store_true",
                        help="also run the Python-loop rack-aware first-fit and require the same nodes")
    args = parser.parse_args()

    cluster = load_cluster("h100-fleet") if args.gpus == 10_000 else generated_fleet(args.gpus)
    inv = Inventory.from_cluster(cluster)
    rng = random.Random(args.seed)
    search_times: list[float] = []
    reserve_times: list[float] = []
    results, baselines, rack_aware, scans = [], [], [], []
    for i in range(args.repeat):
        jobs = job_mix(rng, args.gpus)
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
        rack_aware.append(run_pass(inv, jobs, "rack-first-fit"))
        if args.check:
            scan = run_pass(inv, jobs, "rack-first-fit-scan")
            if scan["chosen"] != rack_aware[-1]["chosen"]:
                raise SystemExit("the indexed rack-aware first-fit chose other nodes than its Python loop")
            scans.append(scan)

    def mean(key: str, rows: list[dict]) -> float:
        return round(statistics.fmean(r[key] for r in rows), 4)

    def p99_ms(rows: list[dict]) -> float:
        return round(percentile([t for r in rows for t in r["times"]], 0.99) * 1000, 3)

    print(json.dumps({
        "gpus": inv.total_gpus(), "nodes": len(inv.nodes), "racks": len(inv.racks),
        "p50_ms": round(percentile(search_times, 0.50) * 1000, 3),
        "p99_ms": round(percentile(search_times, 0.99) * 1000, 3),
        "p99_cpu_ms": round(percentile([t for r in results for t in r["cpu"]], 0.99) * 1000, 3),
        "violations": sum(r["violations"] for r in results),
        "pp_groups_in_one_rack": mean("pp_in_rack", results),
        "utilization": mean("utilization", results),
        "baseline_pp_groups_in_one_rack": mean("pp_in_rack", baselines),
        "baseline_utilization": mean("utilization", baselines),
        "baseline_violations": sum(r["violations"] for r in baselines),
        "placed": mean("placed", results), "baseline_placed": mean("placed", baselines),
        "pipelines_of_4_left": mean("pipelines_of_4_left", results),
        "baseline_pipelines_of_4_left": mean("pipelines_of_4_left", baselines),
        "rack_aware_first_fit_pp_groups_in_one_rack": mean("pp_in_rack", rack_aware),
        "rack_aware_first_fit_utilization": mean("utilization", rack_aware),
        "rack_aware_first_fit_violations": sum(r["violations"] for r in rack_aware),
        "rack_aware_first_fit_pipelines_of_4_left": mean("pipelines_of_4_left", rack_aware),
        "jobs": len(jobs), "passes": args.repeat,
        "baseline_p99_ms": p99_ms(baselines),
        "rack_aware_first_fit_p50_ms": round(percentile([t for r in rack_aware for t in r["times"]], 0.5) * 1000, 3),
        "rack_aware_first_fit_p99_ms": p99_ms(rack_aware),
        "rack_aware_first_fit_p99_cpu_ms": round(
            percentile([t for r in rack_aware for t in r["cpu"]], 0.99) * 1000, 3),
        **({"rack_aware_first_fit_scan_p99_ms": p99_ms(scans), "rack_aware_first_fit_same_nodes": True}
           if scans else {}),
        "reserve_p50_ms": round(percentile(reserve_times, 0.50) * 1000, 3) if reserve_times else None,
        "cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "targets": {
            "p99_under_20ms": percentile(search_times, 0.99) < 0.02,
            "zero_violations": sum(r["violations"] for r in results) == 0,
            "more_pp_in_rack_than_first_fit": mean("pp_in_rack", results) > mean("pp_in_rack", baselines),
        },
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
