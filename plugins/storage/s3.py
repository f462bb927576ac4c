"""`S3Store`: `s3://bucket/prefix` through boto3 (imported lazily); large objects go up as
s3transfer multipart uploads, hashed in order while they stream, and ranged reads (the data
pipeline's) are presigned by the client and sent by urllib3 (`S3Store._plain_http` says why)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from trainyard.plugins.storage.api import (
    ObjectInfo,
    ObjectStore,
    check_expected,
    check_key,
    expected_digest,
    info_with,
    join_key,
    write_local_atomic,
)
from trainyard.plugins.storage.errors import IntegrityError, ObjectNotFoundError
from trainyard.plugins.storage.hashing import HashAlgorithm, new_hasher, read_ahead

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig


_S3_ERROR_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")
"""The code in an S3 error body (`<Error><Code>NoSuchKey</Code>…`)."""


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
    from urllib3 import exceptions as plain

    if isinstance(error, ConnectionClosedError | EndpointConnectionError | ReadTimeoutError
                  | IncompleteReadError | ResponseStreamingError):
        return True
    # `read_range`'s plain requests (`S3Store._plain_http`): urllib3 raises these itself.
    if isinstance(error, plain.ProtocolError | plain.NewConnectionError | plain.ConnectTimeoutError
                  | plain.ReadTimeoutError):
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = error.response.get("Error", {}).get("Code", "")
        return status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout")
    return False


@functools.cache
def _retry_policy(attempts: int) -> Any:
    """One tenacity `Retrying` per attempt count, shared: its per-call state is thread-local,
    and building a policy costs more than a ranged GET's own request (measured: a fifth of
    the fetch's time under the GIL when `read_range` made one per call)."""
    from trainyard.plugins.retry import policy

    return policy(_is_transient, attempts=attempts, first_wait_s=0.5, max_wait_s=8)


def _retrying(fn: Any, attempts: int = 4) -> Any:
    """Retry a whole-object operation on transient errors (tenacity; exponential backoff)."""
    policy = _retry_policy(attempts)

    @functools.wraps(fn)
    def retried(*args: Any, **kwargs: Any) -> Any:
        return policy(fn, *args, **kwargs)

    return retried


