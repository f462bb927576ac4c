"""Object stores: one interface over a local folder and S3 (or MinIO, or any S3-compatible API).

Everything durable in Trainyard goes through this interface: checkpoints, manifests, datasets,
artifacts. Two properties matter more than speed:

1. **A written object is whole or absent.** Local writes go to a temporary name in the same
   folder, are fsync'd, then renamed over the key (rename is atomic on POSIX). S3 PUTs and
   completed multipart uploads are atomic by nature. So a reader never sees half an object, and
   a checkpoint manifest written last really is a commit.
2. **Hashes cost no second read.** `put_file` and `get_file` compute SHA-256 while the bytes
   stream through (SHA-256 runs at ~1.5 GB/s with SHA-NI, faster than most disks and links).

Keys are relative, '/'-separated, and never contain `..`, `.`, empty segments, backslashes or a
leading '/': a key can never name something outside its store's root.

No torch and no Airflow here: the control plane and Airflow sensors import this module. boto3 is
imported only when an S3 store is opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from plugins.checkpoint.errors import IntegrityError, ObjectNotFoundError, UnsafeKeyError

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig

log = logging.getLogger(__name__)

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


def _copy_hashing(src: IO[bytes], dst: IO[bytes] | None) -> tuple[int, str]:
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


def sha256_of_stream(stream: IO[bytes]) -> tuple[int, str]:
    """(size, SHA-256) of everything left in `stream`."""
    return _copy_hashing(stream, None)


# ---------------------------------------------------------------------------------------------
# Local folder


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
                 sha256: str | None = None) -> ObjectInfo:
        source = Path(path)
        if move and self._same_file_system(source):
            return self._adopt(key, source, sha256)
        with open(source, "rb", buffering=0) as src:
            info = self.put_stream(key, src)
        _check_expected(info, sha256)
        if move:
            source.unlink()
        return info

    def _same_file_system(self, source: Path) -> bool:
        self.root.mkdir(parents=True, exist_ok=True)
        return source.stat().st_dev == self.root.stat().st_dev

    def _adopt(self, key: str, source: Path, sha256: str | None) -> ObjectInfo:
        """fsync and rename into place: the bytes are written once, by whoever produced the
        file, never copied. Hashed here (one read, usually from the page cache) unless the
        producer already did."""
        final = self.path_of(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(source, "rb", buffering=0) as f:
            if sha256 is None:
                read_ahead(f)
                size, sha = _copy_hashing(f, None)
            else:
                size, sha = os.fstat(f.fileno()).st_size, sha256
            os.fsync(f.fileno())
        os.replace(source, final)
        _fsync_dir(final.parent)
        return ObjectInfo(key, size, sha)

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

    def put_stream(self, key: str, stream: IO[bytes]) -> ObjectInfo:
        with self._atomic(key) as f:
            size, sha = _copy_hashing(stream, f)
        return ObjectInfo(key, size, sha)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.path_of(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFoundError(f"no object {key!r} in {self.uri}") from e

    def get_file(self, key: str, dest: str | os.PathLike[str]) -> ObjectInfo:
        with self.open_read(key) as src:
            return _write_local_atomic(Path(dest), src, key)

    def open_read(self, key: str) -> IO[bytes]:
        path = self.path_of(key)
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115 - the caller closes it
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFoundError(f"no object {key!r} in {self.uri}") from e
        read_ahead(f)
        return f

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
                found.append(ObjectInfo(key, st.st_size, None, st.st_mtime))
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


def _check_expected(info: ObjectInfo, sha256: str | None) -> None:
    if sha256 is not None and info.sha256 != sha256:
        raise IntegrityError(f"{info.key}: streamed SHA-256 {info.sha256} != the writer's "
                             f"{sha256}; the file changed before it was uploaded")


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


def _write_local_atomic(dest: Path, src: IO[bytes], key: str) -> ObjectInfo:
    """Copy src into dest via a temp file + rename, hashing on the way (no fsync: downloads
    are scratch copies that the hash check, not the disk, makes trustworthy)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}{PARTIAL_MARKER}{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "xb", buffering=0) as f:
            size, sha = _copy_hashing(src, f)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return ObjectInfo(key, size, sha)


