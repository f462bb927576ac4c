"""A checkpoint file written with O_DIRECT and hashed while the disk writes it.

A buffered write makes the kernel copy every byte into freshly allocated page-cache pages: on
the 2-core development machine that copy cost as much CPU as the SHA-256 of the same bytes
(the hash is BLAKE3 now, `manifest.HASH_ALGORITHM`, about twice as fast per core),
and with one core per rank the two could not overlap, so a hashed save reached half the
disk's rate. With O_DIRECT the disk reads the bytes from our memory itself (DMA) and the
write costs the CPU almost nothing; the CPU is left to copy each piece into a page-aligned
chunk and hash it while the disk writes the previous one. Two processes each hashing and
writing 200 MB on the development machine: ~1,650 MB/s together instead of ~950 buffered (a
one-off test; `benchmarks/checkpoint.py` measures the whole save against the disk).

O_DIRECT wants the buffer, the file offset and the length aligned to the device's block.
The chunks are anonymous `mmap`s (page-aligned) written at multiples of their size; only the
file's last piece is short, so it is zero-padded to `ALIGN` and the file is truncated back to
its true size afterwards. Where the file system refuses O_DIRECT (at `open`, or at the first
write), the same stream clears the flag and goes on buffered: slower, never wrong.

Used only where the written file is the stored one (a local store adopts it by rename): a
file that will be uploaded is read again right away and is better left in the page cache.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import mmap
import os
import queue
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from trainyard.plugins.checkpoint.manifest import HASH_ALGORITHM
from trainyard.plugins.storage.store import HashAlgorithm, new_hasher

CHUNK_BYTES = 8 << 20
"""One write to the disk: large enough that the device streams, small enough to stay in cache
between the copy into it and the hash of it."""

CHUNKS = 3
"""Chunks per open file: one being filled and hashed, up to two being written."""

ALIGN = 4096
"""O_DIRECT's alignment for buffer, offset and length: the largest logical block size in use."""

REFUSED = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)
"""What a file system that does not take O_DIRECT answers, at open or at the first I/O."""

HUGE_PAGE = 2 << 20

_free_chunks: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
"""Chunks of finished files, kept for the next: fresh memory pays the kernel's first touch."""


def _take_chunk() -> mmap.mmap:
    try:
        return _free_chunks.get_nowait()
    except queue.Empty:
        return io_buffer(CHUNK_BYTES)


def io_buffer(length: int, *, huge_pages: bool = True) -> mmap.mmap:
    """Fresh page-aligned memory for O_DIRECT I/O, private (not Python's default shared
    mapping: shared anonymous memory is shmem, which THP leaves out). With `huge_pages` it is
    asked to be backed by transparent huge pages, which fault 512 times less often (201 MB:
    867 faults instead of 51,456, kernel time 0.09-0.11 -> 0.03-0.05 s): right for the write
    chunks, which are kept and reused (`_free_chunks`). A restore's one-off buffer asks for
    none (`direct_read`). Only a hint: where THP is off the pages stay small."""
    data = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge_pages and length >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            data.madvise(mmap.MADV_HUGEPAGE)
    return data


class DirectHashingStream(io.RawIOBase):
    """Write-only, strictly in order; `digest` and `size` describe exactly the bytes written
    once `close()` returns (it writes the tail, waits for the disk and cuts the padding)."""

    def __init__(self, path: str | os.PathLike[str], algorithm: HashAlgorithm = HASH_ALGORITHM,
                 *, threads: int = 1) -> None:
        """Opens `path` with O_DIRECT; raises OSError (EINVAL) where the file system refuses.
        Each chunk is hashed with `algorithm` (on up to `threads` cores) while the disk writes
        the one before."""
        super().__init__()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        self._chunks = [_take_chunk() for _ in range(CHUNKS)]
        self._writes: list[Future[None] | None] = [None] * CHUNKS
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="direct-write")
        self._current = 0  # the chunk being filled
        self._fill = 0  # bytes in it
        self._offset = 0  # where it goes in the file
        self.direct = True
        self.algorithm = algorithm
        self.digest = new_hasher(algorithm, threads=threads)
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view):
            take = min(len(view) - done, CHUNK_BYTES - self._fill)
            self._chunks[self._current][self._fill:self._fill + take] = view[done:done + take]
            self._fill += take
            done += take
            if self._fill == CHUNK_BYTES:
                self._send()
        self.size += done
        return done

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        """Nothing: a partial chunk cannot go to the disk unaligned; `close` writes it."""

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        """Write what is left (zero-padded to `ALIGN`), wait for every write, cut the padding;
        the file descriptor and the chunks are given back even when a write failed."""
        if self.closed:
            return
        try:
            if self._fill:
                self._send()
            for pending in self._writes:
                if pending is not None:
                    pending.result()
            os.ftruncate(self._fd, self.size)
        finally:
            self._writer.shutdown(wait=True)
            os.close(self._fd)
            for chunk in self._chunks:
                _free_chunks.put(chunk)
            self._chunks = []
            super().close()

    def _send(self) -> None:
        """Hand the current chunk to the writer thread, hash it while the disk writes it, then
        move on to the next chunk once its previous write is done."""
        chunk, filled = self._chunks[self._current], self._fill
        padded = -(-filled // ALIGN) * ALIGN
        if padded > filled:  # only the file's last piece
            chunk[filled:padded] = bytes(padded - filled)
        self._writes[self._current] = self._writer.submit(
            self._pwrite, memoryview(chunk)[:padded], self._offset)
        self.digest.update(memoryview(chunk)[:filled])  # both release the GIL
        self._offset += filled
        self._current = (self._current + 1) % CHUNKS
        self._fill = 0
        pending = self._writes[self._current]
        if pending is not None:
            pending.result()  # raises the writer's error here, in the caller's thread
            self._writes[self._current] = None

    def _pwrite(self, view: memoryview, offset: int) -> None:
        try:
            done = 0
            while done < len(view):
                try:
                    wrote = os.pwrite(self._fd, view[done:], offset + done)
                except OSError as e:
                    if not self.direct or e.errno not in REFUSED:
                        raise
                    self._go_buffered()
                    continue
                if not wrote:
                    raise OSError(f"the file took no bytes ({done} of {len(view)} written)")
                done += wrote
        finally:
            view.release()

    def _go_buffered(self) -> None:
        """The file system takes O_DIRECT at open but not this write: go on through the page
        cache."""
        clear_o_direct(self._fd)
        self.direct = False


def clear_o_direct(fd: int) -> bool:
    """Clear O_DIRECT on an open file (Linux lets F_SETFL do it), so its I/O goes on through
    the page cache; False if the flag was not set."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if not flags & getattr(os, "O_DIRECT", 0):
        return False
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
    return True


def open_direct(path: str | os.PathLike[str], algorithm: HashAlgorithm = HASH_ALGORITHM, *,
                threads: int = 1) -> DirectHashingStream | None:
    """A direct stream for `path`, or None where O_DIRECT is not available there."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        return DirectHashingStream(path, algorithm, threads=threads)
    except OSError as e:
        if e.errno in REFUSED:
            return None
        raise