def _is_not_found(error: BaseException) -> bool:
    from botocore.exceptions import ClientError

    if not isinstance(error, ClientError):
        return False
    code = str(error.response.get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NotFound")


def _error_code(error: BaseException) -> str:
    from botocore.exceptions import ClientError

    if not isinstance(error, ClientError):
        return ""
    return str(error.response.get("Error", {}).get("Code", ""))


def _is_precondition_failed(error: BaseException) -> bool:
    return _error_code(error) in ("412", "PreconditionFailed")


def _is_range_not_satisfiable(error: BaseException) -> bool:
    return _error_code(error) in ("416", "InvalidRange")


class _HashingReader(io.RawIOBase):
    """Wraps a stream, hashing and counting what is read. Deliberately *not seekable*: that
    makes s3transfer read it strictly in order (one reader, parts uploaded concurrently), so
    the hash sees the bytes in the order they are stored."""

    def __init__(self, inner: IO[bytes], algorithm: HashAlgorithm = "sha256") -> None:
        self._inner = inner
        self.digest = new_hasher(algorithm)
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

    @functools.cached_property
    def client(self) -> Any:
        if self._client is not None:
            return self._client
        import boto3
        from botocore.config import Config

        config = Config(
            retries={"max_attempts": 8, "mode": "standard"},
            signature_version="s3v4",  # presigned URLs too (botocore presigns with SigV2 otherwise)
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

    @functools.cached_property
    def _plain_http(self) -> Any:
        """A urllib3 pool for `read_range`'s requests, or None where they must go through
        botocore (a proxy applies to the endpoint, which botocore knows how to cross).

        Why not `get_object`: botocore spends ~3 ms of CPU on every request (events, signing,
        response parsing — dates included), holding the GIL, and a data reader makes thousands
        of ranged GETs whose threads also parse rows; measured on moto, a SigV4 presigned URL
        (~0.4 ms: the client's own signer, addressing and credentials) sent by urllib3 costs
        ~1.4 ms in all. Retries: `_retrying`, 8 attempts; a status other than 206 becomes the
        `ClientError` botocore would raise, so both paths share their error handling.
        TLS verifies against `AWS_CA_BUNDLE` or botocore's bundle. A presigned URL lives 5 minutes
        and is logged nowhere by this code (urllib3 logs request lines only at DEBUG)."""
        import urllib.parse
        import urllib.request

        import urllib3

        endpoint = urllib.parse.urlsplit(self.client.meta.endpoint_url)
        if getattr(self.client.meta.config, "proxies", None) or (
                urllib.request.getproxies().get(endpoint.scheme)
                and not urllib.request.proxy_bypass(endpoint.hostname or "")):
            return None
        tls: dict[str, Any] = {}
        if endpoint.scheme == "https":
            from botocore.httpsession import get_cert_path

            tls = {"cert_reqs": "CERT_REQUIRED", "ca_certs": os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)}
        return urllib3.PoolManager(maxsize=max(10, self._multipart[2] * 2), retries=False,
                                   timeout=urllib3.Timeout(connect=10, read=120), **tls)

    def _plain_get(self, http: Any, key: str, headers: dict[str, str]) -> bytes:
        """One ranged GET through `_plain_http`; a status other than 206 raised as botocore's
        `ClientError` with S3's error code (the URL, which carries a signature, is not in it)."""
        url = self.client.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": key},
                                                 ExpiresIn=300)
        response = http.request("GET", url, headers=headers, decode_content=False)
        if response.status == 206:
            return response.data
        if response.status == 200:  # the whole object: a server that ignores Range is not S3
            raise ValueError(f"{self.uri}: the endpoint answered a ranged GET of {key!r} with the "
                             "whole object (HTTP 200, not 206); it does not support byte ranges")
        from botocore.exceptions import ClientError

        found = _S3_ERROR_CODE.search(response.data or b"")
        code = found.group(1).decode("ascii", "replace") if found else str(response.status)
        raise ClientError({"Error": {"Code": code, "Message": f"HTTP {response.status}"},
                           "ResponseMetadata": {"HTTPStatusCode": response.status}}, "GetObject")

    @functools.cached_property
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
                 sha256: str | None = None, algorithm: HashAlgorithm = "sha256",
                 expected: str | None = None) -> ObjectInfo:
        algorithm, expected = expected_digest(sha256, algorithm, expected)

        @_retrying
        def attempt() -> ObjectInfo:
            with open(path, "rb") as f:
                read_ahead(f)
                return self._upload_stream(key, f, algorithm)

        info = attempt()
        check_expected(info, expected, algorithm)
        if move:
            Path(path).unlink()
        return info

    def put_stream(self, key: str, stream: IO[bytes], *, algorithm: HashAlgorithm = "sha256"
                   ) -> ObjectInfo:
        # No whole-object retry: a consumed stream cannot be replayed (botocore still retries
        # each part, whose bytes s3transfer holds in memory).
        return self._upload_stream(key, stream, algorithm)

    def _upload_stream(self, key: str, stream: IO[bytes], algorithm: HashAlgorithm = "sha256"
                       ) -> ObjectInfo:
        reader = _HashingReader(stream, algorithm)
        self.client.upload_fileobj(reader, self.bucket, self._key(key), Config=self.transfer_config)
        return info_with(key, reader.size, reader.digest.hexdigest(), algorithm)

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
                return write_local_atomic(Path(dest), body, key)

        return attempt()

    def open_read(self, key: str) -> IO[bytes]:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            if _is_not_found(e):
                raise ObjectNotFoundError(f"no object {key!r} in {self.uri}") from e
            raise
        return io.BufferedReader(_S3Body(response["Body"]), buffer_size=1 << 20)

    def read_range(self, key: str, start: int, length: int, *, if_match: str | None = None) -> bytes:
        """One ranged GET (`Range: bytes=start-end`, `If-Match` the listed ETag), presigned and
        sent by urllib3 (`_plain_http` says why), retried whole on transient errors. Callers read
        a large object as many such ranges over parallel connections (the pool holds
        `2 · max_concurrency`)."""
        if start < 0 or length < 0:
            raise ValueError(f"byte range must be non-negative, got start={start} length={length}")
        if length == 0:
            return b""
        full, byte_range = self._key(key), f"bytes={start}-{start + length - 1}"
        quoted = None if if_match is None else f'"{if_match}"'
        http = self._plain_http

        def attempt() -> bytes:
            try:
                if http is not None:
                    headers = {"Range": byte_range} if quoted is None else {"Range": byte_range, "If-Match": quoted}
                    return self._plain_get(http, full, headers)
                extra = {} if quoted is None else {"IfMatch": quoted}
                response = self.client.get_object(Bucket=self.bucket, Key=full, Range=byte_range, **extra)
                with contextlib.closing(response["Body"]) as body:
                    return body.read()
            except Exception as e:
                if _is_not_found(e):
                    raise ObjectNotFoundError(f"no object {key!r} in {self.uri}") from e
                if _is_precondition_failed(e):
                    raise IntegrityError(f"{key}: its ETag is no longer {if_match}; the object was "
                                         "overwritten since it was listed") from e
                if _is_range_not_satisfiable(e):
                    return b""
                raise

        return _retrying(attempt, attempts=8)()  # 8: the plain path has no botocore retries beneath

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
                yield ObjectInfo(key, int(obj["Size"]), None, obj["LastModified"].timestamp(),
                                 str(obj.get("ETag", "")).strip('"') or None)

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
