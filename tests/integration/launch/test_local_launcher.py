"""LocalLauncher with real torchrun processes: 2 nodes × 1 process on this machine (c10d on
127.0.0.1, gloo), started through `trainyard launch --local` and through the engine.

The job is `tiny_job.py` beside this file, not worker/train.py: the launcher is tested alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support import procs
from tests.support.procs import REPO_ROOT, check
from trainyard.config.cluster import load_cluster
from trainyard.config.loader import load_spec_file
from trainyard.config.settings import Settings
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.launch.environment import build_worker_env
from trainyard.plugins.launch.local import RUN_MARKER, LocalLauncher
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest
from trainyard.plugins.run import processes
from trainyard.plugins.run.exit_codes import describe
from trainyard.plugins.run.model import RunHandle, RunStatus
from trainyard.plugins.run.records import read_rank_records
from trainyard.plugins.state.reservations import usage_by_team

pytestmark = [pytest.mark.slow, pytest.mark.waits]
ENTRYPOINT = "tests/integration/launch/tiny_job.py"


def write_spec(path: Path, name: str, args: list[str], *, hang_timeout: str = "5m") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "training.platform/v1", "kind": "TrainingJob",
        "metadata": {"name": name, "team": "demo"},
        "spec": {
            "source": {"entrypoint": ENTRYPOINT, "args": args},
            "hardware": {"gpuType": "cpu", "gpuCount": 2, "nodesPreferred": 2},
            "parallelism": {"strategy": "manual"},
            "dataset": {"source": "datasets/none/"},
            "training": {"maxSteps": 3, "learningRate": 0.01},
            "faultTolerance": {"hangTimeout": hang_timeout},
        },
    }))
    return path


def cli(home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = procs.test_env({"TRAINYARD_HOME": str(home), "TRAINYARD_CLUSTER": "local", "COLUMNS": "200"})
    return subprocess.run([sys.executable, "-m", "trainyard.cli", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def wait_for(launcher: LocalLauncher, handle: RunHandle, predicate, timeout: float = 180) -> RunStatus:
    deadline = time.monotonic() + timeout
    status = launcher.poll(handle)
    while not predicate(status):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; last status {status}\n{launcher.logs(handle)}")
        time.sleep(0.2)
        status = launcher.poll(handle)
    return status


def start(tmp_path: Path, name: str, args: list[str], *, hang_timeout: str = "5m",
          env: dict[str, str] | None = None) -> tuple[LocalLauncher, RunHandle]:
    """Submit `tiny_job.py` with `args` on both local nodes, under `tmp_path/home`; `env` is added
    to the launcher's environment."""
    job = load_spec_file(write_spec(tmp_path / f"{name}.yaml", name, args, hang_timeout=hang_timeout))
    settings = Settings(home=tmp_path / "home")
    plan = Plan(layout=RankLayout(dp=2))
    placement = place_gang(GangRequest.for_job(job, plan, run="r-test"), Inventory.from_cluster(load_cluster("local")))
    launcher = LocalLauncher(settings.runs_dir, source_dir=REPO_ROOT,
                             base_env=procs.test_env({"OMP_NUM_THREADS": "1", **(env or {})}))
    env = build_worker_env(job, plan, settings, run="r-test", attempt=0)
    return launcher, launcher.submit(job, plan, placement, env, attempt=0)


def test_detached_job_completes_after_the_launching_process_exits(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = write_spec(tmp_path / "ok.yaml", "tiny-ok", ["--steps", "3", "--sleep", "2"])
    result = check(cli(home, "launch", "--local", "--offline", "--detach", str(spec)))
    handle = RunHandle.model_validate_json(result.stdout)  # the launching process has exited
    assert [a.node for a in handle.agents] == ["local-0", "local-1"]
    settings = Settings(home=home)
    assert usage_by_team(settings.state_db) == {"demo": 2}  # the reservation stays with the job
    launcher = LocalLauncher(settings.runs_dir)
    status = launcher.wait(handle, timeout_s=180)
    assert status.state == "succeeded", f"{status}\n{launcher.logs(handle)}"
    assert [(r.rank, r.node, r.exit_code, r.step) for r in status.ranks] == [
        (0, "local-0", 0, 3), (1, "local-1", 0, 3)]
    log = launcher.logs(handle, rank=1)
    assert "hello rank=1 world=2 job=tiny-ok attempt=0 node=local-1 lr=0.01" in log
    assert "step 3 sum=3" in log
    assert Path(handle.run_dir, "ranks", "rank-00000.log").is_file()
    assert Path(handle.run_dir) == settings.runs_dir / "tiny-ok" / handle.run / "0"  # job / run / attempt
    # torchrun's own folders stay in the run's, not one more /tmp/torchelastic_* per agent and launch
    assert sorted(p.name for p in Path(handle.run_dir, "agents").glob("*.torchelastic")) == [
        "local-0.torchelastic", "local-1.torchelastic"]
    # The follower the launch left behind releases the reservation and closes the MLflow run.
    from mlflow import MlflowClient

    client = MlflowClient(settings.mlflow_tracking_uri)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        (run,) = client.search_runs([client.get_experiment_by_name("demo/default").experiment_id])
        if usage_by_team(settings.state_db) == {} and run.info.status != "RUNNING":
            break
        time.sleep(0.5)
    follower_log = (Path(handle.run_dir) / "follower.log").read_text()
    assert usage_by_team(settings.state_db) == {}, follower_log
    assert run.info.status == "FINISHED" and run.data.tags["trainyard.job"] == "tiny-ok", follower_log


def test_cli_reports_the_failing_rank_and_exits_with_its_code(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = write_spec(tmp_path / "bad.yaml", "tiny-bad", ["--steps", "2", "--fail-rank", "1", "--exit-code", "7"])
    result = cli(home, "launch", "--local", "--offline", str(spec))
    assert result.returncode == 7, result.stdout + result.stderr
    assert f"rank 1 on local-1 failed: {describe(7)} (exit code 7)" in result.stdout
    assert "rank 1 failing on purpose with 7" in result.stdout  # the failed rank's log tail
    assert "verdict: worker_crash — rank 1 on local-1 exited with code 7 at step 2" in result.stdout
    assert "the control plane would restart: worker_crash: restart the same gang from scratch" in result.stdout
    assert usage_by_team(Settings(home=home).state_db) == {}  # released
    # The launch opened an MLflow run like the demo's, and ended it FAILED with its artifacts.
    from mlflow import MlflowClient

    from trainyard.plugins.tracking.artifacts import artifact_paths

    uri = Settings(home=home).mlflow_tracking_uri
    (run,) = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("demo/default").experiment_id])
    assert (run.info.status, run.data.tags["trainyard.job"]) == ("FAILED", "tiny-bad")
    assert f"MLflow run {run.info.run_id}" in result.stderr
    assert {"spec/tiny-bad.yaml", "plan/explanation.txt", "recovery/timeline.txt"} <= set(
        artifact_paths(MlflowClient(uri), run.info.run_id))


