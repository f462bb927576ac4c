"""`LocalStore`: an object store in a local (or mounted) folder. Writes go to a temporary name
in the same folder, are fsync'd and renamed over the key, so an object is whole or absent."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from trainyard.plugins.storage.api import (
    PARTIAL_MARKER,
    ObjectInfo,
    ObjectStore,
    check_expected,
    check_key,
    expected_digest,
    info_with,
    write_local_atomic,
)
from trainyard.plugins.storage.errors import IntegrityError, ObjectNotFoundError
from trainyard.plugins.storage.hashing import HashAlgorithm, copy_hashing, read_ahead


class LocalStore(ObjectStore):
    """A folder on a local (or mounted) file system."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def path_of(self, key: str) -> Path:
        """The file that holds `key` (it may not exist)."""
        return self.root.joinpath(*check_key(key).split("/"))

    @contextlib.contextmanager
    def _atomic(self, key: str) -> Iterator[IO[bytes]]:
        """Yield a temp file beside the key's path; fsync + rename it over the key on success."""
        final = self.path_of(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{final.name}{PARTIAL_MARKER}{uuid.uuid4().hex[:12]}")
        try:
            with open(tmp, "xb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        _fsync_dir(final.parent)

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        with self._atomic(key) as f:
            f.write(data)
        return ObjectInfo(key, len(data), hashlib.sha256(data).hexdigest())

    def put_file(self, key: str, path: str | os.PathLike[str], *, move: bool = False,
                 sha256: str | None = None, algorithm: HashAlgorithm = "sha256",
                 expected: str | None = None) -> ObjectInfo:
        algorithm, expected = expected_digest(sha256, algorithm, expected)
        source = Path(path)
        if move and self._same_file_system(source):
            try:
                return self._adopt(key, source, algorithm, expected)
            except OSError as e:
                # one device, two mount points (a pod's emptyDir bind-mounted beside the store's
                # folder): rename refuses to cross them; copy instead
                if e.errno != errno.EXDEV:
                    raise
        with open(source, "rb", buffering=0) as src:
            info = self.put_stream(key, src, algorithm=algorithm)
        check_expected(info, expected, algorithm)
        if move:
            source.unlink()
        return info

    def _same_file_system(self, source: Path) -> bool:
        self.root.mkdir(parents=True, exist_ok=True)
        return source.stat().st_dev == self.root.stat().st_dev

    def adopts_from(self, folder: str | os.PathLike[str]) -> bool:
        """`put_file(..., move=True)` of a file under `folder` renames it into the store
        instead of copying it (the same file system); False where `folder` does not exist."""
        try:
            return self._same_file_system(Path(folder))
        except OSError:
            return False

    def _adopt(self, key: str, source: Path, algorithm: HashAlgorithm, expected: str | None
               ) -> ObjectInfo:
        """fsync and rename into place: the bytes are written once, by whoever produced the
        file, never copied. Hashed here (one read, usually from the page cache) unless the
        producer already did."""
        final = self.path_of(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(source, "rb", buffering=0) as f:
            if expected is None:
                read_ahead(f)
                size, digest = copy_hashing(f, None, algorithm)
            else:
                size, digest = os.fstat(f.fileno()).st_size, expected
            os.fsync(f.fileno())
        os.replace(source, final)
        _fsync_dir(final.parent)
        return info_with(key, size, digest, algorithm)

    def link_to(self, key: str, dest: str | os.PathLike[str]) -> bool:
        """Hard-link the object at `dest` (replacing it) instead of copying; False where the
        file systems differ or links are not allowed. Objects are only ever replaced by rename,
        never rewritten in place, so the link keeps the bytes it was made with."""
        src = self.path_of(key)
        if not src.is_file():
            raise ObjectNotFoundError(f"no object {key!r} in {self.uri}")
        dest = Path(dest)
        with contextlib.suppress(FileNotFoundError):
            dest.unlink()
        try:
            os.link(src, dest)
        except OSError:
            return False
        return True

    def put_stream(self, key: str, stream: IO[bytes], *, algorithm: HashAlgorithm = "sha256"
                   ) -> ObjectInfo:
        with self._atomic(key) as f:
            size, digest = copy_hashing(stream, f, algorithm)
        return info_with(key, size, digest, algorithm)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.path_of(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFoundError(f"no object {key!r} in {self.uri}") from e

    def get_file(self, key: str, dest: str | os.PathLike[str]) -> ObjectInfo:
        with self.open_read(key) as src:
            return write_local_atomic(Path(dest), src, key)

    def open_read(self, key: str) -> IO[bytes]:
        path = self.path_of(key)
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115 - the caller closes it
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFoundError(f"no object {key!r} in {self.uri}") from e
        read_ahead(f)
        return f

    def read_range(self, key: str, start: int, length: int, *, if_match: str | None = None) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"byte range must be non-negative, got start={start} length={length}")
        with self.open_read(key) as f:
            if if_match is not None and local_etag(os.fstat(f.fileno())) != if_match:
                raise IntegrityError(f"{key}: etag {local_etag(os.fstat(f.fileno()))} != the expected "
                                     f"{if_match}; the object was overwritten since it was listed")
            return os.pread(f.fileno(), length, start)

    def exists(self, key: str) -> bool:
        return self.path_of(key).is_file()

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_key(prefix, prefix=True)
        base_key = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root.joinpath(*base_key.split("/")) if base_key else self.root
        if not base.is_dir():
            return
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if PARTIAL_MARKER in name:
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:  # deleted while we walked
                    continue
                found.append(ObjectInfo(key, st.st_size, None, st.st_mtime, local_etag(st)))
        found.sort(key=lambda info: info.key)
        yield from found

    def delete(self, key: str) -> None:
        path = self.path_of(key)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        # Tidy empty folders up to the root so deleted checkpoints leave no husks behind.
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def child(self, prefix: str) -> LocalStore:
        check_key(prefix.rstrip("/"))
        return LocalStore(self.root.joinpath(*prefix.strip("/").split("/")))


def local_etag(st: os.stat_result) -> str:
    """A local object's version tag: modification time (ns) and size. Every write replaces the
    file by rename, so an overwrite changes the tag."""
    return f"{st.st_mtime_ns:x}-{st.st_size:x}"


def _fsync_dir(path: Path) -> None:
    """Persist a rename: fsync the folder that holds the new name (POSIX needs both)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
