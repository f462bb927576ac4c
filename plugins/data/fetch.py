"""A shard read straight from the store as a stream of ranged GETs, a few chunks in flight.

A reader that keeps a shard's *token ids* in the node cache has no use for a second, raw copy:
writing it would cost as much as parsing (new pages of a file are the most expensive bytes a
node writes) and would take half the cache's room. So sequential formats (JSONL, text, and
their zstd forms) are parsed as they arrive: `ShardStream` asks for the shard's consecutive
`chunk_bytes` ranges over the cache's connection pool, `ahead` of them at once (so the
connections stay busy while the parser works), each with the manifest's ETag as `If-Match` so
a shard overwritten mid-read is not stitched from two versions, and hands them to the parser
in order. Memory: `ahead + 1` chunks. A shard of one chunk is one GET, made by the reader's own
thread (`open_stream`). Parquet needs random access and goes through the cache's raw copy
instead (`ShardCache.open`).

A shard gone or changed since the run listed it raises the manifest's `ShardGoneError` naming
it — here and in `ShardCache`, through `shard_errors`.
"""

from __future__ import annotations

import contextlib
import io
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.plugins.data.manifest import ShardEntry, ShardManifest
    from trainyard.plugins.storage.store import ObjectStore


@contextlib.contextmanager
def shard_errors(manifest: ShardManifest, shard: ShardEntry) -> Iterator[None]:
    """The store's not-found and precondition errors as the manifest's `ShardGoneError`."""
    from trainyard.plugins.storage.errors import IntegrityError, ObjectNotFoundError

    try:
        yield
    except ObjectNotFoundError as e:
        raise manifest.gone(shard, "is missing from the store") from e
    except IntegrityError as e:
        raise manifest.gone(shard, "has changed in the store") from e


def read_chunk(store: ObjectStore, manifest: ShardManifest, shard: ShardEntry, offset: int, length: int) -> bytes:
    """One ranged GET of the shard, `If-Match` its listed ETag: the store's errors as the
    manifest's `ShardGoneError`, and fewer bytes than asked (the object shrank) named too."""
    with shard_errors(manifest, shard):
        data = store.read_range(shard.key, offset, length, if_match=shard.etag)
    if len(data) != length:
        raise manifest.gone(shard, f"now has fewer bytes than the listed {shard.size}")
    return data


class ShardStream(io.RawIOBase):
    """The shard's bytes in order (see the module docstring); wrap in `io.BufferedReader` to
    iterate lines. `on_bytes` is told the size of each chunk as it is handed over."""

    def __init__(self, store: ObjectStore, manifest: ShardManifest, shard: ShardEntry, pool: Executor, *,
                 chunk_bytes: int, ahead: int = 2, on_bytes: Callable[[int], None] | None = None) -> None:
        super().__init__()
        self.store, self.manifest, self.shard, self.pool = store, manifest, shard, pool
        self.chunk_bytes, self.ahead, self.on_bytes = chunk_bytes, max(1, ahead), on_bytes
        self._offsets = iter(range(0, shard.size, chunk_bytes))
        self._in_flight: deque[Future[bytes]] = deque()
        self._chunk = memoryview(b"")
        self._fill()

    def _fill(self) -> None:
        while len(self._in_flight) < self.ahead:
            offset = next(self._offsets, None)
            if offset is None:
                return
            length = min(self.chunk_bytes, self.shard.size - offset)
            self._in_flight.append(self.pool.submit(read_chunk, self.store, self.manifest, self.shard, offset, length))

    def _next_chunk(self) -> bool:
        if not self._in_flight:
            return False  # every chunk arrived whole (`read_chunk`): the listed size, all of it
        data = self._in_flight.popleft().result()
        if self.on_bytes is not None:
            self.on_bytes(len(data))
        self._chunk = memoryview(data)
        self._fill()
        return True

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._chunk:
            if not self._next_chunk():
                return 0
        n = min(len(buffer), len(self._chunk))
        buffer[:n] = self._chunk[:n]
        self._chunk = self._chunk[n:]
        return n

    def close(self) -> None:
        for future in self._in_flight:
            future.cancel()
        self._in_flight.clear()
        self._chunk = memoryview(b"")
        super().close()


def open_stream(store: ObjectStore, manifest: ShardManifest, shard: ShardEntry, pool: Executor, *,
                chunk_bytes: int, ahead: int = 2,
                on_bytes: Callable[[int], None] | None = None) -> IO[bytes]:
    """`ShardStream` buffered, so lines iterate at C speed — or, for a shard of one chunk, that
    chunk fetched now by the calling thread: with nothing to overlap, the hand-off to the pool
    and the copy into a buffer are pure cost (the reader's prefetch threads already run several
    shards at once)."""
    if shard.size <= chunk_bytes:
        data = read_chunk(store, manifest, shard, 0, shard.size)
        if on_bytes is not None:
            on_bytes(len(data))
        return io.BytesIO(data)
    raw = ShardStream(store, manifest, shard, pool, chunk_bytes=chunk_bytes, ahead=ahead, on_bytes=on_bytes)
    return io.BufferedReader(raw, buffer_size=min(chunk_bytes, 1 << 20))