def test_killing_one_rank_is_reported_with_that_ranks_exit_code(tmp_path: Path) -> None:
    launcher, handle = start(tmp_path, "tiny-kill", ["--steps", "100000", "--sleep", "0.1"])
    try:
        running = wait_for(launcher, handle, lambda s: s.step is not None and s.step >= 2)
        assert running.state == "running" and running.ranks[1].pid
        os.kill(running.ranks[1].pid, signal.SIGKILL)
        status = launcher.wait(handle, timeout_s=180)
        assert status.state == "failed", status
        assert (status.failed_rank, status.exit_code) == (1, -signal.SIGKILL)
        assert status.ranks[1].outcome == "killed by SIGKILL"
        assert status.message == "rank 1 on local-1 failed: killed by SIGKILL (exit code -9)"
        assert not status.processes_alive
    finally:
        launcher.stop(handle, grace_s=0)


def test_stop_leaves_no_process_behind_and_submit_is_idempotent(tmp_path: Path) -> None:
    launcher, handle = start(tmp_path, "tiny-stop", ["--steps", "100000", "--sleep", "0.1"])
    wait_for(launcher, handle, lambda s: s.step is not None and s.step >= 2)
    job = load_spec_file(tmp_path / "tiny-stop.yaml")
    settings = Settings(home=tmp_path / "home")
    plan = Plan(layout=RankLayout(dp=2))
    placement = place_gang(GangRequest.for_job(job, plan, run="r-test"), Inventory.from_cluster(load_cluster("local")))
    again = launcher.submit(job, plan, placement, build_worker_env(job, plan, settings, run="r-test", attempt=0), attempt=0)
    assert again == handle  # a retry re-attaches; it never starts a second copy
    records = read_rank_records(Path(handle.run_dir))
    pids = [a.pid for a in handle.agents] + [r.pid for r in records.values()] + [
        r.child_pid for r in records.values() if r.child_pid]

    status = launcher.stop(handle, grace_s=20)
    assert status.state == "stopped" and not status.processes_alive
    assert processes.marked_processes(RUN_MARKER, handle.run_dir) == []
    assert processes.group_members([a.pgid for a in handle.agents] + [r.pgid for r in records.values()]) == []
    assert not any(processes.is_alive(pid) for pid in pids)
    codes = [r.exit_code for r in status.ranks]
    # SIGTERM gave each rank its "emergency checkpoint" exit (43); a rank caught inside an
    # all-reduce whose peer had already left may end with 1 instead.
    assert 43 in codes and set(codes) <= {43, 1}, codes
    assert "preempted" in [r.outcome for r in status.ranks]
    assert launcher.poll(handle).state == "stopped"


def test_cli_launch_leaves_cordoned_nodes_out_and_records_the_job_state_like_the_dag(tmp_path: Path) -> None:
    """`trainyard launch` runs the attempt engine's steps, the DAG's: a cordoned node is not
    placed on, and the run, its attempt, its handle and its outcome are in the job state."""
    from trainyard.plugins.state.jobs import JobStateStore

    home = tmp_path / "home"
    state = JobStateStore(Settings(home=home).state_db)
    state.cordon("local-0", "a test took it out of service", by="test")
    spec = write_spec(tmp_path / "ok.yaml", "tiny-cordon", ["--steps", "3"])
    result = cli(home, "launch", "--local", "--offline", "--run", "20261201t000000-c0d0aa", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "placed: local-1×2" in result.stderr and "excluded local-0" in result.stderr, result.stderr
    info = state.get_run("tiny-cordon", "20261201t000000-c0d0aa")
    (attempt,) = state.attempts("tiny-cordon", info.run)
    assert (info.state, attempt.outcome, attempt.action) == ("completed", "completed", "finish")  # no checkpoint
    assert attempt.run_handle is not None and attempt.run_handle.nodes == ["local-1"]
    assert usage_by_team(Settings(home=home).state_db) == {}  # released
