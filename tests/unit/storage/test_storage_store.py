"""The object store contract, run against a local folder and a real S3 endpoint alike."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from tests.support.s3_server import S3Server
from trainyard.plugins.storage.errors import IntegrityError, ObjectNotFoundError, UnsafeKeyError
from trainyard.plugins.storage.store import (
    PARTIAL_MARKER,
    LocalStore,
    ObjectStore,
    S3Store,
    check_key,
    open_store,
    split_uri,
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_bytes_round_trip(store: ObjectStore) -> None:
    info = store.put_bytes("a/b/c.txt", b"hello")
    assert (info.key, info.size, info.sha256) == ("a/b/c.txt", 5, _sha(b"hello"))
    assert store.get_bytes("a/b/c.txt") == b"hello"
    assert store.exists("a/b/c.txt")
    assert not store.exists("a/b/missing.txt")
    store.put_bytes("a/b/c.txt", b"replaced")
    assert store.get_bytes("a/b/c.txt") == b"replaced"


def test_empty_object(store: ObjectStore, tmp_path: Path) -> None:
    store.put_bytes("empty", b"")
    assert store.get_bytes("empty") == b""
    info = store.get_file("empty", tmp_path / "out")
    assert (info.size, info.sha256) == (0, _sha(b""))


def test_put_file_hashes_while_streaming_multipart(store: ObjectStore, tmp_path: Path) -> None:
    """12 MiB crosses the 5 MiB multipart threshold of the S3 fixture: three parts."""
    data = os.urandom(12 << 20)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    info = store.put_file("ckpt/big.bin", src)
    assert (info.size, info.sha256) == (len(data), _sha(data))

    dest = tmp_path / "down" / "big.bin"
    got = store.get_file("ckpt/big.bin", dest)
    assert (got.size, got.sha256) == (len(data), _sha(data))
    assert dest.read_bytes() == data
    with store.open_read("ckpt/big.bin") as f:
        assert f.read(10) == data[:10]
        assert f.read() == data[10:]


def test_put_stream_of_unknown_length(store: ObjectStore) -> None:
    class Trickle:
        """A non-seekable stream that returns short reads, like a decompressor."""

        def __init__(self, data: bytes) -> None:
            self.data, self.pos = data, 0

        def read(self, n: int = -1) -> bytes:
            n = 7919 if n < 0 else min(n, 7919)
            out = self.data[self.pos:self.pos + n]
            self.pos += len(out)
            return out

    data = os.urandom((6 << 20) + 123)
    info = store.put_stream("s/x", Trickle(data))  # type: ignore[arg-type]
    assert (info.size, info.sha256) == (len(data), _sha(data))
    assert store.get_bytes("s/x") == data


def test_list_is_a_sorted_string_prefix_scan(store: ObjectStore) -> None:
    for key in ["step-00000002/MANIFEST.json", "step-00000001/b", "step-00000001/a", "other/x",
                "step-00000010/a"]:
        store.put_bytes(key, key.encode())
    keys = [i.key for i in store.list("step-0000000")]
    assert keys == ["step-00000001/a", "step-00000001/b", "step-00000002/MANIFEST.json"]
    assert [i.key for i in store.list("step-00000001/")] == ["step-00000001/a", "step-00000001/b"]
    everything = list(store.list())
    assert len(everything) == 5
    assert all(i.size == len(i.key) for i in everything)
    assert all(i.mtime is not None for i in everything)
    assert list(store.list("nothing-here/")) == []


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.put_bytes("d/x", b"1")
    store.delete("d/x")
    store.delete("d/x")
    store.delete("never/existed")
    assert not store.exists("d/x")
    assert list(store.list("d/")) == []


def test_missing_objects_raise_file_not_found(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFoundError):
        store.get_bytes("nope")
    with pytest.raises(FileNotFoundError):
        store.get_file("nope", tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        store.open_read("nope")
    assert not (tmp_path / "x").exists()


def test_child_store_shares_objects_under_its_prefix(store: ObjectStore) -> None:
    jobs = store.child("jobs/demo")
    jobs.put_bytes("checkpoints/a", b"x")
    assert store.get_bytes("jobs/demo/checkpoints/a") == b"x"
    assert jobs.uri == store.uri + "/jobs/demo"
    assert jobs.key_uri("checkpoints/a") == store.uri + "/jobs/demo/checkpoints/a"
    reopened = open_store(jobs.uri, endpoint_url=getattr(store, "endpoint_url", None))
    assert reopened.get_bytes("checkpoints/a") == b"x"
    assert [i.key for i in jobs.list()] == ["checkpoints/a"]


@pytest.mark.parametrize("key", ["../etc/passwd", "/etc/passwd", "a/../../b", "a//b", "a/./b",
                                 "", "a\\b", f"x{PARTIAL_MARKER}1", "a/"])
def test_unsafe_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(UnsafeKeyError):
        store.put_bytes(key, b"x")
    with pytest.raises(ValueError):  # UnsafeKeyError is a ValueError for callers that don't know it
        store.get_bytes(key)


def test_unsafe_child_and_list_prefixes_are_refused(store: ObjectStore) -> None:
    with pytest.raises(UnsafeKeyError):
        store.child("../sibling")
    with pytest.raises(UnsafeKeyError):
        list(store.list("../"))


def test_concurrent_writers_never_expose_partial_objects(store: ObjectStore) -> None:
    """Readers racing two writers see one whole version or the other, never a mix."""
    a, b = b"A" * (1 << 20), b"B" * (1 << 20)
    store.put_bytes("race", a)
    stop = threading.Event()
    seen: set[bytes] = set()

    def reader() -> None:
        while not stop.is_set():
            data = store.get_bytes("race")
            seen.add(data[:1] + data[-1:] + str(len(data)).encode())

    t = threading.Thread(target=reader)
    t.start()
    for i in range(10):
        store.put_bytes("race", a if i % 2 else b)
    stop.set()
    t.join()
    assert seen
    assert seen <= {b"AA1048576", b"BB1048576"}


def test_local_store_leaves_no_temp_files_and_tidies_folders(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    store.put_bytes("x/y/z", b"1")
    assert [p.name for p in (tmp_path / "root/x/y").iterdir()] == ["z"]
    store.delete("x/y/z")
    assert list((tmp_path / "root").iterdir()) == []


def test_local_store_failed_write_keeps_the_old_object(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes("k", b"old")

    class Broken:
        def read(self, n: int = -1) -> bytes:
            raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        store.put_stream("k", Broken())  # type: ignore[arg-type]
    assert store.get_bytes("k") == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["k"]


def test_open_store_forms(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert open_store(tmp_path).uri == tmp_path.as_uri()
    assert open_store(tmp_path.as_uri()).uri == tmp_path.as_uri()
    s3 = open_store("s3://bucket/some/prefix/", endpoint_url="http://127.0.0.1:1")
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix, s3.uri) == ("bucket", "some/prefix", "s3://bucket/some/prefix")
    with pytest.raises(ValueError, match="3 characters"):
        open_store("s3://ab/x")
    with pytest.raises(ValueError, match="scheme"):
        open_store("gs://bucket/x")
    with pytest.raises(ValueError, match="host"):
        open_store("file://otherhost/x")
    with pytest.raises(ValueError, match=r"\.\."):
        open_store("file:///tmp/a/../b")
    with pytest.raises(ValueError, match=r"\.\."):
        open_store("s3://bucket/a/../b")


def test_check_key_and_split_uri() -> None:
    assert check_key("step-00000001/__0_0.distcp") == "step-00000001/__0_0.distcp"
    assert check_key("", prefix=True) == ""
    assert check_key("step-", prefix=True) == "step-"
    assert split_uri("s3://b/jobs/j/step-1/MANIFEST.json") == ("s3://b/jobs/j/step-1", "MANIFEST.json")
    with pytest.raises(ValueError):
        split_uri("s3://")


def test_put_file_move_and_known_hash(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    src = tmp_path / "staged.bin"
    src.write_bytes(data)
    with pytest.raises(IntegrityError, match="changed before it was uploaded"):
        store.put_file("k", src, sha256="0" * 64)  # a copy/stream checks the writer's hash
    info = store.put_file("k", src, move=True, sha256=_sha(data))
    assert (info.size, info.sha256) == (len(data), _sha(data))
    assert not src.exists(), "move=True gives the file up"
    assert store.get_bytes("k") == data


def test_put_file_and_put_stream_hash_with_the_algorithm_asked_for(store: ObjectStore,
                                                                     tmp_path: Path) -> None:
    """Checkpoint files are hashed with BLAKE3: a store that streams them computes that digest
    (not SHA-256) and checks the writer's against it; one that adopts them keeps the writer's."""
    import io

    from blake3 import blake3

    data = os.urandom((1 << 20) + 3)
    src = tmp_path / "staged.bin"
    src.write_bytes(data)
    with pytest.raises(IntegrityError, match="streamed blake3"):
        store.put_file("k", src, algorithm="blake3", expected="0" * 64)
    info = store.put_file("k", src, algorithm="blake3")
    assert (info.size, info.blake3, info.sha256) == (len(data), blake3(data).hexdigest(), None)
    assert info.digest("blake3") == info.blake3 and info.digest("sha256") is None
    info = store.put_file("k2", src, move=True, algorithm="blake3", expected=blake3(data).hexdigest())
    assert (info.blake3, store.get_bytes("k2")) == (blake3(data).hexdigest(), data)
    info = store.put_stream("k3", io.BytesIO(data), algorithm="blake3")
    assert info.blake3 == blake3(data).hexdigest()
    with pytest.raises(ValueError, match="not both"):
        store.put_file("k4", tmp_path, sha256="0" * 64, algorithm="blake3")


def test_local_store_adopts_a_moved_file_without_copying(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "staged.bin"
    src.write_bytes(b"x" * 1000)
    inode = src.stat().st_ino
    store.put_file("a/b", src, move=True)
    assert store.path_of("a/b").stat().st_ino == inode
    link = tmp_path / "restore" / "b"
    link.parent.mkdir()
    assert store.link_to("a/b", link) and link.stat().st_ino == inode
    store.put_bytes("a/b", b"new")  # replaced by rename: the link keeps the old bytes
    assert link.read_bytes() == b"x" * 1000


def test_local_store_copies_a_moved_file_a_rename_cannot_reach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One device under two mount points (a pod's emptyDir staging beside the store's folder on
    a shared filesystem): the kernel refuses the rename with EXDEV though st_dev is the same;
    the bytes are copied instead, and the staged file still given up."""
    import errno

    from trainyard.plugins.storage import local

    store = LocalStore(tmp_path / "store")
    src = tmp_path / "staged.bin"
    src.write_bytes(b"y" * 5000)
    real_replace = os.replace

    def across_mounts(a: object, b: object) -> None:
        if Path(a) == src:  # type: ignore[arg-type]
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(a))
        real_replace(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(local.os, "replace", across_mounts)
    info = store.put_file("a/b", src, move=True, sha256=_sha(b"y" * 5000))
    assert (info.size, store.get_bytes("a/b")) == (5000, b"y" * 5000)
    assert not src.exists(), "move=True gives the file up"


def test_transient_s3_errors_are_told_apart_and_retried(s3_server: object) -> None:
    """botocore retries each request; a body that breaks mid-stream is retried whole."""
    from botocore.exceptions import ClientError, ReadTimeoutError

    from trainyard.plugins.storage.s3 import _is_transient

    def client_error(status: int, code: str) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                           "GetObject")

    assert _is_transient(client_error(503, "SlowDown"))
    assert _is_transient(client_error(500, "InternalError"))
    assert not _is_transient(client_error(404, "NoSuchKey"))
    assert not _is_transient(client_error(403, "AccessDenied"))
    assert _is_transient(ReadTimeoutError(endpoint_url="http://x"))
    assert not _is_transient(ValueError("bad"))

    server = s3_server  # a real endpoint; only the first read of a body fails
    store = S3Store(server.new_bucket(), "p", endpoint_url=server.endpoint_url)  # type: ignore[attr-defined]
    store.put_bytes("k", b"payload")
    real_get = store.client.get_object
    calls = []

    def flaky_get(**kwargs: object) -> object:
        calls.append(kwargs)
        if len(calls) == 1:
            raise ReadTimeoutError(endpoint_url=server.endpoint_url)  # type: ignore[attr-defined]
        return real_get(**kwargs)

    store.client.get_object = flaky_get  # type: ignore[method-assign]
    assert store.get_bytes("k") == b"payload"
    assert len(calls) == 2


