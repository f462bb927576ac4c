"""A launcher backend for a cluster mode of its own (`fake`), registered the way a site would
register one (`TRAINYARD_LAUNCHERS='{"fake": "tests.support.fake_launcher:FakeBackend"}'`), to
prove the seam: the DAG's tasks, `trainyard launch` and the training trigger all get it from
`launcher_for` alone.

It starts nothing. `submit` writes the handle into `<runs>/<job>/<run>/<attempt>/`, and every call
is appended to `calls.jsonl` there, with the process that made it; `poll` reports the run
running for `POLLS_TO_FINISH` polls, then succeeded at `STEPS` steps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.plugins.launch.environment import run_dir_for
from trainyard.plugins.run.model import RankStatus, RunHandle, RunStatus

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.config.spec import TrainingJob
    from trainyard.config.worker_env import WorkerEnv
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.launch.base import LaunchOptions, Runtime
    from trainyard.plugins.placement.model import Placement

MODE = "fake"
BACKEND = "tests.support.fake_launcher:FakeBackend"
POLLS_TO_FINISH = 2
STEPS = 7


def calls(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class FakeLauncher:
    def __init__(self, runs_dir: Path, *, max_restarts: int = 0) -> None:
        self.runs_dir = runs_dir
        self.max_restarts = max_restarts

    def _record(self, run_dir: str | Path, call: str, **facts: Any) -> None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        with (Path(run_dir) / "calls.jsonl").open("a") as f:
            f.write(json.dumps({"call": call, "pid": os.getpid(), **facts}) + "\n")

    def submit(self, job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv,
               *, attempt: int) -> RunHandle:
        run_dir = run_dir_for(self.runs_dir, job.name, worker_env.run, attempt)
        if (run_dir / "handle.json").exists():  # idempotent, as the protocol asks
            handle = RunHandle.model_validate_json((run_dir / "handle.json").read_text())
            self._record(run_dir, "submit-again")
            return handle
        handle = RunHandle(kind=MODE, job=job.name, run=worker_env.run, attempt=attempt,
                           world_size=placement.layout.world_size, run_dir=str(run_dir), nodes=placement.node_names,
                           max_restarts=self.max_restarts, ranks_per_node=placement.layout.ranks_per_node)
        self._record(run_dir, "submit", nodes=placement.node_names, faults=worker_env.faults,
                     max_restarts=self.max_restarts)
        (run_dir / "handle.json").write_text(handle.model_dump_json())
        return handle

    def poll(self, handle: RunHandle) -> RunStatus:
        polls = sum(c["call"] == "poll" for c in calls(handle.run_dir)) + 1
        self._record(handle.run_dir, "poll")
        done = polls > POLLS_TO_FINISH
        ranks = [RankStatus(rank=r, node=handle.nodes[r // handle.ranks_per_node], step=STEPS if done else 1,
                            exit_code=0 if done else None, outcome="completed" if done else "")
                 for r in range(handle.world_size)]
        return RunStatus(state="succeeded" if done else "running", message=f"fake poll {polls}",
                         exit_code=0 if done else None, ranks=ranks, step=STEPS if done else 1)

    def stop(self, handle: RunHandle, grace_s: float = 30.0, *, lost_nodes: Collection[str] = ()) -> RunStatus:
        self._record(handle.run_dir, "stop", grace_s=grace_s)
        return RunStatus(state="stopped", message="fake stop")

    def logs(self, handle: RunHandle, rank: int | None = None, tail: int = 200) -> str:
        return f"fake log of rank {rank}"

    def node_agents(self, handle: RunHandle) -> dict[str, str]:
        return {}

    def settle(self, handle: RunHandle, status: RunStatus | None = None) -> RunStatus:
        self._record(handle.run_dir, "settle")
        return status or self.poll(handle)


class FakeBackend:
    @classmethod
    def create(cls, settings: Settings, options: LaunchOptions, runtime: Runtime) -> FakeLauncher:
        return FakeLauncher(settings.runs_dir, max_restarts=options.max_restarts)

    @classmethod
    def attach(cls, handle: RunHandle, settings: Settings, runtime: Runtime) -> FakeLauncher:
        return FakeLauncher(settings.runs_dir)


def fake_cluster(path: Path) -> Path:
    """A cluster file of the fake mode: two nodes of two CPU slots, like the local cluster."""
    path.write_text(
        "apiVersion: training.platform/v1\nkind: Cluster\nmetadata: {name: fake-fleet}\n"
        "spec:\n  mode: fake\n  accelerators:\n    cpu: {memory: 4GiB, hourlyRateUsd: 0.05}\n"
        "  racks:\n    - name: fake-rack\n      nodes:\n"
        "        - {name: 'fake-{index}', count: 2, gpuType: cpu, gpusPerNode: 2, address: 127.0.0.1}\n")
    return path
