"""Fabricated run folders, in the launcher's layout (`plugins/launch/local.py`), read back by
the real `LocalLauncher.poll`: the classifier is tested on statuses the launcher itself
produces, not on hand-written `RunStatus` objects.

Files written here are the ones `rank_exec`, the torchrun agent wrapper, the worker runtime
and `LocalLauncher.stop` and `plugins.attempt.watching.stop_gang` write; no process runs (every recorded pid is given a start time
that cannot match, so it reads as gone).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from trainyard.plugins.attempt.evidence import gather
from trainyard.plugins.launch.local import LocalLauncher
from trainyard.plugins.recovery.evidence import Evidence, NodeObservation
from trainyard.plugins.run.heartbeat import Heartbeat, write_heartbeat
from trainyard.plugins.run.model import AgentRecord, RunHandle, RunStatus
from trainyard.plugins.run.records import STOP_REASON_FILE, StopReason

DEAD = -1
"""A start time no process has: `processes.is_alive` reads the pid as gone."""


@dataclass
class Rank:
    exit_code: int | None = 0
    step: int = 10
    restart: int = 0
    log: str = ""
    ended_at: float = 0.0
    """Seconds after the fabricated start (orders the failures)."""
    earlier_exits: list[int] = field(default_factory=list)
    """Exit codes of earlier incarnations (torchrun in-place restarts)."""
    replayed: bool = False
    """The last incarnation only handed back the previous one's exit (`rank_exec.replayed_exit`)."""


def fabricate(root: Path, ranks: list[Rank], *, job: str = "tiny", attempt: int = 0, nodes_per_rank: int = 1,
              agent_exit: int | None = None, stop_reason: str | None = None, stop_after: float = 100.0,
              diverged: dict | None = None, corrupt: dict | None = None, max_restarts: int = 0,
              alive_hung: bool = False, stop_nodes: tuple[str, ...] = ()) -> RunHandle:
    """A finished attempt: one node per `nodes_per_rank` ranks (`local-0`, `local-1`, …)."""
    run_dir = root / job / str(attempt)
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "agents").mkdir()
    beats = run_dir / "heartbeats"
    t0 = time.time() - 1000
    nodes = [f"local-{i}" for i in range((len(ranks) + nodes_per_rank - 1) // nodes_per_rank)]
    codes = [r.exit_code for r in ranks]
    if agent_exit is None and not alive_hung:
        agent_exit = 0 if all(c == 0 for c in codes) else next(c for c in codes if c not in (0, None))
    for node in nodes:
        if agent_exit is not None:
            (run_dir / "agents" / f"{node}.exit.json").write_text(json.dumps(  # as plugins/launch/agent.py
                {"exit_code": agent_exit, "failures": {}, "error": "", "ended_at": t0 + 1, "pid": os.getpid()}))
    for rank, r in enumerate(ranks):
        node = nodes[rank // nodes_per_rank]
        ended = None if r.exit_code is None else t0 + r.ended_at
        record = {"rank": rank, "local_rank": rank % nodes_per_rank, "node": node, "restart": r.restart,
                  "pid": os.getpid(), "pgid": 0, "started_at": t0, "child_pid": os.getpid(),
                  "child_start_ticks": None if alive_hung and r.exit_code is None else DEAD}
        with (run_dir / "exits.jsonl").open("a") as history:
            for restart, code in enumerate(r.earlier_exits):
                history.write(json.dumps({**record, "restart": restart, "exit_code": code,
                                          "ended_at": t0 + restart}) + "\n")
            if r.exit_code is not None:
                record.update(exit_code=r.exit_code, ended_at=ended, **({"replayed": True} if r.replayed else {}))
                history.write(json.dumps(record) + "\n")
        (run_dir / "ranks" / f"rank-{rank:05d}.json").write_text(json.dumps(record))
        (run_dir / "ranks" / f"rank-{rank:05d}.log").write_text(
            f"=== rank {rank} restart {r.restart}\n" + r.log)
        beat_time = time.time() - (900 if alive_hung and r.exit_code is None else 1)
        write_heartbeat(beats, Heartbeat(job=job, attempt=attempt, rank=rank, node=node, pid=os.getpid(),
                                         step=r.step, time=beat_time, hang_timeout_s=60.0, phase="train"))
    if stop_reason is not None:  # `hang: detail` → stop-reason.json as watching.stop_gang writes it
        if stop_reason:
            cause, _, detail = stop_reason.partition(":")
            (run_dir / STOP_REASON_FILE).write_text(StopReason(
                reason=cause, detail=detail.strip(), nodes=stop_nodes, at=t0 + stop_after).model_dump_json())
        (run_dir / "stopped.json").write_text(json.dumps({  # as LocalLauncher.stop writes it
            "requested_at": datetime.fromtimestamp(t0 + stop_after, UTC).isoformat(),
            "requested_at_s": t0 + stop_after, "grace_s": 5.0}))
    if diverged is not None:
        (run_dir / "diverged.json").write_text(json.dumps({  # every field, as the worker writes it
            "job": job, "attempt": attempt, "reason": "non_finite", "loss": "nan", "baseline": None,
            "last_checkpoint_step": None, "message": "", **diverged}))
    if corrupt is not None:
        (run_dir / "checkpoint_corrupt.json").write_text(json.dumps({"job": job, "attempt": attempt, **corrupt}))
    agents = [AgentRecord(node=node, node_rank=i, pid=os.getpid(), pgid=0, start_ticks=None if alive_hung else DEAD,
                          nproc=nodes_per_rank)
              for i, node in enumerate(nodes)]
    handle = RunHandle(kind="local", job=job, attempt=attempt, world_size=len(ranks), run_dir=str(run_dir),
                       heartbeat_dir=str(beats), max_restarts=max_restarts, agents=agents, nodes=nodes,
                       ranks_per_node=nodes_per_rank)
    (run_dir / "handle.json").write_text(handle.model_dump_json())
    return handle


def evidence(root: Path, ranks: list[Rank], *, nodes: list[NodeObservation] = (), run: str = "r-0001",
             resume_from: str = "", **kwargs: object) -> tuple[Evidence, RunStatus]:
    handle = fabricate(root, ranks, **kwargs)
    launcher = LocalLauncher(root)
    status = launcher.poll(handle)
    return gather(handle, status, launcher=launcher, run=run, nodes=nodes, resume_from=resume_from), status
