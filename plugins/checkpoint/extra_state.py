"""Each rank's extra state: step, RNG states, and the `state_dict()` of every extra object
(LR scheduler, sampler) — one JSON file per rank, `extra/rank-NNNNN.json`, never a pickle.

Per rank because RNG states differ between ranks. When a checkpoint is restored on more ranks
than wrote it, rank r takes the file of rank r mod (saved world size), and says so: exact
resumption is promised for an unchanged world size only (DESIGN §5).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from trainyard.plugins.checkpoint import state_json
from trainyard.plugins.checkpoint.manifest import CheckpointManifest
from trainyard.plugins.checkpoint.rng import capture_rng_state, restore_rng_state

log = logging.getLogger(__name__)

EXTRA_FORMAT = 1


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


def extra_state_path(rank: int) -> str:
    return f"extra/rank-{rank:05d}.json"


def encode_extra_state(*, job: str, step: int, rank: int, world_size: int,
                       extra: Mapping[str, Any] | None) -> bytes:
    """Snapshot (now, in the caller's thread) RNGs and every extra object's state as JSON."""
    states: dict[str, Any] = {}
    for name, obj in (extra or {}).items():
        if not callable(getattr(obj, "state_dict", None)):
            raise TypeError(f"extra[{name!r}] ({type(obj).__name__}) has no state_dict()")
        states[name] = obj.state_dict()
    return state_json.dumps({
        "format_version": EXTRA_FORMAT, "job": job, "step": step, "rank": rank,
        "world_size": world_size, "rng": capture_rng_state(), "state": states,
    })


def extra_file_for(manifest: CheckpointManifest, rank: int) -> str:
    """Which rank's extra-state file `rank` restores from this checkpoint."""
    mine = extra_state_path(rank)
    if mine in manifest.extra_state:
        return mine
    source = rank % manifest.world_size
    log.warning("checkpoint step %d was written by %d ranks; rank %d restores the extra state "
                "(RNG, sampler, scheduler) of rank %d", manifest.step, manifest.world_size, rank,
                source)
    return extra_state_path(source)


def apply_extra_state(data: bytes, extra: Mapping[str, Stateful] | None, step: int) -> None:
    """Restore RNG states and load each extra object's saved state."""
    blob = state_json.loads(data)
    restore_rng_state(blob["rng"])
    saved = blob.get("state", {})
    for name, obj in (extra or {}).items():
        if name in saved:
            obj.load_state_dict(saved[name])
        else:
            log.warning("checkpoint step %d has no state for extra[%r]; left as is", step, name)
