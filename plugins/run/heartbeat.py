"""The per-rank heartbeat file: written by the worker runtime for its newest step (at most every
`write_interval_s`), read by the node agent and the control plane's sensors (DESIGN §8).

A heartbeat is a small JSON file, `<heartbeat_dir>/rank-<NNNNN>.json`, replaced atomically
(write a temp file in the same folder, then `os.replace`), so a reader sees the old or the new
version, never half of one. Readers must still tolerate garbage (a disk full, a foreign file)
and skip it with a warning.

Two clocks, because a hang has a victim and a culprit. `time` is the rank's last step: no
progress for `hang_timeout_s` is a hang. `alive_at` is the writer's last sign of life: the
worker's writer thread rewrites the beat every `pulse_interval_s` whatever the training
thread does, so a rank blocked in a collective, waiting for a peer, keeps a fresh `alive_at`
while a rank that is stopped (SIGSTOP, a debugger) or stuck holding the interpreter does not.
`hang_culprits` (`trainyard.node_agent.verdicts`) blames the second kind. `pid_ns` names the writer's
PID namespace, so an agent that shares it can tell a rank whose process is gone (a cancelled or
crashed run: nothing to hang) from one that is alive and stuck.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

FILE_PATTERN = "rank-*.json"

MAX_STEP = 10**15
"""Far past any training run, and exact as a float: a Prometheus sample is a float64, and a
400-digit integer (valid JSON) would overflow `float()` and break every scrape of the node."""
MAX_TIME = 1e11
"""Unix seconds, year ~5100: anything larger is not a clock reading."""
Name = Annotated[str, Field(max_length=253)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
"""Any finite float64 renders as a Prometheus sample; NaN/inf are said with `nan`."""


def heartbeat_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank:05d}.json"


class DataFigures(BaseModel):
    """The data pipeline's figures (`trainyard.plugins.data.reader`) a rank reports beside its step: in its
    heartbeat file and, passed through as they are, in the node agent's report of it."""

    data_stall_s: float | None = None
    """Seconds the last step waited for its batch."""
    prefetch_depth: float | None = None
    """Batches ready in the data reader's queue after the last step."""
    cache_hit_rate: float | None = None
    """Share of shard opens served by the node's data cache (this process, cumulative)."""
    cache_hits: float | None = None
    cache_misses: float | None = None
    cache_bytes_fetched: float | None = None
    cache_evictions: float | None = None


DATA_FIELDS: tuple[str, ...] = tuple(DataFigures.model_fields)


class Heartbeat(DataFigures):
    """One rank's last step. Values are bounded (types, ranges, sizes): the file is written by
    user training code's process and read by the node agent, whose `/metrics` must keep
    answering whatever one file says; a file outside the bounds is skipped and named."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    job: Name = Field(min_length=1)
    run: str = Field(default="", max_length=63)
    """The training run (one trigger of the job), so two runs of a job never look alike."""
    attempt: int = Field(default=0, ge=0, le=1_000_000)
    rank: int = Field(ge=0, le=10_000_000)
    local_rank: int = Field(default=0, ge=0, le=1_000_000)
    node: Name = ""
    pid: int = Field(ge=0, le=2**31)
    step: int = Field(ge=0, le=MAX_STEP)
    time: float = Field(ge=0, le=MAX_TIME, allow_inf_nan=False)
    """Unix time of the write."""
    loss: float | None = None
    """NaN/inf allowed (an older or hand-written loop; the agent flags them): Prometheus
    renders them. An integer too large for a float64 is refused by the parser."""
    tokens_per_s: Finite | None = None
    nan: bool = False
    """The loss of this step was NaN or infinite."""
    hang_timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    """The job's `faultTolerance.hangTimeout`: older than this means hung."""
    phase: str = Field(default="train", max_length=32)
    """`start`, `restore`, `train`, `checkpoint`, `done`, `diverged`."""
    alive_at: float | None = Field(default=None, ge=0, le=MAX_TIME, allow_inf_nan=False)
    """Unix time of the file's last write (`write_heartbeat` stamps it): the writer's sign of
    life, refreshed between steps by the worker's writer thread. None from an older writer."""
    restart: int = Field(default=0, ge=0, le=1_000_000)
    """torchrun's in-place restarts of the gang before this incarnation, agreed by its ranks
    (`TrainingSession.restart`); 0 from a writer that does not say."""
    pid_ns: str = Field(default="", max_length=64)
    """The writer's PID namespace (`pid:[4026531836]`; `write_heartbeat` stamps it): `pid` means
    something to a reader only in the same one. Empty: unknown."""
    signal: Literal["steps", "activity"] = "steps"
    """What dates `time`: `steps`, the rank's own last step (a managed script); `activity`, the
    last moment its CPU time or I/O moved, written for a plain script by its rank wrapper
    (`trainyard.plugins.launch.activity`), whose `step` means nothing."""

    @property
    def progress_step(self) -> int | None:
        """The rank's step, None where the beat does not know it (`signal: activity`)."""
        return self.step if self.signal == "steps" else None

    def frozen(self, now: float) -> bool | None:
        """No sign of life for `FROZEN_AFTER` of the hang timeout: the whole process is stopped,
        not only its training thread. None when the writer does not say (`alive_at` unset)."""
        if self.alive_at is None:
            return None
        return now - self.alive_at > FROZEN_AFTER * self.hang_timeout_s


