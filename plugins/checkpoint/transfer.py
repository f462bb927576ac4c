"""Moving checkpoint files between a local folder and the store, hashing on the way.

Upload: the digest the writer computed as it wrote the file (BLAKE3, `manifest.HASH_ALGORITHM`)
is recorded; a store that must read the file (a copy, S3) hashes the bytes as stored while they
stream and checks them against it, and — with `compression="zstd"` — compresses in the same pass.
Download: one read of the stored object, hashed (in the algorithm its manifest entry names:
BLAKE3, or SHA-256 for manifests written before) as it arrives and decompressed into place;
a size or hash mismatch deletes the local copy and raises `IntegrityError`, so nothing that
fails verification is left where a loader could find it. No torch import here.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO

from trainyard.plugins.checkpoint.direct_read import HeldFile, read_held
from trainyard.plugins.checkpoint.manifest import HASH_ALGORITHM, Compression, ManifestFile
from trainyard.plugins.storage.errors import IntegrityError, ObjectNotFoundError
from trainyard.plugins.storage.hashing import Hasher
from trainyard.plugins.storage.store import (
    CHUNK_BYTES,
    LocalStore,
    ObjectStore,
    digest_file,
    new_hasher,
)

ZSTD_LEVEL = 3
"""zstd's default: ~300+ MB/s per core; fp32 weights shrink little, bf16/sparse state more."""


def upload_file(store: ObjectStore, folder: str, rel_path: str, path: Path, *,
                compression: Compression = "none", rank: int | None = None,
                move: bool = False, digest: str | None = None) -> ManifestFile:
    """Upload `path` to `<folder>/<rel_path>` and describe it for the manifest (its digest in
    `HASH_ALGORITHM`). With `move` the local file is given up (a local store on the same disk
    adopts it without a copy); `digest` is the file's, in that algorithm, if its writer
    computed it (see `ObjectStore.put_file`)."""
    key = f"{folder}/{rel_path}"
    raw_size = path.stat().st_size
    if compression == "none":
        info = store.put_file(key, path, move=move, algorithm=HASH_ALGORITHM, expected=digest)
        if info.size != raw_size:
            raise IntegrityError(f"{path}: uploaded {info.size} bytes, file has {raw_size} "
                                 "(it changed while uploading)")
    elif compression == "zstd":
        import zstandard

        with open(path, "rb") as src:
            compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
            reader = compressor.stream_reader(src, size=raw_size, read_size=CHUNK_BYTES)
            info = store.put_stream(key, reader, algorithm=HASH_ALGORITHM)
        if move:
            path.unlink()
    else:
        raise ValueError(f"compression must be 'none' or 'zstd', got {compression!r}")
    stored = info.digest(HASH_ALGORITHM)
    if stored is None:
        raise IntegrityError(f"{store!r} returned no {HASH_ALGORITHM} digest for {key}")
    return ManifestFile.hashed(HASH_ALGORITHM, stored, path=rel_path, size=info.size,
                               compression=compression, raw_size=raw_size, rank=rank)


def download_verified(store: ObjectStore, folder: str, entry: ManifestFile, dest: Path) -> int:
    """Fetch one manifest file to `dest`, verified; returns the bytes read from the store."""
    key = f"{folder}/{entry.path}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".verifying")
    digest = new_hasher(entry.algorithm)
    stored = 0
    try:
        if entry.compression == "none" and isinstance(store, LocalStore) \
                and store.link_to(key, tmp):  # a hard link: hashed in place, never copied
            size = verify_local_file(entry, tmp)
            os.replace(tmp, dest)
            return size
        with store.open_read(key) as src, open(tmp, "wb", buffering=0) as out:
            counted = _HashTap(src, digest)
            if entry.compression == "zstd":
                import zstandard

                try:
                    with zstandard.ZstdDecompressor().stream_reader(
                            counted, read_size=CHUNK_BYTES, closefd=False) as plain:
                        _pump(plain, out)
                except zstandard.ZstdError as e:
                    raise IntegrityError(f"{entry.path}: cannot decompress ({e})") from e
                _pump(counted, None)  # trailing bytes after the frame still count and hash
            else:
                _pump(counted, out)
            stored = counted.size
        problem = _mismatch(entry, stored, digest.hexdigest(), tmp.stat().st_size)
        if problem:
            raise IntegrityError(f"{entry.path}: {problem}")
        os.replace(tmp, dest)
    except ObjectNotFoundError as e:
        raise IntegrityError(f"{entry.path}: missing from {store.uri}/{folder}") from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return stored


def verify_local_file(entry: ManifestFile, path: Path, *, threads: int = 1) -> int:
    """Hash an uncompressed local copy (or hard link) of a stored file against its manifest
    entry; returns its size, raises `IntegrityError` on a mismatch. The one check for every
    file that reaches a rank without streaming through `download_verified`'s hash."""
    size, digest = digest_file(path, entry.algorithm, threads=threads)
    problem = _mismatch(entry, size, digest, size)
    if problem:
        raise IntegrityError(f"{entry.path}: {problem}")
    return size


def read_verified(entry: ManifestFile, path: Path, *, threads: int = 1) -> HeldFile:
    """Read an uncompressed local copy (or hard link) of a stored file into memory, hashed on
    the way (`direct_read`; BLAKE3 on up to `threads` cores), and check it against its manifest entry; raises `IntegrityError`
    on a mismatch, having given the memory back. A loader that reads the returned bytes reads
    exactly what was verified."""
    held = read_held(path, entry.algorithm, threads=threads)
    problem = _mismatch(entry, held.size, held.digest, held.size)
    if problem:
        held.close()
        raise IntegrityError(f"{entry.path}: {problem}")
    return held


def _mismatch(entry: ManifestFile, stored: int, digest: str, local_size: int) -> str | None:
    problem = entry.mismatch(stored, digest)
    if problem:
        return problem
    expected_raw = entry.raw_size if entry.raw_size is not None else entry.size
    if local_size != expected_raw:
        return f"decoded size {local_size} != manifest {expected_raw}"
    return None


class _HashTap:
    """A read-through wrapper that hashes and counts every byte read from the store."""

    def __init__(self, inner: IO[bytes], digest: Hasher) -> None:
        self._inner = inner
        self._digest = digest
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._inner.read(n)
        self._digest.update(data)
        self.size += len(data)
        return data

    def readinto(self, buffer: memoryview | bytearray) -> int:
        readinto = getattr(self._inner, "readinto", None)
        if readinto is None:
            data = self.read(len(buffer))
            buffer[: len(data)] = data
            return len(data)
        n = readinto(buffer)
        if n:
            self._digest.update(memoryview(buffer)[:n])
            self.size += n
        return n or 0


def _pump(src: IO[bytes] | _HashTap, out: IO[bytes] | None) -> None:
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    while True:
        n = src.readinto(view)
        if not n:
            return
        if out is not None:
            out.write(view[:n])
