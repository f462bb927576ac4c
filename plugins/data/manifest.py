"""The shard manifest: which objects a run reads, listed once per run and kept in its checkpoints.

A run lists its dataset's prefix once and keeps (key, size, etag) of every shard. Everything
the reader does afterwards — the epoch's shard order, cache fills, integrity checks — is a
function of this list, and the list travels in the sampler state of every checkpoint, so a
resume reads the same data even when shards were added to (or renamed in) the prefix since.
A shard of the manifest that is gone or was overwritten stops the run with its name
(`ShardGoneError`), instead of silently training on other data.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from trainyard.plugins.errors import FatalError

if TYPE_CHECKING:
    from trainyard.plugins.storage.store import ObjectStore


class ShardGoneError(FatalError, FileNotFoundError):
    """A shard of the run's manifest is missing from the store, or was overwritten."""


class ShardEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    size: int
    etag: str | None = None


class ShardManifest(BaseModel):
    """The shards of one run's dataset, in key order (the order that defines the data)."""

    model_config = ConfigDict(frozen=True)

    uri: str
    """The dataset's root (the store's URI)."""
    format: str
    shards: tuple[ShardEntry, ...]

    @property
    def digest(self) -> str:
        """SHA-256 over (key, size, etag) of every shard: equal digests, equal data."""
        h = hashlib.sha256(f"{self.format}\n".encode())
        for s in self.shards:
            h.update(f"{s.key}\t{s.size}\t{s.etag or ''}\n".encode())
        return h.hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    def gone(self, shard: ShardEntry, why: str) -> ShardGoneError:
        return ShardGoneError(
            f"shard {shard.key!r} of {self.uri} (in this run's manifest {self.digest[:12]}, "
            f"{len(self.shards)} shards) {why}: it was deleted or overwritten after the run "
            "listed it. Restore the object, or start a new run (which lists the prefix again).")


def list_manifest(store: ObjectStore, fmt: str) -> ShardManifest:
    """List the dataset's shards now (`trainyard.plugins.data.shards.list_shards`); refuses an empty one."""
    from trainyard.plugins.data.shards import list_shards

    shards = tuple(ShardEntry(key=o.key, size=o.size, etag=o.etag) for o in list_shards(store, fmt))
    if not shards:
        raise FileNotFoundError(f"no {fmt} shards under {store.uri}")
    return ShardManifest(uri=store.uri.rstrip("/"), format=fmt, shards=shards)
