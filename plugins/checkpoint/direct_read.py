"""A checkpoint file read once, with O_DIRECT, hashed as it arrives and kept in memory.

A restore used to hash each file with buffered reads and then let DCP read it again from the
page cache. A cold buffered read costs the kernel a page-cache fill and a copy into ours: on
the 2-core development machine two ranks each hashing a 201 MB file that way took 0.35-0.6 s.
With O_DIRECT and two reads in flight the disk writes into our memory itself (DMA): the same
two files read in 0.10-0.12 s, and read, hashed and kept in 0.24-0.26 s, now bound by the CPU
(per rank 0.12 s hashing and 0.12 s of the kernel's first touch of the fresh buffer; scratch
measurements, both ranks at once, 3 s after the cache was dropped). Keeping the bytes also
means DCP parses exactly the bytes that were hashed, not a second read of the file.

The buffer is a private anonymous `mmap` (page-aligned, as O_DIRECT wants buffer, offset and
length aligned to the device's block; `direct_write.io_buffer`) in ordinary 4 KiB pages; the
last read asks for the padded length and gets the file's tail. It used to ask for transparent
huge pages, which fault less often, but a fresh buffer is fresh 2 MiB blocks, and on the
development VM (a balloon that reports free 2 MiB blocks to the host) those made a restore
erratic: in one torchrun, restores alternating the two kinds, both ranks 201 MB each under a
load of 5-6, whole verified restores took 1.2-2.7 s with huge pages and 0.42-0.83 s without
(3 of each), and with huge pages one read alone ranged 0.1-3.5 s (0.07-1.4 s of CPU). Where the file system refuses O_DIRECT (at `open`, or
at a read), the same pass goes on buffered: slower, never wrong. The caller decides whether a
file fits in memory (`memory_to_hold`); `HeldFile.close` gives the memory back.

Levers measured against this (issue 58; 2 ranks x 201 MB at once, cold, 3 s after the write;
the VM shared, load 2-6, so only large differences count): buffered reads with
POSIX_FADV_SEQUENTIAL + WILLNEED read the raw disk faster (the benchmark's `disk_read_MBps`,
~2,270 MB/s against ~1,360 with O_DIRECT, at load 1-3) but cost a rank twice the kernel CPU
(0.23-0.25 s against 0.09-0.12 of system time per restore), and the whole verified restore was
slower with them (materialize median 0.46-0.62 s against 0.30-0.37, same torchruns, alternating);
4 or 8 reads in flight, 16 or 32 MB reads: no faster; a MAP_POPULATE'd buffer: slower (it faults
the pages in before the first read instead of beside it); mapping the file itself (page cache,
no copy): no faster, and DCP would no longer parse a private copy of the hashed bytes; BLAKE3
on two threads per rank: no faster (each rank has one core). What would be faster is reading
straight into the live tensors (no fresh buffer to fault in, copy out of and unmap: 0.035 s to
unmap 201 MB alone): 1.1x and 1.5-2.0x this path's rate in two scratch runs at load ~2 — but
the model would hold unverified bytes until the hash ends, and the zip records would be parsed
before it ends, against the contract that a folder is proven whole before any byte reaches a
model (`manifest`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from trainyard.plugins.checkpoint.direct_write import (
    ALIGN,
    CHUNK_BYTES,
    REFUSED,
    clear_o_direct,
    io_buffer,
)
from trainyard.plugins.checkpoint.manifest import HASH_ALGORITHM
from trainyard.plugins.storage.store import HashAlgorithm, new_hasher

READS_IN_FLIGHT = 2
"""Reads the disk has queued while the previous piece is hashed (more measured no faster)."""


@dataclass
class HeldFile:
    """A file's bytes in memory, with the size and digest (`algorithm`) of exactly those bytes."""

    size: int
    digest: str
    data: mmap.mmap
    algorithm: HashAlgorithm = HASH_ALGORITHM

    def view(self) -> memoryview:
        return memoryview(self.data)[: self.size]

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a reader still holds a view: the memory
            self.data.close()  # goes when the last view does


def read_held(path: str | os.PathLike[str], algorithm: HashAlgorithm = HASH_ALGORITHM, *,
              threads: int = 1) -> HeldFile:
    """Read `path` into memory in one pass, hashing each piece (with `algorithm`, on up to
    `threads` cores) while the next ones are read."""
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        data = io_buffer(max(ALIGN, -(-size // ALIGN) * ALIGN), huge_pages=False)
        view = memoryview(data)
        try:
            digest = new_hasher(algorithm, threads=threads)
            with ThreadPoolExecutor(READS_IN_FLIGHT, thread_name_prefix="direct-read") as pool:
                # every piece queued at once: the pool keeps READS_IN_FLIGHT at the disk
                reads = [(offset, min(CHUNK_BYTES, size - offset),
                          pool.submit(_read_fully, fd, view, offset, min(CHUNK_BYTES, size - offset)))
                         for offset in range(0, size, CHUNK_BYTES)]
                try:
                    for offset, want, read in reads:
                        read.result()
                        digest.update(view[offset:offset + want])  # releases the GIL, as reads do
                finally:
                    for _, _, read in reads:
                        read.cancel()
        except BaseException:
            view.release()
            HeldFile(0, "", data, algorithm).close()  # (a view in the traceback may keep it a while)
            raise
        view.release()
        return HeldFile(size, digest.hexdigest(), data, algorithm)
    finally:
        os.close(fd)


def _read_fully(fd: int, view: memoryview, offset: int, want: int) -> None:
    """Read `want` bytes at `offset` into `view[offset:]`. O_DIRECT is asked for whole blocks
    (the buffer is padded for the file's tail, which comes back short)."""
    got, buffered = 0, False
    while got < want:
        end = offset + -(-want // ALIGN) * ALIGN
        try:
            n = os.preadv(fd, [view[offset + got:end]], offset + got)
        except OSError as e:
            if e.errno not in REFUSED or buffered:
                raise
            # The fd's flag is shared by the reads in flight: another one may have cleared it
            # already (after this read was issued direct). Either way the next try is buffered.
            clear_o_direct(fd)
            buffered = True
            continue
        if not n:
            raise EOFError(f"the file ended {want - got} bytes early (it shrank while read)")
        got += n


def _open(path: str | os.PathLike[str]) -> int:
    if hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError as e:
            if e.errno not in REFUSED:
                raise
    return os.open(path, os.O_RDONLY)


def memory_to_hold(local_ranks: int | None = None) -> int:
    """Bytes one rank may hold for a restore: half of the memory it can still use, shared by
    the node's ranks (they restore at the same time). "Can still use" is the least of what the
    kernel says is available without swapping and what this process's memory cgroup (a pod's
    limit) has left; 0 where the kernel does not say, so nothing is held and the files are
    read from disk as before."""
    try:
        with open("/proc/meminfo") as f:
            room = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0
    limited = cgroup_room()
    if limited is not None:
        room = min(room, limited)
    ranks = local_ranks or int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return room // 2 // max(1, ranks)


def cgroup_room(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """How many more bytes this process's memory cgroup lets it use (its limit less its usage,
    cgroup v2 or v1); None where no limit is set or none can be read."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and not controllers:
            base, limit_name, usage_name = Path(root), "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_name, usage_name = (Path(root) / "memory", "memory.limit_in_bytes",
                                            "memory.usage_in_bytes")
        else:
            continue
        folder = base / path.lstrip("/")
        try:
            limit = (folder / limit_name).read_text().strip()
            usage = int((folder / usage_name).read_text())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:  # v1: "no limit"
            continue
        return max(0, int(limit) - usage)
    return None