PULSE_EVERY_S = 5.0
"""Longest pause between two writes of a live rank's heartbeat (`pulse_interval_s`)."""
FROZEN_AFTER = 0.5
"""Share of the hang timeout without any write after which a rank counts as frozen: at least
five missed pulses (`pulse_interval_s` is at most a tenth of the timeout), and well before the
timeout itself, so by the time a hang is declared the culprit and the waiting ranks differ."""


WRITE_EVERY_S = 1.0
"""Longest wait of a new step's beat for the writer thread (`write_interval_s`)."""


def pulse_interval_s(hang_timeout_s: float) -> float:
    """How often the worker's writer thread rewrites the beat while no new step comes."""
    return min(PULSE_EVERY_S, hang_timeout_s / 10)


def write_interval_s(hang_timeout_s: float) -> float:
    """How often, at most, the worker's writer thread writes a new step's beat (the newest one;
    those in between are skipped): every `WRITE_EVERY_S`, or half a pulse for a short timeout.
    A beat reaches the file at most this long after its step — at most a twentieth of the
    timeout, which the hang rule absorbs — and the write's cost no longer scales with the step
    rate (`trainyard.worker.heartbeats`)."""
    return min(WRITE_EVERY_S, pulse_interval_s(hang_timeout_s) / 2)


@functools.cache
def own_pid_namespace() -> str:
    """This process's PID namespace (`/proc/self/ns/pid`), '' where it cannot be read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def read_heartbeats(directory: str | Path, ranks: Iterable[int]) -> dict[int, Heartbeat]:
    """The beats of `ranks` found in `directory` (rank → beat); a missing or unreadable file is
    left out (a rank that never beat, a half-written foreign file)."""
    from pydantic import ValidationError

    beats = {}
    for rank in ranks:
        try:
            beats[rank] = Heartbeat.model_validate_json(heartbeat_path(directory, rank).read_bytes())
        except (OSError, ValidationError):
            continue
    return beats


def write_heartbeat(directory: str | Path, beat: Heartbeat) -> Path:
    """Atomically replace this rank's heartbeat file (`trainyard.plugins.files.write_atomic`), stamped
    with the time of this write (`alive_at`) and, unless set, this process's PID namespace."""
    import time

    from trainyard.plugins.files import write_atomic

    stamped = beat.model_copy(update={"alive_at": time.time(), "pid_ns": beat.pid_ns or own_pid_namespace()})
    return write_atomic(heartbeat_path(directory, beat.rank), stamped.model_dump_json())
