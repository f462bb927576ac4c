"""LocalLauncher logic that needs no torchrun: status verdicts from a run folder's records,
process liveness from /proc, submit's checks, logs, exit-code names."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

import pytest

from tests.support.waiting import wait_for
from trainyard.config.cluster import load_cluster
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.launch.environment import build_worker_env
from trainyard.plugins.launch.local import LocalLauncher, tail_lines, waiting_in_exit_barrier
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest
from trainyard.plugins.run import processes
from trainyard.plugins.run.exit_codes import describe, known_codes
from trainyard.plugins.run.heartbeat import Heartbeat, write_heartbeat
from trainyard.plugins.run.model import (
    AgentRecord,
    AgentStatus,
    RankStatus,
    RunHandle,
    RunStatus,
)
from trainyard.plugins.run.records import AgentExit, RankRecord, StopRequest


def dead_pid() -> tuple[int, int | None]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = processes.start_ticks(proc.pid)
    proc.wait()
    return proc.pid, ticks


def make_run(tmp_path: Path, *, world: int = 2, max_restarts: int = 0) -> RunHandle:
    run = tmp_path / "run"
    for sub in ("agents", "ranks", "heartbeats"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    agents = []
    for i in range(2):
        pid, ticks = dead_pid()
        agents.append(AgentRecord(node=f"local-{i}", node_rank=i, pid=pid, pgid=pid, start_ticks=ticks, nproc=1))
    return RunHandle(kind="local", job="j", attempt=0, world_size=world, run_dir=str(run),
                     heartbeat_dir=str(run / "heartbeats"), max_restarts=max_restarts, agents=agents)


def agent_exit(handle: RunHandle, node: str, code: int) -> None:
    AgentExit(exit_code=code, ended_at=time.time(), pid=1).write(
        Path(handle.run_dir, "agents", f"{node}.exit.json"))


def rank_record(handle: RunHandle, rank: int, code: int | None, ended_at: float = 0.0, restart: int = 0) -> None:
    pid, ticks = dead_pid()
    record = RankRecord(rank=rank, node=f"local-{rank}", pid=pid, pgid=pid, started_at=0.0, child_pid=pid,
                        child_start_ticks=ticks, restart=restart, exit_code=code,
                        ended_at=ended_at if code is not None else None)
    record.write(Path(handle.run_dir, "ranks", f"rank-{rank:05d}.json"))


def test_all_agents_exit_zero_is_success(tmp_path: Path) -> None:
    handle = make_run(tmp_path)
    for i in range(2):
        agent_exit(handle, f"local-{i}", 0)
        rank_record(handle, i, 0)
    write_heartbeat(handle.heartbeat_dir, Heartbeat(job="j", rank=0, pid=1, step=7, time=time.time()))
    write_heartbeat(handle.heartbeat_dir, Heartbeat(job="j", rank=1, pid=1, step=9, time=time.time()))
    status = LocalLauncher(tmp_path).poll(handle)
    assert (status.state, status.exit_code, status.step, status.processes_alive) == ("succeeded", 0, 7, False)
    assert [r.outcome for r in status.ranks] == ["completed", "completed"]
    assert RunStatus.model_validate_json(status.model_dump_json()) == status


def test_the_first_failing_rank_is_the_culprit(tmp_path: Path) -> None:
    handle = make_run(tmp_path)
    rank_record(handle, 0, -15, ended_at=200.0)  # torn down afterwards
    rank_record(handle, 1, -9, ended_at=100.0)   # killed first
    agent_exit(handle, "local-0", 1)
    agent_exit(handle, "local-1", 1)
    status = LocalLauncher(tmp_path).poll(handle)
    assert status.state == "failed" and status.failed_rank == 1 and status.exit_code == -9
    assert status.message == "rank 1 on local-1 failed: killed by SIGKILL (exit code -9)"


def test_a_rank_failure_with_restarts_left_is_not_final(tmp_path: Path) -> None:
    handle = make_run(tmp_path, max_restarts=2)
    rank_record(handle, 0, 1, ended_at=1.0, restart=0)
    status = LocalLauncher(tmp_path).poll(handle)
    # Agents are gone without exit records here, which is a failure of its own kind.
    assert status.state == "failed" and status.failed_rank is None
    assert "gone without an exit record" in status.message


def test_stopped_marker_wins(tmp_path: Path) -> None:
    handle = make_run(tmp_path)
    rank_record(handle, 0, 43, ended_at=1.0)
    rank_record(handle, 1, 43, ended_at=1.0)
    # The ranks ended (at 1.0) after the stop was asked for (at 0.5): the stop explains them.
    StopRequest(requested_at="t", requested_at_s=0.5, grace_s=0).write(Path(handle.run_dir, "stopped.json"))
    status = LocalLauncher(tmp_path).poll(handle)
    assert status.state == "stopped" and [r.exit_code for r in status.ranks] == [43, 43]


def _failed(rank_codes: list[int | None], agents_alive: list[bool], state: str = "failed") -> RunStatus:
    return RunStatus(state=state, processes_alive=any(agents_alive),  # type: ignore[arg-type]
                     ranks=[RankStatus(rank=i, node=f"local-{i}", exit_code=c) for i, c in enumerate(rank_codes)],
                     agents=[AgentStatus(node=f"local-{i}", alive=a) for i, a in enumerate(agents_alive)])


def test_only_agents_whose_ranks_all_completed_are_waiting_in_the_exit_barrier() -> None:
    assert waiting_in_exit_barrier(_failed([0, 7], [True, False]))  # rank 1 failed; local-0 waits for it
    assert not waiting_in_exit_barrier(_failed([0, 7], [True, True]))  # local-1 is still tearing down
    assert not waiting_in_exit_barrier(_failed([None, 7], [True, False]))  # rank 0 runs (or never said)
    assert not waiting_in_exit_barrier(_failed([0, 0], [True, True], state="succeeded"))  # they leave together
    assert not waiting_in_exit_barrier(_failed([0, 7], [False, False]))  # nothing left to wait for
    assert not waiting_in_exit_barrier(_failed([], [True, False]))  # no rank said anything: linger as before


class _Scripted(LocalLauncher):
    """`settle` over scripted polls: what it looked at and whether it stopped."""

    def __init__(self, root: Path, polls: list[RunStatus]) -> None:
        super().__init__(root)
        self.polls, self.seen, self.stopped = polls, 0, False

    def poll(self, handle: RunHandle) -> RunStatus:
        self.seen += 1
        return self.polls[min(self.seen, len(self.polls)) - 1]

    def stop(self, handle: RunHandle, grace_s: float = 30.0, *, lost_nodes: Collection[str] = ()) -> RunStatus:
        self.stopped = True
        return self.polls[-1].model_copy(update={"processes_alive": False})


def test_settle_stops_a_peer_in_the_exit_barrier_at_once_and_lets_a_tearing_down_agent_end(
        tmp_path: Path) -> None:
    handle = make_run(tmp_path)
    barrier = _failed([0, 7], [True, False])
    launcher = _Scripted(tmp_path, [barrier])
    settled = launcher.settle(handle, barrier)
    assert (launcher.seen, launcher.stopped, settled.state, settled.processes_alive) == (0, True, "failed", False)

    tearing_down = _failed([0, 7], [True, True])  # local-1 still ends its own failed rank
    launcher = _Scripted(tmp_path, [_failed([0, 7], [False, False])])
    settled = launcher.settle(handle, tearing_down)
    assert (launcher.seen, launcher.stopped, settled.processes_alive) == (1, False, False)  # it ended by itself


def test_liveness_ignores_zombies_and_recycled_pids() -> None:
    assert processes.is_alive(os.getpid(), processes.start_ticks(os.getpid()))
    assert not processes.is_alive(os.getpid(), (processes.start_ticks(os.getpid()) or 0) + 1)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while (processes.stat_fields(proc.pid) or ["Z"])[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes.is_alive(proc.pid)  # a zombie: exited, not reaped
    processes.reap(proc.pid)
    assert processes.stat_fields(proc.pid) is None


def test_marked_processes_finds_a_run_by_its_variable(tmp_path: Path) -> None:
    env = dict(os.environ, TRAINYARD_RUN_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    try:
        # Popen returns once the child's exec has begun (vfork), before the kernel has laid out
        # its new environment: /proc/PID/environ reads empty for a moment (~5 % of tries here)
        wait_for(lambda: processes.marked_processes("TRAINYARD_RUN_DIR", str(tmp_path)) == [proc.pid],
                 "the process to show its marker", 30, poll_s=0.01)
        assert processes.group_members([proc.pid]) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert processes.marked_processes("TRAINYARD_RUN_DIR", str(tmp_path)) == []


def test_tail_lines(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_text("".join(f"line {i}\n" for i in range(20000)))
    assert tail_lines(path, 3) == "line 19997\nline 19998\nline 19999"
    assert tail_lines(tmp_path / "missing", 3) == ""


def test_exit_code_names() -> None:
    assert describe(0) == "completed" and describe(None) == ""
    assert describe(-9) == "killed by SIGKILL" and describe(137) == "exit 137 (killed by SIGKILL)"
    assert describe(3) == known_codes().get(3, "exit 3")
    # The worker runtime's codes (plugins/run/exit_codes.py), read, not copied.
    assert (describe(42), describe(43), describe(44)) == ("diverged", "preempted", "preempted_no_checkpoint")


def local_job(tmp_path: Path, **hardware: object) -> tuple[TrainingJob, Plan, object, object]:
    job = TrainingJob.model_validate({
        "apiVersion": "training.platform/v1", "kind": "TrainingJob",
        "metadata": {"name": "unit-job", "team": "demo"},
        "spec": {"source": {"entrypoint": "tests/integration/launch/tiny_job.py"},
                 "hardware": {"gpuType": "cpu", "gpuCount": 2, **hardware},
                 "parallelism": {"strategy": "manual"}, "dataset": {"source": "datasets/x/"},
                 "training": {"maxSteps": 1}},
    })
    plan = Plan(layout=RankLayout(dp=2))
    placement = place_gang(GangRequest.for_job(job, plan, run="r-test"), Inventory.from_cluster(load_cluster("local")))
    env = build_worker_env(job, plan, Settings(home=tmp_path), run="r-test", attempt=0)
    return job, plan, placement, env


def test_submit_checks_before_starting_anything(tmp_path: Path) -> None:
    from tests.support.procs import REPO_ROOT

    launcher = LocalLauncher(tmp_path / "runs", source_dir=REPO_ROOT)
    job, plan, placement, env = local_job(tmp_path)
    with pytest.raises(ValueError, match=r"attempt 1 != worker env attempt 0"):
        launcher.submit(job, plan, placement, env, attempt=1)
    with pytest.raises(ValueError, match=r"runs disagree: placement 'r-other', worker env 'r-test'"):
        launcher.submit(job, plan, placement.model_copy(update={"run": "r-other"}), env, attempt=0)
    with pytest.raises(ValueError, match=r"Invalid parallel dims: .* = 4 != WORLD_SIZE\(2\)"):
        launcher.submit(job, Plan(layout=RankLayout(dp=4)), placement, env, attempt=0)
    remote = placement.model_copy(update={"nodes": [n.model_copy(update={"address": "10.0.0.7"})
                                                    for n in placement.nodes]})
    with pytest.raises(ValueError, match=r"runs on this host only; placement uses \['10.0.0.7'\]"):
        launcher.submit(job, plan, remote, env, attempt=0)
    with pytest.raises(ValueError, match=r"entrypoint 'tests/integration/launch/tiny_job\.py' not found"):
        LocalLauncher(tmp_path / "runs", source_dir=tmp_path).submit(job, plan, placement, env, attempt=0)
    assert not (tmp_path / "runs").exists()


def test_both_launchers_implement_the_interface(tmp_path: Path) -> None:
    from unittest.mock import create_autospec

    from kubernetes.client import CustomObjectsApi

    from trainyard.plugins.launch.base import Launcher
    from trainyard.plugins.launch.volcano import KubernetesLauncher

    assert isinstance(LocalLauncher(tmp_path), Launcher)
    assert isinstance(KubernetesLauncher(create_autospec(CustomObjectsApi, instance=True)), Launcher)


def test_environment_layers_spec_env_under_the_contract_and_drops_inherited_torch_vars(tmp_path: Path) -> None:
    from tests.support.procs import REPO_ROOT

    job, plan, _, env = local_job(tmp_path)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={
        "training": job.spec.training.model_copy(update={"env": {"MY_FLAG": "on"}})})})
    launcher = LocalLauncher(tmp_path, source_dir=REPO_ROOT, base_env={
        "PATH": "/usr/bin", "RANK": "3", "MASTER_PORT": "1", "TORCHELASTIC_RUN_ID": "outer", "PYTHONPATH": "/x"})
    workdir = launcher._workdir(job, launcher._entrypoint(job))
    out = launcher._environment(job, plan, env, workdir, gpu=False)
    assert "RANK" not in out and "MASTER_PORT" not in out and "TORCHELASTIC_RUN_ID" not in out
    assert out["MY_FLAG"] == "on" and out["PATH"] == "/usr/bin"
    assert out["TRAINYARD_JOB"] == "unit-job" and out["TRAINYARD_PLAN"] == plan.model_dump_json()
    # the script's own folder (its working directory too), never the checkout root: no bare
    # `config`, `worker`, … of Trainyard's beside the user's modules
    assert workdir == (REPO_ROOT / job.spec.source.entrypoint).parent
    assert out["PYTHONPATH"].split(os.pathsep) == [str(workdir), "/x"]
    # the node's shard cache is the launcher's home's, not a `.trainyard` in the script's folder
    assert out["TRAINYARD_DATA_CACHE_DIR"] == str(tmp_path.parent / "data-cache")
    mine = LocalLauncher(tmp_path, source_dir=REPO_ROOT, base_env={"TRAINYARD_DATA_CACHE_DIR": "/cache"})
    assert mine._environment(job, plan, env, workdir, gpu=False)["TRAINYARD_DATA_CACHE_DIR"] == "/cache"


def test_a_half_started_submit_is_swept_before_a_retry(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "unit-job" / "0"
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env=dict(os.environ, TRAINYARD_RUN_DIR=str(run_dir)), start_new_session=True)
    try:
        # As in the marker test above: right after Popen, /proc/PID/environ can still read empty
        # (mid-exec) — a half-started submit's leftovers are long past that.
        wait_for(lambda: processes.marked_processes("TRAINYARD_RUN_DIR", str(run_dir)) == [orphan.pid],
                 "the orphan's marker in /proc", timeout_s=10)
        LocalLauncher._sweep_half_started(run_dir)
        assert orphan.wait(timeout=10) == -9
    finally:
        orphan.kill()


def test_a_run_with_its_own_storage_keys_gets_none_of_the_deployments(tmp_path: Path) -> None:
    """The ranks see the run's scoped keys and nothing through which botocore would find the
    deployment's: its keys, profile, web identity or instance role."""
    from tests.support.procs import REPO_ROOT
    from trainyard.config.worker_env import StorageCredentials

    job, plan, _, env = local_job(tmp_path)
    deployment = {"PATH": "/usr/bin", "AWS_ACCESS_KEY_ID": "AKIADEPLOYMENT", "AWS_SECRET_ACCESS_KEY": "deploy-secret",
                  "AWS_SESSION_TOKEN": "deploy-token", "AWS_PROFILE": "platform", "AWS_DEFAULT_REGION": "eu-west-1",
                  "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/token", "AWS_ROLE_ARN": "arn:aws:iam::1:role/platform"}
    launcher = LocalLauncher(tmp_path, source_dir=REPO_ROOT, base_env=deployment)
    workdir = launcher._workdir(job, launcher._entrypoint(job))
    keys = StorageCredentials(access_key_id="ASIARUN", secret_access_key="run-secret", session_token="run-token")
    out = launcher._environment(job, plan, env.model_copy(update={"storage_credentials": keys}), workdir, gpu=False)
    assert (out["AWS_ACCESS_KEY_ID"], out["AWS_SECRET_ACCESS_KEY"], out["AWS_SESSION_TOKEN"]) == (
        "ASIARUN", "run-secret", "run-token")
    assert not {"AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"} & set(out)
    assert out["AWS_EC2_METADATA_DISABLED"] == "true" and out["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert "deploy" not in " ".join(out.values())
    # without keys of its own (a file:// store, or `shared`), the run inherits the environment as before
    plain = launcher._environment(job, plan, env, workdir, gpu=False)
    assert plain["AWS_ACCESS_KEY_ID"] == "AKIADEPLOYMENT" and plain["AWS_PROFILE"] == "platform"
