"""Gathering what one attempt left behind into the `Evidence` that recovery classifies
(`plugins/recovery/evidence.py` holds the values; here is all the I/O).

Everything here is read from what the attempt left behind, so any process can gather it
again later (an Airflow task on another worker, `trainyard status`, a test):

- the launcher's `RunStatus` (the caller's poll, after `settle` for a finished attempt);
- the run folder (`plugins/launch/local.py` documents its layout): `exits.jsonl` (every rank
  exit, torchrun's in-place restarts included), `stopped.json` (the launcher was asked to stop
  the gang) and `stop-reason.json` (why the control plane stopped it: `plugins/attempt/watching.py`
  writes it before the stop; no reason = a stop a person asked for), `diverged.json` and
  `checkpoint_corrupt.json` (written by `worker/session.py` before it exits with `DIVERGED` /
  `CHECKPOINT_CORRUPT`), and the ranks' heartbeat files;
- the tail of each failed rank's log, through the `Launcher` protocol's `logs` — the same call
  for every launcher, so a Kubernetes attempt's evidence has its pods' logs too;
- the health of the gang's nodes, as their node agents reported it (`NodeObservation`: a
  `NodeHealth`, or the number of heartbeats the agent has missed in a row). The caller polls
  the agents (a sensor keeps the missed count across polls); `observe_node` is one probe.
  An agent reports every run on its node: `gather` keeps the node's own verdicts (a GPU, the
  node) and this attempt's rank verdicts only — another run's hang is not this one's evidence.

Every run-folder record is parsed with its one model (`plugins/run/records.py`), leniently: a
record a crashed process left half-written is as good as none; so is a log that cannot be read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from trainyard.plugins.recovery.evidence import Evidence, NodeObservation
from trainyard.plugins.run.heartbeat import read_heartbeats
from trainyard.plugins.run.model import RunHandle, RunStatus
from trainyard.plugins.run.records import (
    CHECKPOINT_CORRUPT_FILE,
    DIVERGED_FILE,
    STOP_REASON_FILE,
    STOPPED_FILE,
    CheckpointCorruptRecord,
    DivergenceRecord,
    RankRecord,
    StopReason,
    StopRequest,
    read_exits,
    read_model,
)

if TYPE_CHECKING:
    from trainyard.plugins.launch.base import Launcher

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 60
MAX_LOGS = 8
"""Failed ranks whose log tails are read (the first failing rank always among them)."""


def gather(handle: RunHandle, status: RunStatus, *, launcher: Launcher, run: str = "",
           nodes: Iterable[NodeObservation] = (), resume_from: str = "",
           tail_lines: int = LOG_TAIL_LINES) -> Evidence:
    """The evidence of the attempt `handle` names, from its run folder, `status`, and the failed
    ranks' logs as `launcher` (the handle's own, `launcher_for(handle, …)`) serves them.

    `status` is the launcher's poll (after `settle`, for a finished attempt). Run-folder records
    exist where the handle has a run folder (local); a Kubernetes handle's evidence is its
    status, its pods' logs and the node observations.
    """
    run_dir = Path(handle.run_dir) if handle.run_dir else None
    exits = list(read_exits(run_dir)) if run_dir else []
    failed = _failed_ranks(status, exits)
    run = run or handle.run
    beats = read_heartbeats(handle.heartbeat_dir, range(handle.world_size)) if handle.heartbeat_dir else {}

    def record(name: str, model: type[BaseModel]) -> Any:
        return read_model(run_dir / name, model, lenient=True) if run_dir else None

    return Evidence(
        job=handle.job, run=run, attempt=handle.attempt,
        status=status, gang_nodes=handle.bound(status).gang_nodes,
        max_restarts_in_place=handle.max_restarts, exits=exits,
        stop=record(STOPPED_FILE, StopRequest), stop_reason=record(STOP_REASON_FILE, StopReason),
        diverged=record(DIVERGED_FILE, DivergenceRecord),
        checkpoint_corrupt=record(CHECKPOINT_CORRUPT_FILE, CheckpointCorruptRecord),
        log_tails=_log_tails(launcher, handle, failed, tail_lines),
        nodes=[about(o, handle.job, run, handle.attempt) for o in nodes], resume_from=resume_from,
        started_at=handle.created_at, last_beats={rank: b.time for rank, b in beats.items()},
        last_alive={rank: b.alive_at for rank, b in beats.items() if b.alive_at is not None},
        hang_timeout_s=next((b.hang_timeout_s for b in beats.values()), None),
        ended_at=status.updated_at if status.finished else None,
    )


def observe_node(node: str, url: str, *, missed_before: int = 0, timeout: float = 5.0) -> NodeObservation:
    """Poll one node agent once: its health, or one more missed heartbeat."""
    from trainyard.node_agent.client import AgentResponseError, AgentUnreachable, fetch_health

    try:
        return NodeObservation(node=node, health=fetch_health(url, timeout=timeout))
    except AgentUnreachable as e:
        return NodeObservation(node=node, missed_heartbeats=missed_before + 1, error=str(e))
    except AgentResponseError as e:  # it answered: alive, but says nothing usable
        return NodeObservation(node=node, error=str(e))


def about(observation: NodeObservation, job: str, run: str, attempt: int) -> NodeObservation:
    """`observation` as one attempt's evidence (`NodeHealth.about`: the node's own verdicts and
    this attempt's rank verdicts only)."""
    if observation.health is None:
        return observation
    return observation.model_copy(update={"health": observation.health.about(job, run, attempt)})


def _failed_ranks(status: RunStatus, exits: list[RankRecord]) -> list[int]:
    ranks = [status.failed_rank] if status.failed_rank is not None else []
    ranks += [r.rank for r in status.ranks if r.exit_code not in (None, 0)]
    ranks += [e.rank for e in exits if e.exit_code not in (None, 0)]
    return list(dict.fromkeys(ranks))[:MAX_LOGS]


def _log_tails(launcher: Launcher, handle: RunHandle, ranks: list[int], lines: int) -> dict[int, str]:
    """Rank → the last `lines` of its log, for each of `ranks` whose log says anything."""
    tails = {}
    for rank in ranks:
        try:
            text = launcher.logs(handle, rank, lines)
        except Exception as e:  # noqa: BLE001 — evidence is lenient: an unreadable log is as good as none
            log.warning("could not read rank %s's log of %s attempt %s: %s", rank, handle.job, handle.attempt, e)
            continue
        if text:
            tails[rank] = text
    return tails
