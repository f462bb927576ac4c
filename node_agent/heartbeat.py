"""The per-rank heartbeat file: written by the worker runtime every step, read by the node
agent and the control plane's sensors (DESIGN §8).

A heartbeat is a small JSON file, `<heartbeat_dir>/rank-<NNNNN>.json`, replaced atomically
(write a temp file in the same folder, then `os.replace`), so a reader sees the old or the new
version, never half of one. Readers must still tolerate garbage (a disk full, a foreign file)
and skip it with a warning.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

FILE_PATTERN = "rank-*.json"


def heartbeat_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank:05d}.json"


class Heartbeat(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    job: str
    run: str = ""
    """The training run (one trigger of the job), so two runs of a job never look alike."""
    attempt: int = 0
    rank: int
    local_rank: int = 0
    node: str = ""
    pid: int
    step: int
    time: float
    """Unix time of the write."""
    loss: float | None = None
    tokens_per_s: float | None = None
    nan: bool = False
    """The loss of this step was NaN or infinite."""
    hang_timeout_s: float = 600.0
    """The job's `faultTolerance.hangTimeout`: older than this means hung."""
    phase: str = "train"
    """`start`, `restore`, `train`, `checkpoint`, `done`, `diverged`."""
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


def write_heartbeat(directory: str | Path, beat: Heartbeat) -> Path:
    """Atomically replace this rank's heartbeat file (`plugins.files.write_atomic`)."""
    from plugins.files import write_atomic

    return write_atomic(heartbeat_path(directory, beat.rank), beat.model_dump_json())
