"""Small, valid specs and plans for tracking tests (built from the demo spec's shape)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from safetensors.numpy import save_file

from tests.support.procs import REPO_ROOT
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.data.datasets import DatasetRef
from trainyard.plugins.tracking import runs

_DEMO = yaml.safe_load((REPO_ROOT / "config/jobs/demo-tiny-lm.yaml").read_text())


def make_job(
    name: str = "demo-tiny-lm",
    *,
    team: str = "demo",
    project: str = "tiny-lm",
    source: str = "datasets/pydoc-topics/",
    version: str | None = "v1",
    quality: dict[str, Any] | None = None,
    gpu_type: str = "cpu",
    gpu_count: int = 2,
    git_commit: str | None = None,
    env: dict[str, str] | None = None,
) -> TrainingJob:
    doc = copy.deepcopy(_DEMO)
    doc["metadata"].update(name=name, team=team, project=project)
    doc["spec"]["dataset"]["source"] = source
    if version is None:
        doc["spec"]["dataset"].pop("version", None)
    else:
        doc["spec"]["dataset"]["version"] = version
    if quality is not None:
        doc["spec"]["dataset"]["quality"] = quality
    doc["spec"]["hardware"].update(gpuType=gpu_type, gpuCount=gpu_count)
    if git_commit:
        doc["spec"]["source"]["git"] = {"repo": "https://example.com/acme/train.git", "commit": git_commit}
    if env:
        doc["spec"]["training"]["env"] = env
    return TrainingJob.model_validate(doc)


def make_plan(**overrides: Any) -> Plan:
    """A plan of DP 2 unless the degrees given (`tp=`, `dp=`, …) say otherwise."""
    degrees = {k: overrides.pop(k) for k in ("tp", "pp", "dp", "cp") if k in overrides}
    layout = RankLayout(**{"dp": 2, **degrees})
    values: dict[str, Any] = {"micro_batch_size": 4, "num_micro_batches": 2,
                              "sequence_length": 128, "global_batch_size": 16}
    values.update(overrides)
    if "global_batch_size" not in overrides:
        values["global_batch_size"] = values["micro_batch_size"] * values["num_micro_batches"] * layout.dp
    return Plan(layout=layout, **values)


SHA = "cd" * 32


def registry_dataset(version: str, digest: str = "d" * 64) -> DatasetRef:
    return DatasetRef(uri="s3://datasets/wiki", version=version, digest=digest, digest_method="listing",
                      num_shards=4, total_bytes=1 << 20)


def trained_run(uri: str, name: str, ds: DatasetRef, losses: dict[int, float]) -> str:
    rid = runs.start_or_resume_run(make_job(name), make_plan(), tracking_uri=uri, attempt=0, dataset=ds)
    for step, loss in losses.items():
        runs.log_checkpoint(rid, f"file:///ckpt/{name}/step-{step:08d}/MANIFEST.json", SHA, step,
                            {"loss": loss}, tracking_uri=uri)
    runs.set_run_status(rid, "completed", tracking_uri=uri)
    return rid


def export_marking_the_step(manifest_uri: str, dest: Path) -> None:
    """Stands in for trainyard.plugins.checkpoint's export_safetensors (not in the tree yet): a real
    safetensors file whose tensor says which checkpoint was exported."""
    step = int(manifest_uri.rsplit("step-", 1)[1].split("/")[0])
    save_file({"layer.weight": np.full((4, 8), step, dtype=np.float32), "layer.bias": np.zeros(8, np.float32)},
              str(dest))


def write_jsonl(path: Path, rows: Iterable[dict[str, Any] | str]) -> Path:
    """One JSON object per line; a str row is written as-is (for broken lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def register_llama_version(uri: str, tmp_path: Path, job: TrainingJob, objects: str, *, train_steps: int,
                           alias: str) -> str:
    """A real model version of `job`'s Llama: `train_steps` AdamW steps on the last 8 windows of
    its dataset (0: the initial weights), committed by the CheckpointManager under the job's
    prefix, recorded on a run and registered through the real export. Returns the version."""
    import torch

    from trainyard.plugins.checkpoint.manager import CheckpointManager
    from trainyard.plugins.tracking import registry
    from trainyard.worker import evaluate
    from trainyard.worker.models.llama import Llama, LlamaConfig, cross_entropy_loss

    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_hints(job.spec.parallelism.hints))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    inputs, targets, _ = evaluate.eval_windows(job, object_store=objects, samples=8)
    for _ in range(train_steps):  # fit the held-out slice itself: the loss there must drop
        cross_entropy_loss(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0)
    root = f"{objects}/jobs/{job.name}/runs/r{train_steps}/checkpoints"
    with CheckpointManager(checkpoint_uri=root, job=job.name, rank=0, world_size=1,
                           staging_dir=tmp_path / f"staging-{train_steps}") as mgr:
        result = mgr.save_sync(train_steps + 1, model=model, optimizer=optimizer, metrics={"loss": 1.0})
    runs.log_committed_checkpoint(rid, result.manifest_uri, tracking_uri=uri)
    return registry.register_checkpoint(rid, tracking_uri=uri, model_name=job.name, alias=alias).version
