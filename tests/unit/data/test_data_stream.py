"""The streaming reader against a real S3 endpoint (moto's server) and a local store: exact
order, resume on any data-parallel size, cache bounds, eviction, corruption and lost shards."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.datasets import write_jsonl_dataset
from tests.support.s3_server import S3Server
from trainyard.plugins.data.cache import ShardCache
from trainyard.plugins.data.documents import END, iter_documents
from trainyard.plugins.data.manifest import ShardGoneError, list_manifest
from trainyard.plugins.data.reader import StreamingReader
from trainyard.plugins.storage.store import ObjectStore, S3Store, open_store

SEQ = 63


@pytest.fixture(params=["s3", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return open_store((tmp_path / "objects").as_uri())
    server: S3Server = request.getfixturevalue("s3_server")
    return S3Store(server.new_bucket("data"), "ds", endpoint_url=server.endpoint_url)


def reader(store: ObjectStore, cache_dir: Path, *, rank: int = 0, size: int = 1, batch: int = 4,
           cache_bytes: int = 1 << 30, **kw: object) -> StreamingReader:
    cache = ShardCache(cache_dir, cache_bytes, chunk_bytes=4096)
    return StreamingReader(store, "jsonl", cache=cache, seq_len=SEQ, batch_size=batch, dp_rank=rank,
                           dp_size=size, seed=7, shuffle_block=8, **kw)  # type: ignore[arg-type]


def global_samples(readers: list[StreamingReader], steps: int) -> Iterator[bytes]:
    """The global stream as the ranks consumed it: step by step, rank k's j-th sample is the
    stream's (j · size + k)-th of the step."""
    for _ in range(steps):
        batches = [r.next_batch().samples for r in readers]
        for j in range(len(batches[0])):
            for b in batches:
                yield bytes(b[j])


def epoch_samples(store: ObjectStore, cache_dir: Path) -> list[bytes]:
    r = reader(store, cache_dir, batch=1, stripes=1)
    out = []
    while r.position.epoch == 0:
        out.append(bytes(r.next_batch().samples[0]))
    r.close()
    return out[:-1]  # the last one read is epoch 1's first


def test_one_epoch_is_every_sample_once_in_a_shuffled_order(store: ObjectStore, tmp_path: Path) -> None:
    write_jsonl_dataset(store, shards=5, rows=30)
    epoch = epoch_samples(store, tmp_path / "c")
    assert len(epoch) == len(set(epoch)) > 100  # distinct samples
    r = reader(store, tmp_path / "c2", batch=len(epoch))
    second = [bytes(s) for s in r.next_batch().samples]
    assert second == epoch and r.position.epoch == 0 and r.position.offset == len(epoch)
    third = [bytes(s) for s in r.next_batch().samples]
    r.close()
    assert sorted(third) == sorted(epoch) and third != epoch  # epoch 1: same samples, new order


