"""The real Kubernetes harness's cost: start-up seconds and idle CPU (issue 55, Build 2).

    .venv/bin/python benchmarks/kube_real.py [--idle-s 60] [--no-nodes]

Starts `tests/support/kube/real_harness.RealKubeHarness` (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, Kueue and two simulated nodes in network namespaces;
needs root and `make kube-components`), or with `--no-nodes` the control plane alone
(`real_cluster.real_cluster`). Figures:
- `startup_s`: each part's seconds to ready (`timings`: etcd + API server, controller-manager +
  scheduler, Kueue's CRDs Established, Kueue's manager with its webhooks reachable) and
  `harness_s`, until the nodes are Ready and their not-ready taint is lifted;
- `idle_cpu_s_per_min`: CPU seconds (user + system) per minute while idle for `--idle-s`, per
  component process (from /proc), the kubelets (with their children) and this process (the
  relay to the API server and the DNS thread), and `total`;
- `load_avg_1m` before and after, `cpu_count`: the machine is shared, read the figures with it.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.kube.real_cluster import RealCluster, real_cluster
from tests.support.kube.real_harness import RealKubeHarness


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its reaped children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _sample(cluster: RealCluster, kubelets: dict[str, int]) -> dict[str, float]:
    out = dict(cluster.cpu_seconds())
    for name, pid in kubelets.items():
        out[f"kubelet {name}"] = _cpu_s(pid)
    out["harness process"] = sum(os.times()[:2])
    return out


def _idle(cluster: RealCluster, kubelets: dict[str, int], idle_s: float) -> dict[str, float]:
    before = _sample(cluster, kubelets)
    time.sleep(idle_s)
    after = _sample(cluster, kubelets)
    per_min = {k: round((after[k] - before[k]) * 60 / idle_s, 2) for k in before}
    per_min["total"] = round(sum(per_min.values()), 2)
    return per_min


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--no-nodes", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="kube-real-") as folder:
        started = time.monotonic()
        if args.no_nodes:
            with real_cluster(Path(folder)) as cluster:
                harness_s = time.monotonic() - started
                idle = _idle(cluster, {}, args.idle_s)
                timings = cluster.timings
        else:
            with RealKubeHarness(Path(folder)) as kube:
                harness_s = time.monotonic() - started
                assert kube.cluster is not None
                # the kubelet's pid is `ip netns exec`'s, which execs the kubelet's python
                kubelets = {n.name: n.kubelet.pid for n in kube.nodes.values() if n.kubelet is not None}
                time.sleep(5)  # past the start-up's own work (the first syncs, Kueue's first reconciles)
                idle = _idle(kube.cluster, kubelets, args.idle_s)
                timings = kube.cluster.timings
    print(json.dumps({"nodes": 0 if args.no_nodes else 2, "startup_s": timings, "harness_s": round(harness_s, 2),
                      "idle_s": args.idle_s, "idle_cpu_s_per_min": idle, "cpu_count": os.cpu_count(),
                      "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}))


if __name__ == "__main__":
    main()
