"""`open_stream` against a real S3 endpoint (moto's server): a shard read as consecutive ranged
GETs, a few in flight (or, when it is one chunk, as one GET), is the object's bytes in order; a
shard deleted, overwritten or shrunk since the run listed it is named — on both paths."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.s3_server import S3Server
from trainyard.plugins.data.fetch import open_stream
from trainyard.plugins.data.manifest import ShardGoneError, ShardManifest, list_manifest
from trainyard.plugins.storage.store import S3Store

CHUNK = 1000


@pytest.fixture
def store(s3_server: S3Server) -> S3Store:
    return S3Store(s3_server.new_bucket("fetch"), "ds", endpoint_url=s3_server.endpoint_url)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as p:
        yield p


def shard_of(store: S3Store, data: bytes) -> ShardManifest:
    store.put_bytes("s.jsonl", data)
    return list_manifest(store, "jsonl")


@pytest.mark.parametrize("size", [0, 1, CHUNK, 10 * CHUNK + 7])
def test_the_stream_is_the_object_in_order(store: S3Store, pool: ThreadPoolExecutor, size: int) -> None:
    data = os.urandom(size)
    manifest = shard_of(store, data)
    counted: list[int] = []
    with open_stream(store, manifest, manifest.shards[0], pool, chunk_bytes=CHUNK, ahead=3,
                     on_bytes=counted.append) as f:
        assert f.read() == data
    assert sum(counted) == size and all(n <= CHUNK for n in counted)


def test_lines_iterate_across_chunk_boundaries(store: S3Store, pool: ThreadPoolExecutor) -> None:
    lines = [b'{"text": "%s"}\n' % (b"x" * n) for n in range(1, 300, 7)]
    manifest = shard_of(store, b"".join(lines))
    with open_stream(store, manifest, manifest.shards[0], pool, chunk_bytes=CHUNK) as f:
        assert list(f) == lines


@pytest.mark.parametrize("size", [CHUNK // 2, 5 * CHUNK])
@pytest.mark.parametrize(("change", "message"), [("delete", "is missing from the store"),
                                                ("overwrite", "has changed in the store")])
def test_a_shard_changed_after_listing_is_named(store: S3Store, pool: ThreadPoolExecutor, change: str,
                                                message: str, size: int) -> None:
    manifest = shard_of(store, os.urandom(size))
    if change == "delete":
        store.delete("s.jsonl")
    else:
        store.put_bytes("s.jsonl", os.urandom(size))
    with pytest.raises(ShardGoneError, match=rf"shard 's\.jsonl' of .* {message}"), \
            open_stream(store, manifest, manifest.shards[0], pool, chunk_bytes=CHUNK) as f:
        f.read()


@pytest.mark.parametrize(("size", "listed_size"), [(CHUNK // 3, CHUNK // 2), (3 * CHUNK, 4 * CHUNK + 1)])
def test_a_manifest_listing_more_bytes_than_the_object_has_is_named(store: S3Store, pool: ThreadPoolExecutor,
                                                                     size: int, listed_size: int) -> None:
    listed = shard_of(store, os.urandom(size))
    shard = listed.shards[0].model_copy(update={"size": listed_size, "etag": None})
    manifest = listed.model_copy(update={"shards": (shard,)})
    with pytest.raises(ShardGoneError, match=f"fewer bytes than the listed {listed_size}"), \
            open_stream(store, manifest, shard, pool, chunk_bytes=CHUNK) as f:
        f.read()
