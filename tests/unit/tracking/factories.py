"""Small, valid specs and plans for tracking tests (built from the demo spec's shape)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from config.spec import TrainingJob
from plugins.advisor.plan import Plan
from tests.support.procs import REPO_ROOT

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
    values: dict[str, Any] = {"dp": 2, "micro_batch_size": 4, "num_micro_batches": 2,
                              "sequence_length": 128, "global_batch_size": 16}
    values.update(overrides)
    if "global_batch_size" not in overrides:
        values["global_batch_size"] = values["micro_batch_size"] * values["num_micro_batches"] * values["dp"]
    return Plan(**values)


def write_jsonl(path: Path, rows: Iterable[dict[str, Any] | str]) -> Path:
    """One JSON object per line; a str row is written as-is (for broken lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path
