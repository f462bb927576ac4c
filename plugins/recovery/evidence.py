"""What is known about one attempt once it ended (or while it runs): the `Evidence` that
`classify()` turns into a `FailureReport`.

Everything here is read from what the attempt left behind, so any process can gather it
again later (an Airflow task on another worker, `trainyard status`, a test):

- the launcher's `RunStatus` (state, each rank's exit code, restart count, heartbeat, `hung`);
- the run folder (`plugins/launch/local.py` documents its layout): `exits.jsonl` (every rank
  exit, torchrun's in-place restarts included), `stopped.json` (the launcher was asked to stop
  the gang) and `stop-reason.json` (why the control plane stopped it: `plugins/attempt/watching.py`
  writes it before the stop; no reason = a stop a person asked for), `diverged.json` and
  `checkpoint_corrupt.json` (written by `worker/session.py` before it exits with `DIVERGED` /
  `CHECKPOINT_CORRUPT`), and the tail of each failed rank's log;
- the health of the gang's nodes, as their node agents reported it (`NodeObservation`: a
  `NodeHealth`, or the number of heartbeats the agent has missed in a row). The caller polls
  the agents (a sensor keeps the missed count across polls); `observe_node` is one probe.
  An agent reports every run on its node: `gather` keeps the node's own verdicts (a GPU, the
  node) and this attempt's rank verdicts only — another run's hang is not this one's evidence;

Every run-folder record is parsed with its one model (`plugins/run/records.py`), leniently: a
record a crashed process left half-written is as good as none.

Pure Python: no Airflow, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trainyard.node_agent.models import NodeHealth, RankHeartbeat
from trainyard.plugins.run.heartbeat import FROZEN_AFTER, read_heartbeats
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
from trainyard.plugins.run.rules import MISSED_HEARTBEATS_LOST

LOG_TAIL_LINES = 60
MAX_LOGS = 8
"""Failed ranks whose log tails are read (the first failing rank always among them)."""

OOM_PATTERNS = (re.compile(r"torch\.OutOfMemoryError"), re.compile(r"CUDA out of memory"),
                re.compile(r"torch\.cuda\.OutOfMemoryError"))
"""Log lines that mean the device ran out of memory (a rank may die of it without reaching
the worker's `stop_on_oom`, e.g. during restore or in user code outside the loop)."""

CORRUPT_PATTERNS = (re.compile(r"NoValidCheckpointError"), re.compile(r"does not verify"))
"""Log lines that mean a restore target failed verification."""

STARTUP_ERROR = re.compile(
    r"\b(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|NameError|FileNotFoundError): "
    r"|: error: (unrecognized arguments|the following arguments are required|argument )")
"""A failure of the script itself before it trains: a missing module, a syntax error, a missing
input file, arguments its parser refuses. The same code and inputs fail the same way again."""

_ERROR_LINE = re.compile(r"(Error|Exception|error:|Traceback|Killed|out of memory)", re.I)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


STOP_CAUSES_CANCEL = ("requested", "timeout")
"""`StopReason.reason`s that end the run on purpose: nothing to recover. (A stop without a
`stop-reason.json` counts as `requested`.)"""

FATAL_VERDICTS = ("gpu_failed", "node_unhealthy")
"""Node-agent verdicts that lose the node for this attempt (a thermal warning does not)."""


class NodeObservation(_Record):
    """One node of the gang as the control plane last saw it."""

    node: str
    health: NodeHealth | None = None
    missed_heartbeats: int = 0
    """Polls in a row that the agent did not answer (0 when `health` is fresh)."""
    error: str = ""
    """Why the last poll failed."""

    def about(self, job: str, run: str, attempt: int) -> NodeObservation:
        """This observation as one attempt's evidence (`NodeHealth.about`)."""
        if self.health is None:
            return self
        return self.model_copy(update={"health": self.health.about(job, run, attempt)})

    def fatal_reasons(self, *, max_misses: int = MISSED_HEARTBEATS_LOST) -> list[str]:
        """Why this node is lost, one line each; empty when it is fine."""
        reasons = []
        if self.missed_heartbeats >= max_misses:
            detail = f": {self.error}" if self.error else ""
            reasons.append(f"node agent on {self.node} missed {self.missed_heartbeats} heartbeats{detail}")
        if self.health is not None:
            for v in self.health.verdicts:
                if v.kind in FATAL_VERDICTS:
                    gpu = f" GPU {v.gpu}" if v.gpu is not None else ""
                    xid = f" (Xid {v.xid})" if v.xid is not None else ""
                    reasons.append(f"{self.node}{gpu}: {v.kind}{xid}: {v.reason}")
        return reasons


class Evidence(_Record):
    """Everything `classify()` needs about one attempt."""

    job: str
    run: str = ""
    attempt: int = 0
    status: RunStatus
    gang_nodes: list[str] = Field(default_factory=list)
    """The placement's nodes, in node-rank order."""
    max_restarts_in_place: int = 0
    """torchrun's `--max-restarts` for this attempt."""
    exits: list[RankRecord] = Field(default_factory=list)
    stop: StopRequest | None = None
    stop_reason: StopReason | None = None
    """Why the control plane stopped the gang (`plugins/attempt/watching.py`)."""
    diverged: DivergenceRecord | None = None
    checkpoint_corrupt: CheckpointCorruptRecord | None = None
    log_tails: dict[int, str] = Field(default_factory=dict)
    """Rank → the last lines of its log (failed ranks only)."""
    nodes: list[NodeObservation] = Field(default_factory=list)
    resume_from: str = ""
    """The checkpoint this attempt was told to restore (empty = the newest valid one)."""
    last_beats: dict[int, float] = Field(default_factory=dict)
    """Rank → the time of its last heartbeat (dates a hang: when progress stopped)."""
    last_alive: dict[int, float] = Field(default_factory=dict)
    """Rank → its writer's last sign of life (`Heartbeat.alive_at`): tells a frozen rank from
    the ranks waiting for it (`hung_ranks`)."""
    hang_timeout_s: float | None = None
    """The job's hang timeout, as its heartbeats say."""
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def stop_cause(self) -> str | None:
        """None when nobody stopped the gang; else `StopReason.reason` (`requested` when the
        launcher was stopped without a recorded reason: a person's stop, a Ctrl-C). A stop with
        no reason on an attempt that had already failed is the launcher's clean-up of the
        failed gang (`LocalLauncher.settle`), not a request: None."""
        if self.stop_reason is not None:
            return self.stop_reason.reason
        return "requested" if self.stop is not None and self.status.state == "stopped" else None

    @property
    def restarts_in_place(self) -> int:
        """torchrun's restarts inside this attempt that ran the script again (the fast path): the
        highest restart count any rank reached, leaving out incarnations that only replayed a
        control-plane exit (`RankRecord.replayed`). On Kubernetes a stopped Job takes its pods'
        exit records with it; the ranks' heartbeats, served by the node agents, still say."""
        replayed = {e.restart for e in self.exits if e.replayed}
        counts = ([r.restart for r in self.status.ranks] + [e.restart for e in self.exits]
                  + [b.restart for b in self.served_beats])
        return max((c for c in counts if c not in replayed), default=0)

    @property
    def served_beats(self) -> list[RankHeartbeat]:
        """This attempt's rank heartbeats as the gang's node agents serve them (`nodes`, already
        narrowed to the attempt): what is left to read once a stopped Kubernetes Job took its
        pods' records."""
        return [b for n in self.nodes if n.health is not None for b in n.health.ranks]

    def hung_ranks(self) -> list[int]:
        """The ranks a hang blames. A hang stop names them (`stop-reason.json`, judged when the
        watcher stopped the gang). Else, of the ranks the launcher flags `hung` (every rank of a
        gang stalls once one does), those `trainyard.plugins.run.rules.hang_culprits` blames: the
        frozen ones, judged at the status's time, else the laggards."""
        from trainyard.plugins.run.rules import Stalled, hang_culprits

        if self.stop_reason is not None and self.stop_reason.reason == "hang" and self.stop_reason.ranks:
            return list(self.stop_reason.ranks)
        live = [r for r in self.status.ranks if r.hung or (r.pid is not None and r.exit_code is None)]
        at, timeout = self.status.updated_at.timestamp(), self.hang_timeout_s
        return hang_culprits(Stalled(r.rank, r.step, None if r.rank not in self.last_alive or timeout is None
                                     else at - self.last_alive[r.rank] > FROZEN_AFTER * timeout, r.hung,
                                     r.signal == "activity")
                             for r in live)

    def first_failure(self) -> RankRecord | None:
        """The earliest non-zero exit of the attempt's last incarnation (torchrun restarts
        before it were recovered in place)."""
        last = self.restarts_in_place
        failed = [e for e in self.exits if e.exit_code not in (None, 0) and e.restart == last]
        return min(failed, key=lambda e: e.ended_at or 0.0) if failed else None


def gather(handle: RunHandle, status: RunStatus, *, run: str = "",
           nodes: Iterable[NodeObservation] = (), resume_from: str = "",
           tail_lines: int = LOG_TAIL_LINES) -> Evidence:
    """The evidence of the attempt `handle` names, from its run folder and `status`.

    `status` is the launcher's poll (after `settle`, for a finished attempt). Works for local
    handles; for a Kubernetes handle only the status and the node observations are known
    (partial: pod logs and worker records are not fetched yet).
    """
    run_dir = Path(handle.run_dir) if handle.run_dir else None
    exits = list(read_exits(run_dir)) if run_dir else []
    failed = _failed_ranks(status, exits)
    run = run or getattr(handle, "run", "") or ""
    beats = read_heartbeats(handle.heartbeat_dir, range(handle.world_size)) if handle.heartbeat_dir else {}

    def record(name: str, model: type[BaseModel]) -> Any:
        return read_model(run_dir / name, model, lenient=True) if run_dir else None

    return Evidence(
        job=handle.job, run=run, attempt=handle.attempt,
        status=status, gang_nodes=list(handle.nodes) or [a.node for a in handle.agents],
        max_restarts_in_place=handle.max_restarts, exits=exits,
        stop=record(STOPPED_FILE, StopRequest), stop_reason=record(STOP_REASON_FILE, StopReason),
        diverged=record(DIVERGED_FILE, DivergenceRecord),
        checkpoint_corrupt=record(CHECKPOINT_CORRUPT_FILE, CheckpointCorruptRecord),
        log_tails=_log_tails(run_dir, failed, tail_lines) if run_dir else {},
        nodes=[o.about(handle.job, run, handle.attempt) for o in nodes], resume_from=resume_from,
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


def find_line(text: str, patterns: Iterable[re.Pattern[str]]) -> str:
    """The last line of `text` that matches one of `patterns`, stripped ('' when none)."""
    for line in reversed(text.splitlines()):
        if any(p.search(line) for p in patterns):
            return line.strip()
    return ""


def telling_line(text: str) -> str:
    """The line a person should read first: the last error-looking line ('' when none — the
    last ordinary line of a killed rank says nothing about why it died)."""
    return find_line(text, (_ERROR_LINE,))


def _failed_ranks(status: RunStatus, exits: list[RankRecord]) -> list[int]:
    ranks = [status.failed_rank] if status.failed_rank is not None else []
    ranks += [r.rank for r in status.ranks if r.exit_code not in (None, 0)]
    ranks += [e.rank for e in exits if e.exit_code not in (None, 0)]
    return list(dict.fromkeys(ranks))[:MAX_LOGS]


def _log_tails(run_dir: Path, ranks: list[int], lines: int) -> dict[int, str]:
    from trainyard.plugins.launch.local import tail_lines
    from trainyard.plugins.launch.rank_exec import log_path

    tails = {rank: tail_lines(log_path(run_dir, rank), lines) for rank in ranks}
    return {rank: text for rank, text in tails.items() if text}


def utc_from_s(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds else None
