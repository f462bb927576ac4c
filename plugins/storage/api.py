"""The object-store interface (`ObjectStore`, `ObjectInfo`), key rules and streaming helpers
shared by the local and S3 stores. See `trainyard.plugins.storage.store` for the guarantees; import
from there. No torch, no boto3.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import queue
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from trainyard.plugins.storage.errors import IntegrityError, ObjectNotFoundError, UnsafeKeyError

CHUNK_BYTES = 8 << 20
"""Read/write chunk for streaming copies: big enough that syscalls and hashing calls amortise,
small enough that memory stays flat."""

PARTIAL_MARKER = ".trainyard-partial-"
"""Local temporary files carry this in their name; listings skip them and keys may not use it."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a store knows about one object. `sha256` is None where the store cannot tell
    without reading the object (listings); `mtime` is seconds since the epoch when known."""

    key: str
    size: int
    sha256: str | None = None
    mtime: float | None = None
    etag: str | None = None
    """The store's version tag of the object (S3: the ETag without quotes; local: modification
    time and size), so a reader can tell the object it listed from one written over it."""


def check_key(key: str, *, prefix: bool = False) -> str:
    """Return `key` if it is a safe relative key, else raise `UnsafeKeyError`.

    With `prefix=True` the empty string and a trailing '/' are allowed (listing prefixes).
    """
    if not isinstance(key, str):
        raise UnsafeKeyError(f"key must be a string, got {type(key).__name__}")
    if prefix and key == "":
        return key
    if not key:
        raise UnsafeKeyError("key must not be empty")
    if key.startswith("/"):
        raise UnsafeKeyError(f"key {key!r} is absolute; keys are relative to the store root")
    if "\\" in key or "\x00" in key:
        raise UnsafeKeyError(f"key {key!r} contains a backslash or NUL")
    if PARTIAL_MARKER in key:
        raise UnsafeKeyError(f"key {key!r} uses the reserved marker {PARTIAL_MARKER!r}")
    parts = key.split("/")
    if prefix and parts[-1] == "":
        parts = parts[:-1]
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafeKeyError(
                f"key {key!r} has an empty, '.' or '..' segment; keys must stay inside the store"
            )
    return key


def join_key(*parts: str) -> str:
    """Join key fragments with '/', ignoring empty ones and stray slashes at the joins."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


class ObjectStore(ABC):
    """A flat key → bytes store rooted at `.uri`. See the module docstring for the guarantees."""

    @property
    @abstractmethod
    def uri(self) -> str:
        """The root URI; `open_store(store.uri)` opens the same store."""

    def key_uri(self, key: str) -> str:
        """The URI of one object, e.g. a manifest URI handed to another process."""
        return self.uri.rstrip("/") + "/" + check_key(key)

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> ObjectInfo: ...

    @abstractmethod
    def put_file(self, key: str, path: str | os.PathLike[str], *, move: bool = False,
                 sha256: str | None = None) -> ObjectInfo:
        """Upload a local file; the returned SHA-256 is computed while streaming it.

        With `move=True` the caller gives the file up: it is gone afterwards, and a local
        store on the same file system adopts it by rename instead of copying the bytes.
        `sha256`, when the caller computed it as it wrote the file, is checked against the
        bytes a store streams (mismatch: `IntegrityError`), and spares a local store that
        adopts the file from reading it at all.
        """

    @abstractmethod
    def put_stream(self, key: str, stream: IO[bytes]) -> ObjectInfo:
        """Upload everything `stream.read()` yields (e.g. a compressing reader), hashing it."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def get_file(self, key: str, dest: str | os.PathLike[str]) -> ObjectInfo:
        """Download to `dest` (atomically: temp + rename); SHA-256 computed while streaming."""

    @abstractmethod
    def open_read(self, key: str) -> IO[bytes]:
        """A binary stream of the object (use as a context manager)."""

    def read_range(self, key: str, start: int, length: int, *, if_match: str | None = None) -> bytes:
        """`length` bytes of the object from byte `start` (fewer at its end). With `if_match`,
        raise `IntegrityError` when the object's etag is no longer that one (it was
        overwritten since it was listed). Stores override this with a native ranged read."""
        if start < 0 or length < 0:
            raise ValueError(f"byte range must be non-negative, got start={start} length={length}")
        if if_match is not None:
            self._check_etag(key, if_match)
        with self.open_read(key) as f:
            f.seek(start)
            return f.read(length)

    def _check_etag(self, key: str, etag: str) -> None:
        current = next((o.etag for o in self.list(key) if o.key == key), None)
        if current is None:
            raise ObjectNotFoundError(f"no object {key!r} in {self.uri}")
        if current != etag:
            raise IntegrityError(f"{key}: etag {current} != the expected {etag}; the object was "
                                 "overwritten since it was listed")

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix` (string prefix, like S3), sorted by key."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; a missing object counts as deleted."""

    @abstractmethod
    def child(self, prefix: str) -> ObjectStore:
        """The same store rooted at `prefix` below this one."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def copy_hashing(src: IO[bytes], dst: IO[bytes] | None) -> tuple[int, str]:
    """Stream src → dst in big chunks, hashing on the way; returns (bytes, sha256 hex)."""
    digest = hashlib.sha256()
    size = 0
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
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
            chunk = memoryview(data)
            n = len(data)
        digest.update(chunk)
        if dst is not None:
            dst.write(chunk)
        size += n
    return size, digest.hexdigest()


def read_ahead(f: IO[bytes]) -> None:
    """Ask the kernel to read the whole file ahead, so the disk works while we hash."""
    with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)


def sha256_of_file(path: str | os.PathLike[str], *, buffers: int = 3) -> tuple[int, str]:
    """(size, SHA-256) of a local file, reading ahead in a second thread so the disk and the
    hash work at the same time (both release the GIL): on a cold page cache this takes about
    as long as the slower of the two instead of their sum."""
    free: queue.Queue[bytearray] = queue.Queue()
    full: queue.Queue[tuple[bytearray, int] | Exception] = queue.Queue()
    for _ in range(buffers):
        free.put(bytearray(CHUNK_BYTES))
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

    thread = threading.Thread(target=reader, name="sha256-read-ahead", daemon=True)
    thread.start()
    digest = hashlib.sha256()
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


def sha256_of_stream(stream: IO[bytes]) -> tuple[int, str]:
    """(size, SHA-256) of everything left in `stream`."""
    return copy_hashing(stream, None)


def check_expected(info: ObjectInfo, sha256: str | None) -> None:
    if sha256 is not None and info.sha256 != sha256:
        raise IntegrityError(f"{info.key}: streamed SHA-256 {info.sha256} != the writer's "
                             f"{sha256}; the file changed before it was uploaded")


def write_local_atomic(dest: Path, src: IO[bytes], key: str) -> ObjectInfo:
    """Copy src into dest via a temp file + rename, hashing on the way (no fsync: downloads
    are scratch copies that the hash check, not the disk, makes trustworthy)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}{PARTIAL_MARKER}{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "xb", buffering=0) as f:
            size, sha = copy_hashing(src, f)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return ObjectInfo(key, size, sha)
