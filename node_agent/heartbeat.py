"""The per-rank heartbeat file: written by the worker runtime every step, read by the node
agent and the control plane's sensors (DESIGN §8).

A heartbeat is a small JSON file, `<heartbeat_dir>/rank-<NNNNN>.json`, replaced atomically
(write a temp file in the same folder, then `os.replace`), so a reader sees the old or the new
version, never half of one. Readers must still tolerate garbage (a disk full, a foreign file)
and skip it with a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    """The data pipeline's figures (`plugins.data.reader`) a rank reports beside its step: in its
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


def write_heartbeat(directory: str | Path, beat: Heartbeat) -> Path:
    """Atomically replace this rank's heartbeat file (`plugins.files.write_atomic`)."""
    from plugins.files import write_atomic

    return write_atomic(heartbeat_path(directory, beat.rank), beat.model_dump_json())
