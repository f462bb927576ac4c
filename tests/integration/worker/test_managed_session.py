"""The managed mode's public API (`trainyard.init()`, `worker/managed.py`) on third-party code:
pytorch/examples' DDP tutorial (`tests/fixtures/ddp_tutorial/`), CPU-ported, adapted in at most
ten changed lines with nothing re-indented, run by torchrun with the launcher's contract — a rank
SIGKILLed mid-run by the fault variable, the next attempt resuming from the checkpoint the session
took, and the script's own `destroy_process_group()` still valid after `session.finish()`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.ddp_tutorial import adapt
from tests.integration.worker.conftest import fsdp_plan, tiny_job
from tests.support.procs import run_torchrun
from trainyard.config.worker_env import WorkerEnv
from trainyard.plugins.checkpoint import list_checkpoints
from trainyard.plugins.checkpoint.uris import checkpoint_root

pytestmark = pytest.mark.slow

RUN = "r-managed"
JOB = "ddp-tutorial"


def test_the_adaptation_is_at_most_ten_changed_lines_and_reindents_nothing() -> None:
    cpu, managed = adapt.cpu_port(), adapt.managed()
    assert adapt.changed_lines(adapt.ORIGINAL.read_text(), cpu) == 6
    assert adapt.changed_lines(cpu, managed) <= 10
    kept = [line for line in cpu.splitlines() if line.strip()]
    assert all(line in managed.splitlines() for line in kept)  # every line of the script stays as it was


def test_a_killed_rank_resumes_from_the_sessions_checkpoint_and_the_script_ends_its_own_group(tmp_path: Path) -> None:
    script = adapt.write(tmp_path / "team", adapt.managed())
    store = (tmp_path / "objects").as_uri()

    # every rank SIGKILLed once step 8's checkpoint is committed (a step of this model takes
    # microseconds: a kill at a step would race the asynchronous save it follows)
    crashed = _attempt(script, store, tmp_path, attempt=0, faults="sigkill_after_checkpoint@8")
    assert crashed.returncode != 0
    assert _steps(store) == [4, 8], crashed.stderr[-3000:]

    resumed = _attempt(script, store, tmp_path, attempt=1)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-4000:]
    assert "trainyard [rank 0]: resumed from step 8" in out  # said without the script configuring logging
    assert _steps(store) == [4, 8, 12]  # on the spec's schedule, then the final step
    assert "Error" not in resumed.stderr, resumed.stderr[-3000:]  # its destroy_process_group() included


def _attempt(script: Path, store: str, tmp_path: Path, *, attempt: int, faults: str = "") -> object:
    job = tiny_job(JOB, max_steps=12, interval_steps=4)
    run_dir = tmp_path / f"attempt-{attempt}"
    env = WorkerEnv(job=JOB, run=RUN, attempt=attempt, plan=fsdp_plan(2).model_dump_json(),
                    spec=job.model_dump_json(by_alias=True), resume_from="", object_store=store,
                    checkpoint_uri=checkpoint_root(store, JOB, RUN), heartbeat_dir=str(run_dir / "heartbeats"),
                    hang_timeout_s=120, run_dir=str(run_dir), mlflow_tracking_uri="", mlflow_run_id="").to_env()
    return run_torchrun(script, ["50", "100", "--batch_size", "32"], nproc=2,
                        env={**env, "TRAINYARD_FAULTS": faults}, timeout=300)


def _steps(store: str) -> list[int]:
    return [c.step for c in list_checkpoints(checkpoint_root(store, JOB, RUN))]
