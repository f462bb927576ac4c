"""`LocalLauncher`: one detached torchrun agent per node of the placement, on this host.

Layout of one attempt's run folder (`<runs_dir>/<job>/<run>/<attempt>/`):

    handle.json                  the RunHandle (a second submit re-attaches to it)
    agents/<node>.log            torchrun's own output for that node
    agents/<node>.exit.json      the agent's outcome, an `AgentExit` (`trainyard.plugins.launch.agent`)
    agents/zygote.log            the run's warm rank starter (`trainyard.plugins.launch.rank_zygote`)
    ranks/rank-NNNNN.log         each rank's stdout + stderr
    ranks/rank-NNNNN.json        each rank's pids, process group, exit code: a `RankRecord`
    exits.jsonl                  every rank exit, restarts included
    heartbeats/rank-NNNNN.json   the worker runtime's heartbeats (DESIGN §8)
    stopped.json                 a `StopRequest`, written by `stop`
    diverged.json                a `DivergenceRecord`, written by the worker

(the models are in `plugins/run/records.py`)

Agents start in their own session (`start_new_session=True`), so they outlive the launching
process and a signal to the launcher's terminal never reaches them; torchrun itself starts
every rank in a session of its own. `stop` therefore signals every process group it knows of
(the agents' and the ranks'), then sweeps any process still carrying this run's
`TRAINYARD_RUN_DIR` — nothing of a stopped run survives.

One warm rank starter (`rank_zygote`) per attempt imports torch and the worker's libraries
once; the ranks' wrappers have their training processes forked from it (`TRAINYARD_WARM_RANKS=0`
in the launcher's environment turns it off). Only for a script that imports Trainyard: a plain
script's ranks start as torchrun would start them (`rank_zygote.warm_start_for`). It carries the run's marker, so `stop` sweeps it
with the rest, and it exits by itself once the agents are gone and its last rank has ended.

Rendezvous is c10d on 127.0.0.1, and nothing of a run listens beyond loopback: the stores
(`loopback`), gloo (`LOOPBACK_ENV`). c10d numbers nodes by sorting (address, agent pid); every
local agent has the same address, and agents are started in node-rank order, so pids — and
hence ranks — follow the placement. Each rank records the node it actually ran on, and
`RunStatus` reports that.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from trainyard.config.settings import DATA_CACHE_ENV, home_data_cache
from trainyard.config.worker_env import without_deployment_credentials
from trainyard.plugins.files import write_atomic
from trainyard.plugins.launch import rank_zygote
from trainyard.plugins.launch.base import LaunchError
from trainyard.plugins.launch.environment import (
    TORCHRUN_ENV,
    entry_args,
    job_environment,
    run_dir_for,
)
from trainyard.plugins.launch.rank_exec import log_path, rank_exec_args
from trainyard.plugins.run import processes
from trainyard.plugins.run.exit_codes import describe
from trainyard.plugins.run.heartbeat import Heartbeat, heartbeat_path
from trainyard.plugins.run.model import (
    AgentRecord,
    AgentStatus,
    RankStatus,
    RunHandle,
    RunStatus,
)
from trainyard.plugins.run.records import (
    STOPPED_FILE,
    AgentExit,
    RankRecord,
    StopRequest,
    read_model,
    read_rank_records,
)

if TYPE_CHECKING:
    from trainyard.config.spec import TrainingJob
    from trainyard.config.worker_env import WorkerEnv
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.placement.model import Placement

LOCAL_ADDRESSES = frozenset({"127.0.0.1", "localhost", "::1", socket.gethostname()})
RUN_MARKER = "TRAINYARD_RUN_DIR"
AGENT_MODULE = "trainyard.plugins.launch.agent"
"""Each node's torchrun agent (`python -m`), forked by the attempt's zygote where there is one."""
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo"}
"""Every rank of a local run is on this host: gloo's pairs listen on the loopback interface, not
on the address the host name resolves to (a LAN address on most machines; 127.0.0.1 here, by
`/etc/hosts`). The stores are kept on loopback by `loopback`; a spec's `training.env` still wins."""
INHERITED_TORCH_ENV = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                 "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail_lines(path: Path, lines: int) -> str:
    """The last `lines` lines of a file, reading only its end."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size, block, data = f.tell(), 8192, b""
            while size > 0 and data.count(b"\n") <= lines:
                step = min(block, size)
                size -= step
                f.seek(size)
                data = f.read(step) + data
    except OSError:
        return ""
    return b"\n".join(data.splitlines()[-lines:]).decode("utf-8", "replace") if lines > 0 else ""


class LocalLauncher:
    """Launch on this host with torchrun; see the module docstring for the run folder."""

    def __init__(
        self,
        runs_dir: str | Path,
        *,
        source_dir: str | Path | None = None,
        python: str = sys.executable,
        max_restarts: int = 0,
        base_env: Mapping[str, str] | None = None,
        endpoint_url: str | None = None,
        data_cache_dir: str | Path | None = None,
    ) -> None:
        self.runs_dir = Path(runs_dir)
        self.endpoint_url = endpoint_url
        """The S3 endpoint a `source.path` prefix is fetched from (None: AWS's)."""
        self.source_dir = Path(source_dir or Path.cwd()).resolve()
        self.python = python
        self.max_restarts = max_restarts
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.data_cache_dir = Path(data_cache_dir or self.base_env.get(DATA_CACHE_ENV)
                                   or home_data_cache(self.runs_dir.parent))
        """The node's shard cache, given to the ranks (`DATA_CACHE_ENV`): by default the home's
        (the runs folder's parent, as `sources` is) — a rank's own settings would otherwise find
        a `.trainyard` in the script's folder, its working directory, and fill a cache there."""
        self.warm_ranks = self.base_env.get(rank_zygote.SWITCH_ENV, "1") != "0"

    # --- submit -----------------------------------------------------------------------------

    def submit(self, job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv,
               *, attempt: int) -> RunHandle:
        self._check(job, plan, placement, worker_env, attempt)
        run_dir = Path(worker_env.run_dir) if worker_env.run_dir else run_dir_for(
            self.runs_dir, job.metadata.name, worker_env.run, attempt)
        existing = self._existing_handle(run_dir)
        if existing is not None:
            return existing
        if not worker_env.run_dir:
            worker_env = worker_env.model_copy(update={"run_dir": str(run_dir)})
        entry = self._entrypoint(job)
        workdir = self._workdir(job, entry)
        env = self._environment(job, plan, worker_env, workdir, gpu=placement.gpu_type != "cpu")
        self._sweep_half_started(run_dir)
        for sub in ("agents", "ranks"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        Path(worker_env.heartbeat_dir).mkdir(parents=True, exist_ok=True)
        port = _free_port()
        if self.warm_ranks and rank_zygote.warm_start_for(entry, workdir):
            env[rank_zygote.ADDRESS_ENV] = rank_zygote.new_address()
            if rank_zygote.start(self.python, env[rank_zygote.ADDRESS_ENV], [], entry, env=env,
                                 cwd=workdir, log=run_dir / "agents" / "zygote.log") is None:
                del env[rank_zygote.ADDRESS_ENV]
        agents: list[AgentRecord] = []
        try:
            for node in placement.nodes:
                agents.append(self._start_agent(job, placement, node, env, run_dir, port, entry, attempt, workdir))
        except OSError as e:
            self._kill_agents(agents)
            raise LaunchError(f"could not start torchrun for {job.metadata.name}: {e}") from e
        handle = RunHandle(
            kind="local", job=job.metadata.name, run=worker_env.run, attempt=attempt, world_size=placement.layout.world_size,
            run_dir=str(run_dir), heartbeat_dir=worker_env.heartbeat_dir,
            rdzv_endpoint=f"127.0.0.1:{port}", max_restarts=self.max_restarts, agents=agents,
            nodes=placement.node_names, ranks_per_node=placement.layout.ranks_per_node,
        )
        write_atomic(run_dir / "handle.json", handle.model_dump_json(indent=2))
        return handle

    def _check(self, job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv,
               attempt: int) -> None:
        name = job.metadata.name
        plan.layout.check_world_size(job.spec.hardware.gpu_count)
        placed, planned = placement.layout.world_size, plan.layout.world_size
        if placed != planned:
            raise ValueError(f"placement world size {placed} != plan world size {planned}")
        if placement.job != name or worker_env.job != name:
            raise ValueError(f"job names disagree: spec {name!r}, placement {placement.job!r}, "
                             f"worker env {worker_env.job!r}")
        if placement.run != worker_env.run:
            raise ValueError(f"runs disagree: placement {placement.run!r}, worker env {worker_env.run!r}")
        if worker_env.attempt != attempt:
            raise ValueError(f"attempt {attempt} != worker env attempt {worker_env.attempt}")
        remote = sorted({n.address for n in placement.nodes} - LOCAL_ADDRESSES)
        if remote:
            raise ValueError(f"the local launcher runs on this host only; placement uses {remote}")

    def _existing_handle(self, run_dir: Path) -> RunHandle | None:
        path = run_dir / "handle.json"
        if not path.exists():
            return None
        try:
            return RunHandle.model_validate_json(path.read_text())
        except (OSError, ValidationError) as e:
            raise LaunchError(f"{path} exists but is not a RunHandle ({e}); remove the run folder "
                              "or use another attempt number") from e

    @staticmethod
    def _sweep_half_started(run_dir: Path) -> None:
        """A submit that died between starting agents and writing `handle.json` left processes
        no handle knows; kill them (they carry this run's marker) so a retry never runs twice."""
        leftovers = processes.marked_processes(RUN_MARKER, str(run_dir))
        if leftovers:
            processes.signal_pids(leftovers, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while processes.marked_processes(RUN_MARKER, str(run_dir)) and time.monotonic() < deadline:
                time.sleep(0.1)

    def _workdir(self, job: TrainingJob, entry: str) -> Path:
        """Where the ranks run: the script's own folder (the working directory a user runs it from,
        so a file it opens relative to itself is found), or the source root for a module."""
        return Path(entry).parent if entry.endswith(".py") else self._source_root(job)

    def _source_root(self, job: TrainingJob) -> Path:
        """The code's root: the pinned commit of `spec.source.git` (checked out once into
        `<home>/sources/<commit>`), the `spec.source.path` folder or object-store prefix (fetched
        once per content into `<home>/sources/prefix-<digest>`), else this launcher's source folder."""
        from trainyard.plugins.launch.sources import source_root

        return source_root(job.spec.source, self.runs_dir.parent / "sources", self.source_dir,
                           endpoint_url=self.endpoint_url)

    def _entrypoint(self, job: TrainingJob) -> str:
        entry, root = job.spec.source.entrypoint, self._source_root(job)
        path = (root / entry).resolve()
        if entry.endswith(".py") and not path.is_file():
            raise ValueError(f"entrypoint {entry!r} not found under {root}")
        return str(path) if entry.endswith(".py") else entry

    def _environment(self, job: TrainingJob, plan: Plan, worker_env: WorkerEnv, workdir: Path, *,
                     gpu: bool) -> dict[str, str]:
        # torchrun sets the torch.distributed variables itself; ones inherited from an enclosing
        # torchrun (a launch from inside a job) would mislead the new agents.
        env = {k: v for k, v in self.base_env.items()
               if not (k in INHERITED_TORCH_ENV or k.startswith("TORCHELASTIC_"))}
        if worker_env.storage_credentials is not None:  # the run's own keys replace the deployment's
            env = without_deployment_credentials(env)
        # The script's folder only: Trainyard itself is imported from the installed distribution
        # (`trainyard.…`), never from a folder on the path beside the user's own modules.
        paths = [str(workdir)]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env.setdefault("PYTHONUNBUFFERED", "1")
        env = TORCHRUN_ENV | env | LOOPBACK_ENV
        env[DATA_CACHE_ENV] = str(self.data_cache_dir)
        env.update(job_environment(job, plan, worker_env, gpu=gpu))
        return env

    def _start_agent(self, job: TrainingJob, placement: Placement, node: Any, env: Mapping[str, str],
                     run_dir: Path, port: int, entry: str, attempt: int, workdir: Path) -> AgentRecord:
        agent_args = [
            "--exit-file", str(run_dir / "agents" / f"{node.name}.exit.json"), "--",
            "--nnodes", str(len(placement.nodes)), "--node-rank", str(node.node_rank),
            "--nproc-per-node", str(node.slots),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", f"{job.metadata.name}-{placement.run}-{attempt}", "--local-addr", "127.0.0.1",
            "--max-restarts", str(self.max_restarts),
            # torchrun's own folder (per-rank error files) with the run's, not a new /tmp/torchelastic_* each launch
            "--log-dir", str(run_dir / "agents" / f"{node.name}.torchelastic"),
            *rank_exec_args(run_dir, entry, entry_args(job)),
        ]
        node_env = dict(env, TRAINYARD_NODE=node.name)
        if placement.gpu_type != "cpu" and node.devices:
            node_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, node.devices))
        with (run_dir / "agents" / f"{node.name}.log").open("ab") as log:
            pid = self._fork_agent(agent_args, node_env, log.fileno(), workdir)
            if pid is None:
                cmd = [self.python, "-m", AGENT_MODULE, *agent_args]
                pid = subprocess.Popen(cmd, cwd=workdir, env=node_env, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True).pid
        return AgentRecord(node=node.name, node_rank=node.node_rank, pid=pid, pgid=pid,
                           start_ticks=processes.start_ticks(pid), nproc=node.slots)

    def _fork_agent(self, agent_args: list[str], env: dict[str, str], log: int, workdir: Path) -> int | None:
        """The agent forked by the attempt's zygote (torch already imported; a session of its
        own, as `start_new_session` gives), or None to start it as a plain process."""
        name = env.get(rank_zygote.ADDRESS_ENV)
        if not name:
            return None
        request = rank_zygote.Request(entry=AGENT_MODULE, module=True, args=agent_args, env=env,
                                      cwd=str(workdir), detached=True)  # it outlives this process, as the launch does
        with open(os.devnull, "rb") as devnull:
            answer = rank_zygote.ask(name, request, [devnull.fileno(), log, log])
        if answer is None:
            return None
        conn, pid = answer
        conn.close()
        return pid

    @staticmethod
    def _kill_agents(agents: list[AgentRecord]) -> None:
        processes.signal_groups([a.pgid for a in agents], signal.SIGKILL)

    # --- poll -------------------------------------------------------------------------------

    def poll(self, handle: RunHandle) -> RunStatus:
        if handle.kind != "local":
            raise ValueError(f"LocalLauncher cannot poll a {handle.kind!r} handle")
        run_dir = Path(handle.run_dir)
        agents = [self._agent_status(run_dir, a) for a in handle.agents]
        records = self._rank_records(run_dir)
        ranks = [self._rank_status(handle, rank, records.get(rank)) for rank in range(handle.world_size)]
        alive = any(a.alive for a in agents) or any(
            processes.is_alive(r.child_pid, r.child_start_ticks) for r in records.values())
        steps = [r.step for r in ranks if r.step is not None]
        state, message, code, failed = self._verdict(handle, run_dir, agents, ranks, records, alive)
        return RunStatus(state=state, message=message, exit_code=code, failed_rank=failed, ranks=ranks,
                         agents=agents, processes_alive=alive,
                         step=min(steps) if len(steps) == handle.world_size else None)

    @staticmethod
    def _agent_status(run_dir: Path, agent: AgentRecord) -> AgentStatus:
        processes.reap(agent.pid)
        alive = processes.is_alive(agent.pid, agent.start_ticks)
        outcome = read_model(run_dir / "agents" / f"{agent.node}.exit.json", AgentExit)
        if outcome is not None:
            return AgentStatus(node=agent.node, alive=alive, exit_code=outcome.exit_code,
                               message=outcome.error)
        message = "" if alive else "the agent is gone without an exit record (killed by SIGKILL?)"
        return AgentStatus(node=agent.node, alive=alive, message=message)

    @staticmethod
    def _rank_records(run_dir: Path) -> dict[int, RankRecord]:
        return read_rank_records(run_dir)

    @staticmethod
    def _rank_status(handle: RunHandle, rank: int, record: RankRecord | None) -> RankStatus:
        beat = _read_heartbeat(handle.heartbeat_dir, rank)
        now = time.time()
        age = round(now - beat.time, 3) if beat else None
        step, signal = (beat.progress_step, beat.signal) if beat else (None, "")
        if record is None:
            return RankStatus(rank=rank, step=step, heartbeat_age_s=age, signal=signal)
        code = record.exit_code
        alive = code is None and processes.is_alive(record.child_pid, record.child_start_ticks)
        return RankStatus(
            rank=rank, node=record.node, pid=record.child_pid,
            restart=record.restart, exit_code=code, outcome=describe(code),
            step=step, phase=beat.phase if beat else "", signal=signal,
            heartbeat_age_s=age, hung=bool(alive and beat and age is not None and age > beat.hang_timeout_s),
        )

    def _verdict(self, handle: RunHandle, run_dir: Path, agents: list[AgentStatus], ranks: list[RankStatus],
                 records: Mapping[int, RankRecord], alive: bool) -> tuple[str, str, int | None, int | None]:
        stop = read_model(run_dir / STOPPED_FILE, StopRequest)
        final = [r for r in ranks if r.exit_code not in (None, 0) and r.restart >= handle.max_restarts]
        first = min(final, key=lambda r: records[r.rank].ended_at or 0.0) if final else None
        if stop is not None and first is not None and \
                (records[first.rank].ended_at or 0.0) < stop.requested_at_s:
            stop = None  # it had failed before the stop, which only cleaned up
        stopped = stop is not None
        if stopped and not alive:
            return "stopped", "stopped on request", (first.exit_code if first else None), None
        if first is not None and not stopped:
            where = f" on {first.node}" if first.node else ""
            return ("failed", f"rank {first.rank}{where} failed: {first.outcome} (exit code {first.exit_code})",
                    first.exit_code, first.rank)
        broken = [a for a in agents if not a.alive and (a.exit_code is None or a.exit_code != 0)]
        if broken and not stopped:
            a = broken[0]
            detail = a.message or f"exit {a.exit_code}"
            return "failed", f"torchrun agent for {a.node} failed: {detail}", a.exit_code or 1, None
        if agents and all(not a.alive and a.exit_code == 0 for a in agents):
            return "succeeded", f"all {handle.world_size} ranks completed", 0, None
        if stopped:
            return "running", "stopping", None, None
        started = sum(1 for r in ranks if r.pid is not None)
        if started < handle.world_size:
            return "pending", f"rendezvous: {started} of {handle.world_size} ranks started", None, None
        hung = [r.rank for r in ranks if r.hung]
        return "running", (f"ranks {hung} have stale heartbeats" if hung else "running"), None, None

    # --- stop -------------------------------------------------------------------------------

    def stop(self, handle: RunHandle, grace_s: float = 30.0, *, lost_nodes: Collection[str] = ()) -> RunStatus:
        """SIGTERM the run, wait up to `grace_s`, then SIGKILL every process group of it.
        `lost_nodes` changes nothing here: every local node's processes are this machine's and
        answer their signals, so a gang whose node was lost (a GPU verdict) may still save.

        SIGTERM goes to the live agents (torchrun passes it on to its ranks' groups) and straight
        to the ranks of agents that are gone — never twice to the same rank: a second SIGTERM
        may kill a worker that is exiting after its emergency checkpoint.
        """
        run_dir = Path(handle.run_dir)
        if not (run_dir / STOPPED_FILE).exists():
            StopRequest(requested_at=datetime.now(UTC).isoformat(), requested_at_s=time.time(),
                        grace_s=grace_s).write(run_dir / STOPPED_FILE)
        self._terminate(handle)
        deadline = time.monotonic() + max(grace_s, 0.0)
        while time.monotonic() < deadline and self._members(handle):
            time.sleep(0.1)
        for _ in range(50):  # SIGKILL until nothing is left (a rank may be mid-start)
            if not self._members(handle):
                break
            self._signal_all(handle, signal.SIGKILL)
            time.sleep(0.1)
        return self.poll(handle)

    def _groups(self, handle: RunHandle) -> list[int]:
        groups = [a.pgid for a in handle.agents]
        groups += [r.pgid for r in self._rank_records(Path(handle.run_dir)).values()]
        return groups

    def _members(self, handle: RunHandle) -> list[int]:
        for agent in handle.agents:
            processes.reap(agent.pid)
        members = set(processes.group_members(self._groups(handle)))
        members.update(processes.marked_processes(RUN_MARKER, handle.run_dir))
        return sorted(members)

    def _terminate(self, handle: RunHandle) -> None:
        live = {a.node for a in handle.agents if processes.is_alive(a.pid, a.start_ticks)}
        processes.signal_groups([a.pgid for a in handle.agents if a.node in live], signal.SIGTERM)
        orphans = [r.pgid for r in self._rank_records(Path(handle.run_dir)).values()
                   if r.node not in live and r.exit_code is None]
        processes.signal_groups(orphans, signal.SIGTERM)

    def _signal_all(self, handle: RunHandle, sig: signal.Signals) -> None:
        processes.signal_groups(self._groups(handle), sig)
        processes.signal_pids(processes.marked_processes(RUN_MARKER, handle.run_dir), sig)

    def node_agents(self, handle: RunHandle) -> dict[str, str]:
        """The local stack's agents are started beside it and named in `TRAINYARD_NODE_AGENTS`."""
        return {}

    # --- logs -------------------------------------------------------------------------------

    def logs(self, handle: RunHandle, rank: int | None = None, tail: int = 200) -> str:
        """One rank's output, or (rank=None) every agent's torchrun output, last `tail` lines."""
        run_dir = Path(handle.run_dir)
        if rank is not None:
            if not 0 <= rank < handle.world_size:
                raise ValueError(f"rank {rank} is outside the job's world size {handle.world_size}")
            return tail_lines(log_path(run_dir, rank), tail)
        parts = [f"==> {a.node} (torchrun agent) <==\n" + tail_lines(run_dir / "agents" / f"{a.node}.log", tail)
                 for a in handle.agents]
        return "\n".join(parts)

    # --- convenience ------------------------------------------------------------------------

    def wait(self, handle: RunHandle, *, timeout_s: float, interval_s: float = 0.5) -> RunStatus:
        """Poll until the run finishes (then `settle` it), or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        status = self.poll(handle)
        while not status.finished and time.monotonic() < deadline:
            time.sleep(interval_s)
            status = self.poll(handle)
        return self.settle(handle, status) if status.finished else status

    def settle(self, handle: RunHandle, status: RunStatus | None = None, *, linger_s: float = 5.0,
               grace_s: float = 5.0) -> RunStatus:
        """Make sure nothing of a finished run lingers.

        After one rank fails for good, torchrun tears down that node's ranks, but an agent
        whose own ranks succeeded waits in its exit barrier for the lost peer (5 minutes by
        default). Give the run `linger_s` to end by itself — unless all that is left is such
        agents (`waiting_in_exit_barrier`), which end only when stopped — then `stop` the rest;
        the verdict stays "failed" (the stop only cleans up).
        """
        status = status or self.poll(handle)
        deadline = time.monotonic() + linger_s
        while status.finished and status.processes_alive and not waiting_in_exit_barrier(status) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
            status = self.poll(handle)
        if status.finished and status.processes_alive:
            status = self.stop(handle, grace_s=grace_s)
        return status


def waiting_in_exit_barrier(status: RunStatus) -> bool:
    """A failed run whose live processes are only torchrun agents with every one of their own
    ranks exited 0: they wait in the exit barrier for the failed peer until it times out (300 s),
    so lingering for them only delays the recovery. False while any rank runs or has no exit
    recorded, or while an agent of a failed rank is still alive (it is tearing down and records
    its own exit)."""
    if status.state != "failed" or not status.ranks or any(r.exit_code is None for r in status.ranks):
        return False
    alive = {a.node for a in status.agents if a.alive}
    return bool(alive) and all(r.exit_code == 0 for r in status.ranks if r.node in alive)


def _read_heartbeat(directory: str, rank: int) -> Heartbeat | None:
    if not directory:
        return None
    try:
        return Heartbeat.model_validate_json(heartbeat_path(directory, rank).read_text())
    except (OSError, ValidationError):
        return None