# ---------------------------------------------------------------------------------------------
# S3


def _is_transient(error: BaseException) -> bool:
    """Errors worth retrying a whole transfer for. botocore already retries each request
    (standard mode); this covers what it cannot: a connection dropped while a body streams."""
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        EndpointConnectionError,
        IncompleteReadError,
        ReadTimeoutError,
        ResponseStreamingError,
    )

    if isinstance(error, ConnectionClosedError | EndpointConnectionError | ReadTimeoutError
                  | IncompleteReadError | ResponseStreamingError):
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = error.response.get("Error", {}).get("Code", "")
        return status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout")
    return False


def _retrying(fn: Any) -> Any:
    """Retry a whole-object operation on transient errors (tenacity; exponential backoff)."""
    from tenacity import (
        retry,
        retry_if_exception,
        stop_after_attempt,
        wait_exponential,
    )

    return retry(
        retry=retry_if_exception(_is_transient),
        stop=stop_after_attempt(4),
        wait=wait_exponential(multiplier=0.5, max=8),
        reraise=True,
    )(fn)


def _is_not_found(error: BaseException) -> bool:
    from botocore.exceptions import ClientError

    if not isinstance(error, ClientError):
        return False
    code = str(error.response.get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NotFound")


class _HashingReader(io.RawIOBase):
    """Wraps a stream, hashing and counting what is read. Deliberately *not seekable*: that
    makes s3transfer read it strictly in order (one reader, parts uploaded concurrently), so
    the hash sees the bytes in the order they are stored."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner
        self.digest = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            data = self._inner.read()
        else:
            # s3transfer takes a short read for the end of the stream, but streams such as
            # decompressors return short reads anywhere: fill the request or reach the end.
            pieces: list[bytes] = []
            wanted = size
            while wanted > 0:
                piece = self._inner.read(wanted)
                if not piece:
                    break
                pieces.append(piece)
                wanted -= len(piece)
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self.digest.update(data)
        self.size += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _S3Body(io.RawIOBase):
    """A `get_object` body as a readable binary stream (and context manager)."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        return self._body.read(None if size is None or size < 0 else size)

    def readinto(self, buffer: Any) -> int:
        data = self._body.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._body.close()
        super().close()


class S3Store(ObjectStore):
    """`s3://bucket/prefix` through boto3; large objects use s3transfer multipart uploads."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        multipart_threshold: int = 64 << 20,
        multipart_chunksize: int = 16 << 20,
        max_concurrency: int = 8,
        client: Any | None = None,
    ) -> None:
        if len(bucket) < 3:
            raise ValueError(f"S3 bucket names need at least 3 characters, got {bucket!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            check_key(self.prefix)
        self.endpoint_url = endpoint_url
        self._multipart = (multipart_threshold, multipart_chunksize, max_concurrency)
        self._client = client

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @cached_property
    def client(self) -> Any:
        if self._client is not None:
            return self._client
        import boto3
        from botocore.config import Config

        config = Config(
            retries={"max_attempts": 8, "mode": "standard"},
            max_pool_connections=max(10, self._multipart[2] * 2),
            connect_timeout=10,
            read_timeout=120,
        )
        session = boto3.session.Session()
        return session.client(
            "s3",
            endpoint_url=self.endpoint_url,
            config=config,
            region_name=session.region_name or "us-east-1",
        )

    @cached_property
    def transfer_config(self) -> TransferConfig:
        from boto3.s3.transfer import TransferConfig

        threshold, chunksize, concurrency = self._multipart
        return TransferConfig(
            multipart_threshold=threshold,
            multipart_chunksize=chunksize,
            max_concurrency=concurrency,
            use_threads=True,
        )

    def _key(self, key: str) -> str:
        return join_key(self.prefix, check_key(key))

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        full = self._key(key)
        _retrying(self.client.put_object)(Bucket=self.bucket, Key=full, Body=data)
        return ObjectInfo(key, len(data), hashlib.sha256(data).hexdigest())

    def put_file(self, key: str, path: str | os.PathLike[str], *, move: bool = False,
                 sha256: str | None = None) -> ObjectInfo:
        @_retrying
        def attempt() -> ObjectInfo:
            with open(path, "rb") as f:
                read_ahead(f)
                return self._upload_stream(key, f)

        info = attempt()
        _check_expected(info, sha256)
        if move:
            Path(path).unlink()
        return info

    def put_stream(self, key: str, stream: IO[bytes]) -> ObjectInfo:
        # No whole-object retry: a consumed stream cannot be replayed (botocore still retries
        # each part, whose bytes s3transfer holds in memory).
        return self._upload_stream(key, stream)

    def _upload_stream(self, key: str, stream: IO[bytes]) -> ObjectInfo:
        reader = _HashingReader(stream)
        self.client.upload_fileobj(reader, self.bucket, self._key(key), Config=self.transfer_config)
        return ObjectInfo(key, reader.size, reader.digest.hexdigest())

    def get_bytes(self, key: str) -> bytes:
        @_retrying
        def attempt() -> bytes:
            with self.open_read(key) as body:
                return body.read()

        return attempt()

    def get_file(self, key: str, dest: str | os.PathLike[str]) -> ObjectInfo:
        # One ordered stream rather than s3transfer's parallel ranged GETs: the hash must see
        # the bytes in order, and a second read of the file is what we promised not to do.
        @_retrying
        def attempt() -> ObjectInfo:
            with self.open_read(key) as body:
                return _write_local_atomic(Path(dest), body, key)

        return attempt()

    def open_read(self, key: str) -> IO[bytes]:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            if _is_not_found(e):
                raise ObjectNotFoundError(f"no object {key!r} in {self.uri}") from e
            raise
        return io.BufferedReader(_S3Body(response["Body"]), buffer_size=1 << 20)

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            if _is_not_found(e):
                return False
            raise
        return True

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_key(prefix, prefix=True)
        root = self.prefix + "/" if self.prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"][len(root):]
                yield ObjectInfo(key, int(obj["Size"]), None, obj["LastModified"].timestamp())

    def delete(self, key: str) -> None:
        try:
            _retrying(self.client.delete_object)(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            if not _is_not_found(e):
                raise

    def child(self, prefix: str) -> S3Store:
        check_key(prefix.rstrip("/"))
        store = S3Store(self.bucket, join_key(self.prefix, prefix), endpoint_url=self.endpoint_url,
                        client=self.client)
        store._multipart = self._multipart
        return store


# ---------------------------------------------------------------------------------------------


def open_store(uri: str | os.PathLike[str], *, endpoint_url: str | None = None) -> ObjectStore:
    """Open `file:///abs/path`, `s3://bucket/prefix`, or a plain path (a local folder)."""
    if isinstance(uri, os.PathLike):
        return LocalStore(uri)
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"object store URI must be a non-empty string, got {uri!r}")
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"S3 URI {uri!r} has no bucket; expected s3://bucket/prefix")
        prefix = parts.path.strip("/")
        if prefix:
            check_key(prefix)
        return S3Store(parts.netloc, prefix, endpoint_url=endpoint_url)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URI {uri!r} names host {parts.netloc!r}; only local paths work")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"file URI {uri!r} must be absolute (file:///abs/path)")
        _refuse_dotdot(uri, path)
        return LocalStore(path)
    if scheme and len(scheme) > 1:  # one letter would be a Windows drive, which we don't run on
        raise ValueError(f"unsupported object store URI scheme {scheme!r} in {uri!r}; "
                         "use file:///…, s3://bucket/prefix or a plain path")
    _refuse_dotdot(uri, uri)
    return LocalStore(uri)


def _refuse_dotdot(uri: str, path: str) -> None:
    if ".." in Path(path).parts:
        raise UnsafeKeyError(f"store URI {uri!r} contains '..'; give the folder directly")


def split_uri(uri: str) -> tuple[str, str]:
    """`<parent URI>, <last segment>` of an object URI (e.g. a manifest URI)."""
    head, sep, name = uri.rstrip("/").rpartition("/")
    if not sep or not name or head.endswith(":/") or head.endswith(":"):
        raise ValueError(f"{uri!r} has no parent folder and object name")
    return head, name
