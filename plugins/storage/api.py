"""The object-store interface (`ObjectStore`, `ObjectInfo`), key rules and streaming helpers
shared by the local and S3 stores. See `trainyard.plugins.storage.store` for the guarantees; import
from there. No torch, no boto3.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from trainyard.plugins.storage.errors import IntegrityError, ObjectNotFoundError, UnsafeKeyError
from trainyard.plugins.storage.hashing import HashAlgorithm, copy_hashing, digest_file

PARTIAL_MARKER = ".trainyard-partial-"
"""Local temporary files carry this in their name; listings skip them and keys may not use it."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a store knows about one object. `sha256` is None where the store cannot tell
    without reading the object (listings) or hashed it with another algorithm (`blake3`, for
    a caller that asked for it); `mtime` is seconds since the epoch when known."""

    key: str
    size: int
    sha256: str | None = None
    mtime: float | None = None
    etag: str | None = None
    """The store's version tag of the object (S3: the ETag without quotes; local: modification
    time and size), so a reader can tell the object it listed from one written over it."""
    blake3: str | None = None

    def digest(self, algorithm: HashAlgorithm) -> str | None:
        """The hex digest of the object's bytes with `algorithm`, if the store computed it."""
        return self.blake3 if algorithm == "blake3" else self.sha256


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
                 sha256: str | None = None, algorithm: HashAlgorithm = "sha256",
                 expected: str | None = None) -> ObjectInfo:
        """Upload a local file; its digest (`algorithm`) is computed while streaming it.

        With `move=True` the caller gives the file up: it is gone afterwards, and a local
        store on the same file system adopts it by rename instead of copying the bytes.
        `expected`, the `algorithm` digest the caller computed as it wrote the file, is checked
        against the bytes a store streams (mismatch: `IntegrityError`), and spares a local
        store that adopts the file from reading it at all. `sha256=` is short for
        `algorithm="sha256", expected=...`.
        """

    @abstractmethod
    def put_stream(self, key: str, stream: IO[bytes], *, algorithm: HashAlgorithm = "sha256"
                   ) -> ObjectInfo:
        """Upload everything `stream.read()` yields (e.g. a compressing reader), hashing it
        with `algorithm`."""

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


def sha256_of_file(path: str | os.PathLike[str], *, buffers: int = 3) -> tuple[int, str]:
    """(size, SHA-256) of a local file, read ahead while hashed (`hashing.digest_file`)."""
    return digest_file(path, "sha256", buffers=buffers)


def expected_digest(sha256: str | None, algorithm: HashAlgorithm, expected: str | None
                    ) -> tuple[HashAlgorithm, str | None]:
    """`put_file`'s (algorithm, expected digest) from its arguments; both ways at once is an
    error, not a guess."""
    if sha256 is None:
        return algorithm, expected
    if expected is not None or algorithm != "sha256":
        raise ValueError("put_file takes sha256= or algorithm= with expected=, not both")
    return "sha256", sha256


def info_with(key: str, size: int, digest: str, algorithm: HashAlgorithm) -> ObjectInfo:
    """An `ObjectInfo` carrying `digest` in the field of its algorithm."""
    if algorithm == "blake3":
        return ObjectInfo(key, size, None, blake3=digest)
    return ObjectInfo(key, size, digest)


def sha256_of_stream(stream: IO[bytes]) -> tuple[int, str]:
    """(size, SHA-256) of everything left in `stream`."""
    return copy_hashing(stream, None)


def check_expected(info: ObjectInfo, expected: str | None, algorithm: HashAlgorithm = "sha256"
                   ) -> None:
    """Raise `IntegrityError` when the digest a store streamed is not the writer's."""
    if expected is not None and info.digest(algorithm) != expected:
        raise IntegrityError(f"{info.key}: streamed {algorithm} {info.digest(algorithm)} != the "
                             f"writer's {expected}; the file changed before it was uploaded")


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
