"""The files the processes of a run write for one another, as pydantic models — their one home:
the worker, the launchers and recovery all import them from here.

    <run_dir>/ranks/rank-NNNNN.json    `RankRecord`   rank_exec → the launcher (poll, stop)
    <run_dir>/exits.jsonl              `RankRecord`s  every rank exit, restarts included
    <run_dir>/agents/<node>.exit.json  `AgentExit`    the torchrun agent → the launcher
    <run_dir>/stopped.json             `StopRequest`  `stop()` → a later `poll()`
    <run_dir>/stop-reason.json         `StopReason`   the control plane → `classify` (why it stopped the gang)
    <run_dir>/diverged.json            `DivergenceRecord`  rank 0 of the worker → recovery
    <run_dir>/checkpoint_corrupt.json  `CheckpointCorruptRecord`  rank 0 of the worker → recovery
    <run_dir>/handle.json              `RunHandle`    the launcher → any later process

Every file is written whole with `trainyard.plugins.files.write_atomic`. Readers parse through the
model, so a missing or changed field fails loudly in one place instead of as a `KeyError`
deep in the launcher; `read_model(..., missing_ok=...)` is the one reader.

`rank_exec.py` runs once per rank before the training process starts, so it stays standard
library only: importing pydantic and building a model costs ~0.15-0.3 s per rank here
(measured with `python -X importtime`; the wrapper itself starts in ~0.05 s). It writes plain
JSON with the field names below and the launcher validates it with `RankRecord`; a test runs
the real wrapper and parses its output with the model (extra fields forbidden), so the two
cannot drift apart.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainyard.plugins.files import write_atomic

M = TypeVar("M", bound=BaseModel)

DIVERGED_FILE = "diverged.json"
STOPPED_FILE = "stopped.json"
EXITS_FILE = "exits.jsonl"
STOP_REASON_FILE = "stop-reason.json"
CHECKPOINT_CORRUPT_FILE = "checkpoint_corrupt.json"


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def write(self, path: Path) -> Path:
        return write_atomic(path, self.model_dump_json(indent=2))


class RankRecord(_File):
    """One rank's wrapper and training process (written by `rank_exec` at start and exit)."""

    rank: int
    local_rank: int = 0
    node: str = ""
    restart: int = 0
    """torchrun's restart count when this process started (`TORCHELASTIC_RESTART_COUNT`)."""
    pid: int
    """The wrapper's pid."""
    pgid: int
    """The wrapper's process group (torchrun signals it); it holds the training process too,
    unless that was `forked` by the attempt's zygote."""
    started_at: float
    child_pid: int | None = None
    """The training process's pid."""
    child_start_ticks: int | None = None
    """Its start time in clock ticks (`/proc/<pid>/stat` field 22): tells pid reuse apart."""
    forked: bool = False
    """The training process was forked by the attempt's warm zygote (`rank_zygote`): a session of
    its own, which the wrapper passes signals on to."""
    exit_code: int | None = None
    """Set when the training process ends; negative = killed by that signal."""
    ended_at: float | None = None
    replayed: bool = False
    """The script was not run: this incarnation handed back the previous one's control-plane
    exit code (`rank_exec.replayed_exit`), so it is not an in-place restart that recovered."""


class AgentExit(_File):
    """How one torchrun agent ended (written by `agent.py` in its `finally`)."""

    exit_code: int
    failures: dict[str, int] = {}
    """Global rank → exit code of the ranks torchrun saw fail (`ChildFailedError.failures`)."""
    error: str = ""
    ended_at: float
    pid: int


class StopRequest(_File):
    """That someone asked the run to stop, and when (a later failure is then not a failure)."""

    requested_at: str
    """ISO 8601, for people."""
    requested_at_s: float
    grace_s: float


class StopReason(_File):
    """Why the control plane stopped a gang (written before the stop, read by `classify`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: Literal["hang", "node_lost", "requested", "lease_lost", "timeout", "preempted"]
    """`preempted`: a higher-priority gang needed the devices (`plugins/attempt/preempt.py`)."""
    detail: str
    nodes: list[str] = Field(default_factory=list)
    ranks: list[int] = Field(default_factory=list)
    at: float = Field(default_factory=time.time)
    since: float | None = None
    """When the failure began, where the stopper dates it and the evidence cannot (a node lost
    to silence: its agent's last answer); None otherwise."""


class CheckpointCorruptRecord(_File):
    """Rank 0 before it exits with `CHECKPOINT_CORRUPT`: the explicit resume point (empty =
    the newest valid one) and why the restore failed."""

    job: str
    attempt: int
    resume_from: str = ""
    reason: str


class DivergenceRecord(_File):
    """Why the worker stopped a diverged run, and from where recovery should roll back."""

    job: str
    attempt: int
    step: int
    """The step at which the verdict was reached."""
    onset_step: int
    """First step of the bad run: roll back to a checkpoint before it."""
    reason: Literal["non_finite", "above_baseline"]
    loss: str
    """`repr` of the loss (`nan` and `inf` are not JSON numbers)."""
    baseline: float | None
    last_checkpoint_step: int | None
    """The newest checkpoint this attempt saved (it may be past the onset)."""
    message: str


def read_model(path: Path, model: type[M], *, lenient: bool = False) -> M | None:
    """`model` parsed from `path`; None when the file does not exist (yet). A file that exists
    but does not parse raises `pydantic.ValidationError` naming the field — or, `lenient`, is
    None too (recovery reads what a crashed process may have left half-written: no verdict
    beats a crash of the classifier)."""
    try:
        return model.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError):
        if lenient:
            return None
        raise


def read_rank_records(run_dir: Path) -> dict[int, RankRecord]:
    """The latest record of every rank that has started."""
    records: dict[int, RankRecord] = {}
    for path in sorted((run_dir / "ranks").glob("rank-*.json")):
        record = read_model(path, RankRecord)
        if record is not None:
            records[record.rank] = record
    return records


def read_exits(run_dir: Path) -> Iterator[RankRecord]:
    """Every rank exit of the run in order, restarts included (`exits.jsonl`); a line cut short
    by a crash mid-write is skipped."""
    try:
        lines = (run_dir / EXITS_FILE).read_text().splitlines()
    except OSError:
        return
    for line in lines:
        if line.strip():
            try:
                yield RankRecord.model_validate_json(line)
            except ValidationError:
                continue
