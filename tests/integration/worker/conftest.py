"""Fixtures for running the example `worker/train.py` the way the local launcher does:
torchrun → `trainyard.plugins.launch.rank_exec` (which records each rank's exit code) → train.py, with
the `TRAINYARD_*` contract of `trainyard.config.worker_env.WorkerEnv` in the environment."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.procs import REPO_ROOT, run_torchrun
from trainyard.config.spec import TrainingJob
from trainyard.config.worker_env import WorkerEnv
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.checkpoint import list_checkpoints
from trainyard.plugins.checkpoint.uris import checkpoint_root
from trainyard.plugins.run.heartbeat import Heartbeat, heartbeat_path
from trainyard.plugins.run.records import read_rank_records
from trainyard.plugins.storage.store import open_store

RUN = "r-test"
"""The one training run these tests launch attempts of."""

TINY_HINTS = {
    "hiddenSize": 64, "numLayers": 2, "numAttentionHeads": 4, "numKeyValueHeads": 2,
    "ffnHiddenSize": 128, "vocabSize": 256, "sequenceLength": 32, "globalBatchSize": 8,
    "mixedPrecision": "fp32", "activation": "swiglu",
}


def tiny_job(name: str, *, max_steps: int, interval_steps: int, divergence_steps: int = 100,
             stripes: int | None = 1, **hints: Any) -> TrainingJob:
    """A spec like the demo's, with a model and batch small enough for a test — and one data
    stripe unless asked, so every plan reads the single process's samples in its order."""
    doc = yaml.safe_load((REPO_ROOT / "config/jobs/demo-tiny-lm.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["parallelism"]["hints"] = {**TINY_HINTS, **hints}
    doc["spec"]["checkpoint"] = {"intervalSteps": interval_steps, "maxKeep": 10}
    doc["spec"]["training"] = {"maxSteps": max_steps, "seed": 7, "learningRate": 0.003}
    doc["spec"]["faultTolerance"] = {"hangTimeout": "2m", "divergenceSteps": divergence_steps}
    doc["spec"]["dataset"]["stripes"] = stripes
    return TrainingJob.model_validate(doc)


def fsdp_plan(world_size: int = 2) -> Plan:
    return Plan(layout=RankLayout(dp=world_size), zero_stage=3, micro_batch_size=8 // world_size,
                global_batch_size=8, sequence_length=32)


@dataclass
class WorkerRun:
    result: subprocess.CompletedProcess[str]
    run_dir: Path
    world_size: int

    def exit_codes(self) -> list[int | None]:
        records = read_rank_records(self.run_dir)
        return [records[r].exit_code if r in records else None for r in range(self.world_size)]

    def heartbeat(self, rank: int) -> Heartbeat:
        return Heartbeat.model_validate_json(heartbeat_path(self.run_dir / "heartbeats", rank).read_text())

    def rank_log(self, rank: int) -> str:
        """The whole output of one rank (`logs()` shortens each, for failure messages)."""
        return (self.run_dir / "ranks" / f"rank-{rank:05d}.log").read_text()

    def logs(self) -> str:
        parts = [f"--- torchrun stdout ---\n{self.result.stdout[-3000:]}",
                 f"--- torchrun stderr ---\n{self.result.stderr[-3000:]}"]
        for log in sorted((self.run_dir / "ranks").glob("rank-*.log")):
            parts.append(f"--- {log.name} ---\n{log.read_text()[-6000:]}")
        return "\n".join(parts)

    def summary(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local object store holding the demo dataset (`trainyard data prepare-demo`)."""
    from trainyard.cli.main import main

    uri = (tmp_path_factory.mktemp("objects")).as_uri()
    assert main(["data", "prepare-demo", "--object-store", uri, "--shards", "4"]) == 0
    return uri


@pytest.fixture(scope="module")
def s3_object_store() -> Iterator[tuple[str, str]]:
    """(store URI, endpoint) of a real S3 endpoint (moto server) holding the demo dataset."""
    from tests.support.s3_server import running_s3_server
    from trainyard.cli.main import main

    with running_s3_server() as server:
        uri = f"s3://{server.new_bucket('objects')}/trainyard"
        assert main(["data", "prepare-demo", "--object-store", uri, "--endpoint-url",
                     server.endpoint_url, "--shards", "4"]) == 0
        yield uri, server.endpoint_url


def launch(job: TrainingJob, plan: Plan, *, object_store: str, run_dir: Path, attempt: int = 0,
           resume_from: str = "", faults: str = "", env: Mapping[str, str] | None = None,
           mlflow: tuple[str, str] = ("", "")) -> WorkerRun:
    """Run train.py for `job` under `plan` with the launcher's env contract; wait for it."""
    worker_env = WorkerEnv(
        job=job.metadata.name, run=RUN, attempt=attempt, plan=plan.model_dump_json(),
        spec=job.model_dump_json(by_alias=True), resume_from=resume_from, object_store=object_store,
        checkpoint_uri=checkpoint_root(object_store, job.metadata.name, RUN),
        heartbeat_dir=str(run_dir / "heartbeats"), hang_timeout_s=120, run_dir=str(run_dir),
        mlflow_tracking_uri=mlflow[0], mlflow_run_id=mlflow[1])
    full_env = {**worker_env.to_env(), "TRAINYARD_FAULTS": faults,
                "TRAINYARD_DATA_CACHE_DIR": str(run_dir.parent / "data-cache"), **(env or {})}
    result = run_torchrun("worker/train.py", ["--summary", str(run_dir / "summary.json")],
                          nproc=plan.layout.world_size, env=full_env, timeout=300, fork_ranks=run_dir,
                          rank_logs=True)
    return WorkerRun(result, run_dir, plan.layout.world_size)


def committed_steps(object_store: str, job: str, endpoint_url: str | None = None) -> list[int]:
    """Steps of `job`'s committed checkpoints, where `launch` put them."""
    store = open_store(checkpoint_root(object_store, job, RUN), endpoint_url=endpoint_url)
    return [r.manifest.step for r in list_checkpoints(store)]