def test_ranged_reads_and_etags(store: ObjectStore) -> None:
    """`read_range` returns the asked bytes (fewer at the end), and `if_match` with the listed
    etag refuses an object overwritten since it was listed (on S3: over plain, presigned
    requests, never botocore's `get_object`)."""
    if isinstance(store, S3Store):
        assert store._plain_http is not None
        store.client.get_object = _refuse  # type: ignore[method-assign]
    _check_ranged_reads(store)


def test_s3_ranged_reads_through_botocore(s3_server: S3Server) -> None:
    """The same through `get_object`: the path ranged reads take behind a proxy."""
    store = S3Store(s3_server.new_bucket(), "p", endpoint_url=s3_server.endpoint_url)
    store.__dict__["_plain_http"] = None
    _check_ranged_reads(store)


def _check_ranged_reads(store: ObjectStore) -> None:
    data = bytes(range(256)) * 40
    store.put_bytes("r/blob", data)
    (info,) = list(store.list("r/"))
    assert info.etag
    assert store.read_range("r/blob", 100, 50, if_match=info.etag) == data[100:150]
    assert store.read_range("r/blob", len(data) - 10, 100) == data[-10:]
    assert store.read_range("r/blob", len(data), 10) == b""
    store.put_bytes("r/blob", data[::-1] + b"x")
    with pytest.raises(IntegrityError, match="r/blob"):
        store.read_range("r/blob", 0, 10, if_match=info.etag)
    with pytest.raises(ObjectNotFoundError, match="r/missing"):
        store.read_range("r/missing", 0, 10)