@pytest.mark.parametrize(("before", "after"), [(2, 2), (2, 1), (1, 2), (2, 3)])
def test_resume_on_another_data_parallel_size_continues_the_global_order(
        store: ObjectStore, tmp_path: Path, before: int, after: int) -> None:
    write_jsonl_dataset(store, shards=3, rows=10)
    reference = list(global_samples([reader(store, tmp_path / "ref", batch=12, stripes=1)], 12))
    first = [reader(store, tmp_path / "a", rank=r, size=before, batch=12 // before, stripes=1)
             for r in range(before)]
    seen = list(global_samples(first, 5))
    states = [r.state_dict() for r in first]
    assert all(s == states[0] for s in states)  # the same on every rank
    for r in first:
        r.close()
    second = [reader(store, tmp_path / "a", rank=r, size=after, batch=12 // after) for r in range(after)]
    for r in second:
        r.load_state_dict(states[0])  # one stripe, from the checkpoint, whatever the new size
    seen += list(global_samples(second, 7))
    assert seen == reference  # nothing repeated, nothing skipped, across epochs too
    n_epoch = len(epoch_samples(store, tmp_path / "e"))
    assert len(seen) > n_epoch and sorted(seen[:n_epoch]) == sorted(set(seen[:n_epoch]))


def test_a_dataset_larger_than_the_cache_streams_within_the_cache_limit(store: ObjectStore, tmp_path: Path) -> None:
    total = write_jsonl_dataset(store, shards=10, rows=40)
    shard_bytes = total // 10
    r = reader(store, tmp_path / "c", cache_bytes=3 * shard_bytes + 100, batch=8)
    for _ in range(200):  # more than one epoch
        r.next_batch()
        assert r.cache.used_bytes() <= r.cache.max_bytes
    stats = r.cache.stats
    r.close()
    assert stats.evictions > 0 and stats.misses >= 10 and stats.bytes_fetched >= total


@pytest.mark.parametrize(("change", "message"), [("delete", "is missing from the store"),
                                                ("overwrite", "has changed in the store")])
def test_a_shard_deleted_or_overwritten_mid_epoch_is_named(store: ObjectStore, tmp_path: Path, change: str,
                                                           message: str) -> None:
    write_jsonl_dataset(store, shards=20, rows=20)
    # The reader reads ahead of its consumer (the producer gathers up to HANDOVER_BLOCKS shards'
    # windows per hand-over — one block per shard this small — and the next prefetch_shards are
    # fetched meanwhile) even while nobody takes a batch: under load, 6 or 8 shards were all read
    # while the test was still changing them. With one stripe (each stripe reads ahead), 20
    # shards leave most of them unread when the first batch is out.
    r = reader(store, tmp_path / "c", batch=2, prefetch_batches=1, stripes=1)
    r.next_batch()
    # The shards not yet committed (a JSONL shard's bytes are not kept: its token copy is the
    # sign); those in flight may still finish from the bytes they read before the change.
    gone = [s.key for s in r.manifest.shards  # type: ignore[union-attr]
            if not r.cache.tokens_path(r.manifest, s, r.variant).exists()]  # type: ignore[arg-type]
    assert gone
    for key in gone:
        if change == "delete":
            store.delete(key)
        else:
            store.put_bytes(key, b'{"text": "other data"}\n')
    with pytest.raises(ShardGoneError, match=rf"shard 'shard-000\d\d\.jsonl' of .* {message}") as first:
        for _ in range(2000):  # an epoch is ~620 batches
            r.next_batch()
    with pytest.raises(ShardGoneError) as again:  # every later call fails the same way
        r.next_batch()
    assert again.value is first.value
    r.close()


def test_a_corrupted_cache_entry_is_detected_and_fetched_again(store: ObjectStore, tmp_path: Path) -> None:
    write_jsonl_dataset(store, shards=2, rows=20)
    manifest = list_manifest(store, "jsonl")
    cache = ShardCache(tmp_path / "c", 1 << 30)
    shard = manifest.shards[0]
    original = cache.open(store, manifest, shard).read()
    path = cache.path_of(manifest, shard)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF  # same size, one flipped bit
    path.write_bytes(bytes(data))
    assert cache.open(store, manifest, shard).read() == original
    assert (cache.stats.corrupt, cache.stats.misses, cache.stats.hits) == (1, 2, 0)
    assert cache.open(store, manifest, shard).read() == original and cache.stats.hits == 1


def test_the_manifest_from_the_checkpoint_wins_over_a_changed_prefix(store: ObjectStore, tmp_path: Path) -> None:
    write_jsonl_dataset(store, shards=3, rows=20)
    r = reader(store, tmp_path / "c")
    r.next_batch()
    state = r.state_dict()
    r.close()
    write_jsonl_dataset(store, shards=1, rows=20, prefix="new-")  # a shard added later
    resumed = reader(store, tmp_path / "c")
    resumed.load_state_dict(state)
    resumed.next_batch()
    assert resumed.manifest is not None and len(resumed.manifest.shards) == 3
    resumed.close()
    mismatched = StreamingReader(store, "jsonl", cache=ShardCache(tmp_path / "c", 1 << 30), seq_len=SEQ + 1,
                                 batch_size=4, dp_rank=0, dp_size=1, seed=7)
    with pytest.raises(ValueError, match="seq_len"):
        mismatched.load_state_dict(state)


def test_formats_jsonl_zstd_text_and_parquet(tmp_path: Path) -> None:
    import zstandard

    def docs(data: bytes, key: str, fmt: str) -> list[bytes | object]:
        return list(iter_documents(io.BytesIO(data), key, fmt))

    jsonl = b'{"text": "a"}\n\n{"text": "\xc3\xa9"}\n'
    assert docs(jsonl, "x.jsonl", "jsonl") == [b"a", END, "é".encode(), END]
    assert docs(zstandard.ZstdCompressor().compress(jsonl), "x.jsonl.zst", "jsonl") == [b"a", END, "é".encode(), END]
    assert docs(b"hello\nworld", "x.txt", "text") == [b"hello\nworld", END]
    with pytest.raises(ValueError, match=r"x\.jsonl:1: not JSON"):
        docs(b"nope\n", "x.jsonl", "jsonl")

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": ["one", "two", "three"], "n": [1, 2, 3]}), buf, row_group_size=2)
    assert docs(buf.getvalue(), "x.parquet", "parquet") == [b"one", END, b"two", END, b"three", END]
    with pytest.raises(ValueError, match="no column 'body'"):
        list(iter_documents(io.BytesIO(buf.getvalue()), "x.parquet", "parquet", "body"))


@pytest.mark.parametrize("fmt", ["parquet", "jsonl.zst", "text"])
def test_every_format_streams_through_the_cache(store: ObjectStore, tmp_path: Path, fmt: str) -> None:
    """The same documents as parquet row groups, zstd JSONL or text files give the same windows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [f"document {i} " + "x" * (40 + i) for i in range(30)]
    if fmt == "parquet":
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": docs}), buf, row_group_size=7)
        store.put_bytes("a.parquet", buf.getvalue())
    elif fmt == "jsonl.zst":
        import json

        import zstandard

        lines = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
        store.put_bytes("a.jsonl.zst", zstandard.ZstdCompressor().compress(lines))
    else:
        # One text file is one document; to compare, write one file per document.
        for i, d in enumerate(docs):
            store.put_bytes(f"a-{i:03d}.txt", d.encode())
    fmt_name = fmt.split(".")[0]
    r = StreamingReader(store, fmt_name, cache=ShardCache(tmp_path / "c", 1 << 20), seq_len=15,
                        batch_size=1, dp_rank=0, dp_size=1, seed=3, shuffle_block=1)
    got = []
    while r.position.epoch == 0:
        got.append(bytes(r.next_batch().samples[0]))
    r.close()
    stream = b"".join(d.encode() + b"\x00" for d in docs)
    if fmt_name == "text":  # shards are visited in a shuffled order and cut separately
        expected = sorted(doc[k:k + 16] for doc in (d.encode() + b"\x00" for d in docs)
                          for k in range(0, len(doc) - 15, 15))
        assert sorted(got[:-1]) == expected
    else:
        assert got[:-1] == [stream[k:k + 16] for k in range(0, len(stream) - 15, 15)]


def test_ranks_of_a_node_share_the_cache_and_fetch_each_shard_once(store: ObjectStore, tmp_path: Path) -> None:
    """Four readers (as four ranks: separate `ShardCache` objects, separate lock descriptors —
    `flock` excludes them as it does processes) open every shard at once: each shard is
    downloaded once, the others wait on its entry lock and get a hit."""
    import threading

    total = write_jsonl_dataset(store, shards=6, rows=40)
    manifest = list_manifest(store, "jsonl")
    caches = [ShardCache(tmp_path / "shared", 1 << 30, chunk_bytes=1024) for _ in range(4)]
    barrier = threading.Barrier(len(caches))
    contents: list[list[bytes]] = [[] for _ in caches]

    def rank(i: int) -> None:
        barrier.wait()
        for shard in manifest.shards:
            with caches[i].open(store, manifest, shard) as f:
                contents[i].append(f.read())

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(len(caches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(c == contents[0] for c in contents) and len(contents[0]) == 6
    assert sum(c.stats.bytes_fetched for c in caches) == total
    assert sum(c.stats.misses for c in caches) == 6 and sum(c.stats.hits for c in caches) == 18


@pytest.mark.parametrize("length", [0, 63, 64, 65, 127, 128, 1000])
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32"])
def test_windows_are_numpys_sliding_windows_every_seq_len(length: int, dtype: str) -> None:
    import numpy as np

    from trainyard.plugins.data.stream import windows_of

    for tokens in (np.arange(length, dtype=dtype), np.arange(2 * length, dtype=dtype)[::2]):
        expected = np.lib.stride_tricks.sliding_window_view(tokens, SEQ + 1)[::SEQ] \
            if length > SEQ else np.empty((0, SEQ + 1), dtype)
        got = windows_of(tokens, SEQ)
        assert got.shape == expected.shape and np.array_equal(got, expected)
        assert not got.flags.writeable
