"""A tiny job placed on the simulated cluster, ready for `KubernetesLauncher.submit`: the
spec, plan, placement and worker environment a launch task would hand over.

The job runs `tests/integration/launch/tiny_job.py` (a gloo all-reduce per step). Its image
does not exist anywhere: the simulated nodes run every image as this repository's venv
(`kubelet.py`), except the images a harness lists as missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.config.cluster import Cluster, load_cluster
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.config.worker_env import WorkerEnv
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.launch.environment import build_worker_env
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest, Placement

ENTRYPOINT = "tests/integration/launch/tiny_job.py"
IMAGE = "registry.example.com/trainyard/tiny:1"


@dataclass(frozen=True)
class Placed:
    job: TrainingJob
    plan: Plan
    placement: Placement
    env: WorkerEnv

    def submit_args(self) -> tuple[TrainingJob, Plan, Placement, WorkerEnv]:
        return self.job, self.plan, self.placement, self.env


def tiny_job(name: str, args: list[str], *, image: str = IMAGE, gpus: int = 2, team: str = "demo") -> TrainingJob:
    return TrainingJob.model_validate({
        "apiVersion": "training.platform/v1", "kind": "TrainingJob",
        "metadata": {"name": name, "team": team},
        "spec": {"source": {"entrypoint": ENTRYPOINT, "args": args}, "image": image,
                 "hardware": {"gpuType": "cpu", "gpuCount": gpus, "nodesPreferred": 2},
                 "parallelism": {"strategy": "manual"}, "dataset": {"source": "datasets/none/"},
                 "training": {"maxSteps": 3, "learningRate": 0.01}},
    })


def wide_cluster(slots: int) -> Cluster:
    """The simulated cluster's two nodes as a planner that believes each has `slots` "GPUs"
    (how a spec asking for more than the nodes have reaches the scheduler)."""
    data: dict[str, Any] = load_cluster("kube-sim").model_dump(by_alias=True, exclude_none=True)
    for rack in data["spec"]["racks"]:
        for node in rack["nodes"]:
            node["gpusPerNode"] = slots
    return Cluster.model_validate(data)


def placed(job: TrainingJob, home: Path, *, run: str = "r-test", attempt: int = 0,
           cluster: Cluster | None = None, exclude: frozenset[str] = frozenset()) -> Placed:
    plan = Plan(layout=RankLayout(dp=job.spec.hardware.gpu_count))
    placement = place_gang(GangRequest.for_job(job, plan, run=run, exclude=exclude),
                           Inventory.from_cluster(cluster or load_cluster("kube-sim")))
    env = build_worker_env(job, plan, Settings(home=home, mlflow_tracking_uri="http://mlflow.example:5000"),
                           run=run, attempt=attempt, mlflow_run_id="0" * 32)
    return Placed(job, plan, placement, env)