def _refuse(**kwargs: object) -> object:
    raise AssertionError(f"botocore's get_object was called: {kwargs}")


def test_s3_ranged_reads_take_botocore_only_behind_a_proxy(s3_server: S3Server,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy that applies to the endpoint sends ranged reads through botocore (which knows how
    to cross it); one that the endpoint bypasses (NO_PROXY) leaves them on the plain pool."""
    for var in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    host = s3_server.endpoint_url.split("//")[1].split(":")[0]
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert S3Store("bucket", endpoint_url=s3_server.endpoint_url)._plain_http is None
    monkeypatch.setenv("NO_PROXY", host)
    assert S3Store("bucket", endpoint_url=s3_server.endpoint_url)._plain_http is not None


def test_s3_ranged_read_retries_a_dropped_body(s3_server: S3Server) -> None:
    """A connection broken mid-body (urllib3's ProtocolError) is retried; S3's refusal (a missing
    bucket) is not, and its error names S3's code but never the presigned URL, which carries a
    signature."""
    from botocore.exceptions import ClientError
    from urllib3.exceptions import ProtocolError

    store = S3Store(s3_server.new_bucket(), "p", endpoint_url=s3_server.endpoint_url)
    store.put_bytes("k", b"payload")
    real, calls = store._plain_get, []

    def dropped_once(*args: object) -> bytes:
        calls.append(args)
        if len(calls) == 1:
            raise ProtocolError("Connection broken: IncompleteRead(3 bytes read, 4 more expected)")
        return real(*args)  # type: ignore[arg-type]

    store._plain_get = dropped_once  # type: ignore[method-assign]
    assert store.read_range("k", 3, 4) == b"load"
    assert len(calls) == 2

    missing = S3Store(f"no-such-{s3_server.new_bucket()}", endpoint_url=s3_server.endpoint_url)
    real, calls = missing._plain_get, []
    missing._plain_get = dropped_once  # type: ignore[method-assign]
    calls.append("not dropped")  # the first call is not the one that drops
    with pytest.raises(ClientError, match="NoSuchBucket") as refused:
        missing.read_range("k", 0, 4)
    assert len(calls) == 2  # one request: not retried
    assert "Signature" not in str(refused.value) and "X-Amz" not in str(refused.value)
