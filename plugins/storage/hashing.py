"""Content digests: the one place that turns an algorithm's name into a hasher.

Two algorithms, both cryptographic: SHA-256 (hashlib) and BLAKE3 (the `blake3` package, Rust).
Checkpoint manifests record BLAKE3 since issue 58: on the 2-core development machine SHA-256
ran at 1.6-3.5 GB/s, about the disk's own rate, so a hashed save and a verified restore were
bound by the hash; BLAKE3 ran at 3.4 GB/s on one core and 4.4 GB/s on two in the same minute
SHA-256 ran at 1.6 GB/s (`benchmarks/checkpoint.py` prints both rates, `blake3_MBps` and
`sha256_MBps`, on the same buffers). SHA-256 stays: manifests written before are verified with
it, and object-store listings, dataset shards and model files keep it. Both release the GIL
while they hash a large buffer, so a hash overlaps disk I/O on another thread. No torch here.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import queue
import threading
from typing import IO, Literal, Protocol

from blake3 import blake3

HashAlgorithm = Literal["sha256", "blake3"]
ALGORITHMS: tuple[HashAlgorithm, ...] = ("sha256", "blake3")

CHUNK_BYTES = 8 << 20
"""Read chunk of `digest_file` and `copy_hashing`: syscalls and hash calls amortise, memory
stays flat."""


class Hasher(Protocol):
    """What hashlib's and blake3's hashers have in common (and all callers use)."""

    def update(self, data: bytes | bytearray | memoryview, /) -> object: ...

    def digest(self) -> bytes: ...

    def hexdigest(self) -> str: ...


def new_hasher(algorithm: HashAlgorithm = "sha256", *, threads: int = 1) -> Hasher:
    """A fresh hasher. `threads` > 1 lets BLAKE3 hash each large update on that many threads
    (SHA-256 is sequential by construction and ignores it); give it the cores the caller may
    use, not more: on a core shared with another rank's hash the threads only contend."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "blake3":
        return blake3(max_threads=threads) if threads > 1 else blake3()  # type: ignore[no-any-return]
    raise ValueError(f"hash algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def copy_hashing(src: IO[bytes], dst: IO[bytes] | None, algorithm: HashAlgorithm = "sha256"
                 ) -> tuple[int, str]:
    """Stream src → dst (or nowhere) in big chunks, hashing on the way: (bytes, hex digest)."""
    digest = new_hasher(algorithm)
    size = 0
    view = memoryview(bytearray(CHUNK_BYTES))
    readinto = getattr(src, "readinto", None)
    while True:
        if readinto is not None:
            n = readinto(view)
            if not n:
                break
            chunk = view[:n]
        else:
            data = src.read(CHUNK_BYTES)
            if not data:
                break
            chunk, n = memoryview(data), len(data)
        digest.update(chunk)
        if dst is not None:
            dst.write(chunk)
        size += n
    return size, digest.hexdigest()


def read_ahead(f: IO[bytes]) -> None:
    """Ask the kernel to read the whole file ahead, so the disk works while we hash."""
    with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)


def digest_file(path: str | os.PathLike[str], algorithm: HashAlgorithm = "sha256", *,
                buffers: int = 3, threads: int = 1) -> tuple[int, str]:
    """(size, hex digest) of a local file, reading ahead in a second thread so the disk and the
    hash work at the same time (both release the GIL): on a cold page cache this takes about
    as long as the slower of the two instead of their sum. The buffers are no larger than the
    file: three fresh 8 MB buffers cost ~9 ms to zero and fault in on the development VM, and a
    restore verifies the small DCP `.metadata` this way on every rank (a file that grows
    meanwhile is still read to its end, in more reads)."""
    try:
        chunk = min(CHUNK_BYTES, os.stat(path).st_size) or 1
    except OSError:
        chunk = CHUNK_BYTES  # the reader meets the same error and raises it
    free: queue.Queue[bytearray] = queue.Queue()
    full: queue.Queue[tuple[bytearray, int] | Exception] = queue.Queue()
    for _ in range(buffers):
        free.put(bytearray(chunk))
    stop = threading.Event()

    def reader() -> None:
        try:
            with open(path, "rb", buffering=0) as f:
                read_ahead(f)
                while not stop.is_set():
                    buf = free.get()
                    n = f.readinto(buf) or 0
                    full.put((buf, n))
                    if not n:
                        return
        except Exception as e:  # noqa: BLE001 - handed to the hashing thread, which raises it
            full.put(e)

    thread = threading.Thread(target=reader, name=f"{algorithm}-read-ahead", daemon=True)
    thread.start()
    digest = new_hasher(algorithm, threads=threads)
    size = 0
    try:
        while True:
            item = full.get()
            if isinstance(item, Exception):
                raise item
            buf, n = item
            if not n:
                break
            digest.update(memoryview(buf)[:n])
            size += n
            free.put(buf)
    finally:
        stop.set()
        free.put(bytearray(0))  # unblock a reader waiting for a buffer
        thread.join()
    return size, digest.hexdigest()
