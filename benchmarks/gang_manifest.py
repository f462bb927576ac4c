"""Gang manifest benchmark: the size of the Volcano Job for a gang on every healthy node of a
fleet, against the API server's object limit, and its render time.

    .venv/bin/python benchmarks/gang_manifest.py

Fleets: the example fleet (`config/clusters/h100-fleet.yaml`, 1,248 healthy nodes) and a
generated one of 12,500 healthy nodes (`benchmarks/placement.generated_fleet`, the fleet file's
rack templates). Per fleet, the job has the longest name a spec may have (`MAX_JOB_NAME`) and
every healthy node's 8 GPUs (TP 8 · PP 4), placed by the real placer; rendered with the default
`pin_to="rack"` (racks required, nodes preferred) and with `pin_to="node"` (nodes required):
`bytes` is the Job as JSON (what the API server stores), `limit_bytes` `MAX_OBJECT_BYTES`,
`render_ms` one `render_volcano_job` call, `longest_hostname` the longest pod name the Job makes
(≤ 63: a DNS label). Before this change each node was its own task: 11,336,553 bytes at 1,248
nodes (issue #55), refused. `cpu_count` and `load_avg_1m` describe the machine. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.placement import GPUS_PER_NODE, UNHEALTHY_EVERY, generated_fleet  # noqa: E402
from trainyard.config.cluster import Cluster, load_cluster  # noqa: E402
from trainyard.config.rules import MAX_JOB_NAME  # noqa: E402
from trainyard.config.settings import Settings  # noqa: E402
from trainyard.config.spec import TrainingJob  # noqa: E402
from trainyard.plugins.advisor.plan import Plan  # noqa: E402
from trainyard.plugins.advisor.rank_layout import RankLayout  # noqa: E402
from trainyard.plugins.launch.environment import build_worker_env  # noqa: E402
from trainyard.plugins.launch.gang_pods import gang_pods  # noqa: E402
from trainyard.plugins.launch.kube_status import gang_tasks_of  # noqa: E402
from trainyard.plugins.launch.manifests import (  # noqa: E402
    MAX_OBJECT_BYTES,
    KubernetesOptions,
    render_volcano_job,
)
from trainyard.plugins.placement.gang import place_gang  # noqa: E402
from trainyard.plugins.placement.inventory import Inventory  # noqa: E402
from trainyard.plugins.placement.model import GangRequest  # noqa: E402

TP, PP = 8, 4


def measure(cluster: Cluster, home: Path) -> dict[str, object]:
    inventory = Inventory.from_cluster(cluster)
    healthy = sum(1 for n in inventory.nodes if n.healthy and n.gpu_type == "H100")
    gpus = GPUS_PER_NODE * healthy
    job = TrainingJob.model_validate({
        "apiVersion": "training.platform/v1", "kind": "TrainingJob",
        "metadata": {"name": ("gang-" + "x" * MAX_JOB_NAME)[:MAX_JOB_NAME], "team": "foundation"},
        "spec": {"source": {"entrypoint": "pretrain.py"}, "image": "registry.example.com/train:1",
                 "hardware": {"gpuType": "H100", "gpuCount": gpus},
                 "parallelism": {"strategy": "manual", "tensorParallel": TP, "pipelineParallel": PP}}})
    plan = Plan(layout=RankLayout(tp=TP, pp=PP, dp=gpus // (TP * PP)))
    placement = place_gang(GangRequest.for_job(job, plan), inventory)
    env = build_worker_env(job, plan, Settings(home=home, object_store="s3://trainyard/objects",
                                               mlflow_tracking_uri="http://mlflow.ml.svc:5000"),
                           run="20261207t080000-abcdef", attempt=0)
    out: dict[str, object] = {"nodes": len(placement.nodes), "limit_bytes": MAX_OBJECT_BYTES}
    for pin in ("rack", "node"):
        started = time.perf_counter()
        body = render_volcano_job(job, plan, placement, env, attempt=0, options=KubernetesOptions(pin_to=pin))
        out[f"{pin}_render_ms"] = round((time.perf_counter() - started) * 1000, 1)
        out[f"{pin}_bytes"] = len(json.dumps(body))
        out[f"{pin}_tasks"] = len(body["spec"]["tasks"])
    out["longest_hostname"] = max(len(p) for p in gang_pods(body["metadata"]["name"], gang_tasks_of(body)))
    return out


def main() -> None:
    fleets = {"example_fleet": load_cluster("h100-fleet"),
              # 12,500 healthy: the generator marks one node in UNHEALTHY_EVERY unhealthy
              "generated_12500": generated_fleet(GPUS_PER_NODE * (12_500 + 12_500 // (UNHEALTHY_EVERY - 1)))}
    with tempfile.TemporaryDirectory(prefix="gang-manifest-") as tmp:
        result = {name: measure(cluster, Path(tmp)) for name, cluster in fleets.items()}
    result |= {"cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
