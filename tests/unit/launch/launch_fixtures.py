"""Shared pieces for the launcher tests: a GPU job placed on the fleet, and schema validators
reading the Volcano CRDs from `../shared/schemas/` (never copied into the project)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import yaml

from tests.support.procs import REPO_ROOT
from tests.support.require import missing
from trainyard.config.cluster import load_cluster
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.config.worker_env import WorkerEnv
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.launch.environment import build_worker_env
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest, Placement

SCHEMAS = Path(os.environ.get("TRAINYARD_SHARED_SCHEMAS") or REPO_ROOT.parent / "shared" / "schemas")
"""`../shared/schemas` beside the checkout; a git worktree elsewhere names it with the variable."""
VOLCANO = SCHEMAS / "volcano"

GPU_SPEC: dict[str, Any] = {
    "apiVersion": "training.platform/v1", "kind": "TrainingJob",
    "metadata": {"name": "gpt-200b", "team": "foundation", "priority": "critical", "labels": {"cost-center": "llm"}},
    "spec": {
        "source": {"entrypoint": "pretrain.py", "args": ["--config", "200b.yaml"]},
        "image": "registry.example.com/train:1",
        "hardware": {"gpuType": "H100", "gpuCount": 256},
        "parallelism": {"strategy": "manual", "tensorParallel": 8, "pipelineParallel": 4},
        "dataset": {"source": "s3://datasets/web/"},
        "training": {"maxSteps": 10, "learningRate": 0.0003, "env": {"MY_FLAG": "1"}},
    },
}


def gpu_job(**spec_overrides: Any) -> tuple[TrainingJob, Plan, Placement, WorkerEnv]:
    data = yaml.safe_load(yaml.safe_dump(GPU_SPEC))
    data["spec"].update(spec_overrides)
    job = TrainingJob.model_validate(data)
    plan = Plan(layout=RankLayout(tp=8, pp=4, dp=job.spec.hardware.gpu_count // 32), nccl_env={"NCCL_ALGO": "Ring"})
    placement = place_gang(GangRequest.for_job(job, plan), fleet())
    env = build_worker_env(job, plan, Settings(home=Path("/tmp/unused-trainyard-home"),
                                               object_store="s3://trainyard/objects",
                                               mlflow_tracking_uri="http://mlflow.ml.svc:5000"),
                           run="r-test", attempt=2, mlflow_run_id="0123456789abcdef0123456789abcdef")
    return job, plan, placement, env


@functools.cache
def fleet() -> Inventory:
    return Inventory.from_cluster(load_cluster("h100-fleet"))


def _strict(schema: Any) -> Any:
    """The API server prunes unknown fields and, with strict field validation (kubectl's
    default), rejects them; plain JSON Schema would accept them. Forbid them, so a typo fails."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def _crd_schema(filename: str) -> dict[str, Any]:
    crd = yaml.safe_load((VOLCANO / filename).read_text())
    return _strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def volcano_schema(filename: str) -> dict[str, Any]:
    if not (VOLCANO / filename).exists():
        missing("schemas", f"Volcano CRD schemas not found at {VOLCANO} (the shared schemas folder is absent)")
    return _crd_schema(filename)


def validate_volcano(doc: dict[str, Any], filename: str) -> None:
    import jsonschema

    jsonschema.Draft7Validator(volcano_schema(filename)).validate(doc)


def validate_k8s(doc: dict[str, Any]) -> str:
    import kubernetes_validate

    return kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def pod_of(task: dict[str, Any]) -> dict[str, Any]:
    """A Volcano task's template as the Pod it becomes."""
    meta = dict(task["template"]["metadata"], name=f"pod-{task['name']}")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": task["template"]["spec"]}
