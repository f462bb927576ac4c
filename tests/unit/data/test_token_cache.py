"""Tokenized shards in the node cache: a shard is parsed once per node (the next epoch and the
other ranks memory-map its token ids), a corrupted copy is dropped and parsed again, and the
block order a checkpoint names is the one a resume keeps."""

from __future__ import annotations

import hashlib
import io
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.support.datasets import write_jsonl_dataset
from trainyard.plugins.data.cache import ChunkHasher, ShardCache, chunks_digest
from trainyard.plugins.data.documents import END, ByteTokenizer
from trainyard.plugins.data.reader import StreamingReader
from trainyard.plugins.data.stream import ORDER_VERSION, block_permutation
from trainyard.plugins.storage.store import ObjectStore, open_store


class CountingTokenizer(ByteTokenizer):
    """The byte tokenizer, counting the documents it encodes (parses, across threads)."""

    def __init__(self) -> None:
        self.documents = 0
        self._lock = threading.Lock()

    def encode_pieces(self, pieces: list[bytes | object]) -> np.ndarray:
        with self._lock:
            self.documents += sum(1 for p in pieces if p is END)
        return super().encode_pieces(pieces)  # type: ignore[arg-type]

    def encode_documents(self, texts: list[str]) -> np.ndarray:  # a jsonl shard's block of rows
        with self._lock:
            self.documents += len(texts)
        return super().encode_documents(texts)


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    store = open_store((tmp_path / "objects").as_uri())
    write_jsonl_dataset(store, shards=4, rows=20)
    return store


def _reader(store: ObjectStore, cache: ShardCache, tokenizer: ByteTokenizer, batch_size: int = 4,
            **kw: object) -> StreamingReader:
    return StreamingReader(store, "jsonl", cache=cache, seq_len=31, batch_size=batch_size, dp_rank=0, dp_size=1,
                           seed=1, shuffle_block=8, tokenizer=tokenizer, **kw)  # type: ignore[arg-type]


def _token_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if "-tokens-" in p.name and not p.name.endswith((".json", ".lock")))


def _epochs(reader: StreamingReader, epochs: int) -> list[bytes]:
    out = []
    while reader.position.epoch < epochs:
        out += [bytes(s) for s in reader.next_batch().samples]
    return out


def test_the_next_epoch_reads_tokens_not_rows(store: ObjectStore, tmp_path: Path) -> None:
    tokenizer = CountingTokenizer()
    reader = _reader(store, ShardCache(tmp_path / "c", 1 << 30), tokenizer)
    _epochs(reader, 3)
    reader.close()
    assert tokenizer.documents == 4 * 20  # every row parsed once, for three epochs
    assert len(_token_files(tmp_path / "c")) == 4


def test_the_ranks_of_a_node_parse_each_shard_once(store: ObjectStore, tmp_path: Path) -> None:
    tokenizer = CountingTokenizer()
    readers = [StreamingReader(store, "jsonl", cache=ShardCache(tmp_path / "shared", 1 << 30), seq_len=31,
                               batch_size=2, dp_rank=r, dp_size=4, seed=1, shuffle_block=8, tokenizer=tokenizer,
                               stripes=1)  # every rank reads every shard: the case to share
               for r in range(4)]
    samples: list[list[bytes]] = [[] for _ in readers]

    def rank(i: int) -> None:
        samples[i] = _epochs(readers[i], 1)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in readers:
        r.close()
    assert tokenizer.documents == 4 * 20  # not 4 × 4 × 20: the others waited, then read tokens
    single = _reader(store, ShardCache(tmp_path / "alone", 1 << 30), ByteTokenizer(), batch_size=8)
    alone = _epochs(single, 1)
    single.close()
    assert sorted(s for rank in samples for s in rank) == sorted(alone)


def test_a_corrupted_token_file_is_dropped_and_parsed_again(store: ObjectStore, tmp_path: Path) -> None:
    writer = _reader(store, ShardCache(tmp_path / "c", 1 << 30), ByteTokenizer())
    first = _epochs(writer, 1)
    writer.close()  # its prefetch threads would otherwise find the damage first
    victim = _token_files(tmp_path / "c")[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    tokenizer = CountingTokenizer()
    cache = ShardCache(tmp_path / "c", 1 << 30)
    reader = _reader(store, cache, tokenizer)
    again = _epochs(reader, 1)
    reader.close()
    assert again == first and cache.stats.corrupt == 1 and tokenizer.documents == 20  # one shard re-parsed


def test_a_process_hashes_a_token_file_once_and_a_rewritten_one_again(
        store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.plugins.data import cache as cache_module

    hashed: list[str] = []
    real = cache_module.chunks_digest
    monkeypatch.setattr(cache_module, "chunks_digest",
                        lambda f, chunk, algorithm: hashed.append(Path(f.name).name) or real(f, chunk, algorithm))
    writer = _reader(store, ShardCache(tmp_path / "c", 1 << 30), ByteTokenizer())
    first = _epochs(writer, 1)
    _epochs(writer, 2)  # epochs 2 and 3 hit the files this process wrote
    writer.close()
    assert hashed == [] and len(_token_files(tmp_path / "c")) == 4

    victim = _token_files(tmp_path / "c")[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))  # a new mtime: another file as far as the cache knows
    cache = ShardCache(tmp_path / "c", 1 << 30)
    reader = _reader(store, cache, ByteTokenizer())
    assert _epochs(reader, 1) == first
    reader.close()
    assert hashed == [victim.name] and cache.stats.corrupt == 1

    monkeypatch.setattr(cache_module, "_known_files", set())  # another process: hashes each once
    again = _reader(store, ShardCache(tmp_path / "c", 1 << 30), ByteTokenizer())
    _epochs(again, 2)
    again.close()
    assert len(hashed) == 1 + 4


def test_a_warm_epoch_opens_known_copies_in_the_producer_and_hashes_others_on_prefetch_threads(
        store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy this process verified is opened where the batches are cut (a hand-over to a thread
    cost more than the open); one it must hash first still goes to a prefetch thread, so a hash
    never holds up the cut, and a corrupt one is still caught there."""
    from trainyard.plugins.data import cache as cache_module

    writer = _reader(store, ShardCache(tmp_path / "c", 1 << 30), ByteTokenizer())
    first = _epochs(writer, 1)
    # Closed: a prefetch of its still queued after `_known_files` is emptied below would hash a
    # copy on a thread of the same name (seen once in ~100 runs: five hashes, not four).
    writer.close()
    warm = _reader(store, ShardCache(tmp_path / "c", 1 << 30), ByteTokenizer())
    submitted: list[str] = []
    real_submit = warm._fill_pool.submit
    monkeypatch.setattr(warm._fill_pool, "submit", lambda fn, shard, **kw: submitted.append(shard.key)
                        or real_submit(fn, shard, **kw))
    assert _epochs(warm, 1) == first
    warm.close()
    assert submitted == [] and warm.cache.stats.hits >= 4, warm.cache.stats

    hashed_on: list[str] = []
    real_hash = cache_module.chunks_digest
    monkeypatch.setattr(cache_module, "chunks_digest",
                        lambda f, chunk, algorithm: hashed_on.append(threading.current_thread().name)
                        or real_hash(f, chunk, algorithm))
    monkeypatch.setattr(cache_module, "_known_files", set())  # as another process finds them
    victim = _token_files(tmp_path / "c")[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    cache = ShardCache(tmp_path / "c", 1 << 30)
    # Two ahead, fewer than the four shards: with as many ahead as shards, the prefetch of the
    # next epoch's first shard (this epoch's first too, by chance) would hash it first.
    cold = _reader(store, cache, ByteTokenizer(), prefetch_shards=2)
    assert _epochs(cold, 1) == first
    cold.close()
    # the epoch's first shard is read before anything prefetched it; the other three on prefetch threads
    producer = [n for n in hashed_on if n.startswith("data-producer")]
    assert len(hashed_on) == 4 and len(producer) == 1, hashed_on
    assert all(n.startswith("shard-prefetch") for n in hashed_on if n not in producer), hashed_on
    assert cache.stats.corrupt == 1


def test_a_checkpoint_without_an_order_resumes_in_the_first_readers_order(store: ObjectStore, tmp_path: Path) -> None:
    old = _reader(store, ShardCache(tmp_path / "a", 1 << 30), ByteTokenizer())
    old.order = 1  # as a reader before version 2 did
    reference = _epochs(old, 2)
    old.close()
    before = _reader(store, ShardCache(tmp_path / "b", 1 << 30), ByteTokenizer())
    before.order = 1
    seen = [bytes(s) for _ in range(5) for s in before.next_batch().samples]
    state = before.state_dict()
    before.close()
    del state["order"]  # what an older checkpoint holds
    after = _reader(store, ShardCache(tmp_path / "b", 1 << 30), ByteTokenizer())
    after.load_state_dict(state)
    assert after.order == 1
    seen += _epochs(after, 2)
    assert seen == reference
    with pytest.raises(ValueError, match="sample order is version 9"):
        _reader(store, ShardCache(tmp_path / "c", 1 << 30), ByteTokenizer()).load_state_dict({**state, "order": 9})


def test_block_permutations_are_permutations_fixed_by_their_name() -> None:
    assert ORDER_VERSION == 2
    for version in (1, 2):
        p = block_permutation(256, 7, 3, "shard-1.jsonl", 4, version)
        assert sorted(p.tolist()) == list(range(256))
        assert np.array_equal(p, block_permutation(256, 7, 3, "shard-1.jsonl", 4, version))
        assert not np.array_equal(p, block_permutation(256, 7, 4, "shard-1.jsonl", 4, version))
    # Version 2 is defined by this code alone: pin a few values so no change goes unnoticed.
    assert block_permutation(8, 0, 0, "a", 0, 2).tolist() == [5, 3, 4, 7, 0, 2, 6, 1]
    assert block_permutation(5, 7, 1, "shard-00001.jsonl", 2, 2).tolist() == [0, 3, 4, 2, 1]


def _splitmix64_order(count: int, name: str) -> list[int]:
    """Version 2's definition in plain integers: indices sorted by SplitMix64(base + index)."""
    mask = (1 << 64) - 1
    base = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")

    def mix(i: int) -> int:
        z = (base + i + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    return sorted(range(count), key=mix)


def test_version_2_orders_whole_blocks_by_their_splitmix64_hashes() -> None:
    for number in range(20):
        expected = _splitmix64_order(256, f"7/3/shard-1.jsonl/{number}")
        assert block_permutation(256, 7, 3, "shard-1.jsonl", number, 2).tolist() == expected


@pytest.mark.parametrize("cuts", [[], [1], [3, 4, 5], [7, 8, 9, 100]])
def test_hashing_pieces_as_they_are_written_matches_hashing_the_file(cuts: list[int]) -> None:
    data = bytes(range(256)) * 3
    hasher = ChunkHasher(16)
    for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
        hasher.update(data[a:b])
    assert hasher.hexdigest() == chunks_digest(io.BytesIO(data), 16)


def test_a_fill_commits_its_blake3_digest_and_a_commit_of_sha256_from_before_is_still_verified(
        store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commit files record BLAKE3 since issue 58; a node's cache written before records
    `chunks_sha256` — still a hit when the file matches it, still corrupt when it does not."""
    import json

    from trainyard.plugins.data import cache as cache_module

    writer = _reader(store, ShardCache(tmp_path / "c", 1 << 30), ByteTokenizer())
    first = _epochs(writer, 1)
    writer.close()  # its prefetch threads would read the commits changed below
    commits = sorted(p.with_name(p.name + ".json") for p in _token_files(tmp_path / "c"))
    assert len(commits) == 4
    for commit in commits:
        meta = json.loads(commit.read_text())
        assert meta["hash"] == "blake3" and "chunks_sha256" not in meta
        data = commit.with_name(commit.name.removesuffix(".json"))
        with open(data, "rb") as f:
            assert meta["chunks_digest"] == chunks_digest(f, meta["chunk_bytes"], "blake3")
        # as the cache wrote it before: the hash over the chunks' SHA-256 digests
        chunks = [data.read_bytes()[i:i + meta["chunk_bytes"]]
                  for i in range(0, meta["size"], meta["chunk_bytes"])]
        old = hashlib.sha256(b"".join(hashlib.sha256(c).digest() for c in chunks)).hexdigest()
        del meta["hash"], meta["chunks_digest"]
        wrong = commit is commits[0]
        commit.write_text(json.dumps({**meta, "chunks_sha256": "0" * 64 if wrong else old}))

    monkeypatch.setattr(cache_module, "_known_files", set())  # another process: hashes each once
    monkeypatch.setattr(cache_module, "_commits", {})
    tokenizer = CountingTokenizer()
    cache = ShardCache(tmp_path / "c", 1 << 30)
    reader = _reader(store, cache, tokenizer)
    assert _epochs(reader, 1) == first
    reader.close()
    assert cache.stats.corrupt == 1 and tokenizer.documents == 20  # the wrong one parsed again, 3 hits


def test_a_fills_scan_stats_only_fills_in_progress_and_entries_it_has_not_seen(
        store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fill lists the folder; a committed entry's size is remembered by (name, inode), so
    only new entries, replaced ones (a rename: a new inode) and fills in progress are stat'ed."""
    import os

    from trainyard.plugins.data import cache as cache_module

    cache = ShardCache(tmp_path / "c", 1 << 30)
    writer = _reader(store, cache, ByteTokenizer())
    _epochs(writer, 1)
    writer.close()
    stated: list[str] = []

    class Entry:
        def __init__(self, entry: os.DirEntry[str]) -> None:
            self._entry, self.name = entry, entry.name

        def inode(self) -> int:
            return self._entry.inode()

        def stat(self) -> os.stat_result:
            stated.append(self.name)
            return self._entry.stat()

    real_scandir = os.scandir

    class Listing:
        def __init__(self, path: Path) -> None:
            self._it = real_scandir(path)

        def __enter__(self) -> list[Entry]:
            return [Entry(e) for e in self._it]

        def __exit__(self, *exc: object) -> None:
            self._it.close()

    monkeypatch.setattr(cache_module.os, "scandir", Listing)
    data = _token_files(tmp_path / "c")
    total = sum(p.stat().st_size for p in data)
    assert cache.used_bytes() == total  # stats what the fills' own scans did not see committed
    stated.clear()
    assert cache.used_bytes() == total and stated == []

    partial = tmp_path / "c" / f"x{cache_module.PARTIAL}1"
    partial.write_bytes(b"12345")
    assert cache.used_bytes() == total + 5 and stated == [partial.name]
    assert cache.used_bytes() == total + 5 and stated == [partial.name] * 2  # a fill grows: always stat'ed

    old_size = data[0].stat().st_size
    replaced = data[0].with_name("replacement")
    replaced.write_bytes(b"z" * 3)
    os.replace(replaced, data[0])  # another inode under the same name: stat'ed again
    stated.clear()
    assert cache.used_bytes() == total - old_size + 3 + 5
    assert sorted(stated) == sorted([partial.name, data[0].name])
    stated.clear()
    assert cache.used_bytes() == total - old_size + 3 + 5 and stated == [partial.name]


def test_tokens_larger_than_the_cache_are_returned_but_not_kept(store: ObjectStore, tmp_path: Path) -> None:
    from trainyard.plugins.data.manifest import list_manifest

    manifest = list_manifest(store, "jsonl")
    shard = manifest.shards[0]
    cache = ShardCache(tmp_path / "c", 1000, chunk_bytes=64)
    pieces = [np.arange(300, dtype=np.uint8), np.arange(400, dtype=np.uint8), np.arange(500, dtype=np.uint8)]
    tokens = cache.fill_tokens(manifest, shard, "v", np.dtype(np.uint8), iter(pieces))
    assert np.array_equal(tokens, np.concatenate(pieces))
    assert cache.open_tokens(manifest, shard, "v", np.dtype(np.uint8)) is None and cache.used_bytes() == 0
    kept = cache.fill_tokens(manifest, shard, "v", np.dtype(np.uint8), iter(pieces[:2]))
    assert np.array_equal(cache.open_tokens(manifest, shard, "v", np.dtype(np.uint8)), kept)
    assert cache.used_bytes() == 700  # the reservation was trimmed to what was written


def test_a_replaced_commit_file_is_read_again_and_a_hit_marks_its_entry_used_at_most_every_10_s(
        store: ObjectStore, tmp_path: Path) -> None:
    import json
    import os

    writer = _reader(store, ShardCache(tmp_path / "c", 1 << 30), ByteTokenizer())
    first = _epochs(writer, 1)
    writer.close()
    commits = sorted(p.with_name(p.name + ".json") for p in _token_files(tmp_path / "c"))
    old = 1_000_000_000  # 1970: a hit must mark these used
    for commit in commits:
        os.utime(commit, ns=(old, old))
    reader = _reader(store, ShardCache(tmp_path / "c", 1 << 30), ByteTokenizer())
    assert _epochs(reader, 1) == first
    reader.close()
    marked = {c: c.stat().st_mtime_ns for c in commits}
    assert all(m > old for m in marked.values())
    reader = _reader(store, ShardCache(tmp_path / "c", 1 << 30), ByteTokenizer())
    _epochs(reader, 1)
    reader.close()
    assert {c: c.stat().st_mtime_ns for c in commits} == marked  # marked seconds ago: left alone

    # A commit file replaced (as every commit is: a rename) is read again, not remembered.
    victim = commits[0]
    meta = json.loads(victim.read_text())
    replacement = victim.with_name("replacement")
    replacement.write_text(json.dumps({**meta, "chunks_digest": "0" * 64}))
    os.replace(replacement, victim)
    tokenizer = CountingTokenizer()
    cache = ShardCache(tmp_path / "c", 1 << 30)
    reader = _reader(store, cache, tokenizer)
    assert _epochs(reader, 1) == first
    reader.close()
    assert cache.stats.corrupt == 1 and tokenizer.documents == 20  # that shard parsed again


def test_what_the_producer_cut_reaches_the_consumer_before_it_waits_for_a_shard(
        store: ObjectStore, tmp_path: Path) -> None:
    """A hand-over gathers up to four blocks' batches (`HANDOVER_BLOCKS`), but never holds them
    through a wait: here every shard after the first is stuck in its fetch, and the first
    shard's batches (one block: fewer than four) still reach the consumer."""
    from trainyard.plugins.data.manifest import list_manifest
    from trainyard.plugins.data.stream import epoch_order

    shards = list_manifest(store, "jsonl").shards
    first = shards[epoch_order(len(shards), 1, 0)[0]].key
    gate = threading.Event()
    read_range = store.read_range

    def stuck_after_the_first_shard(key: str, *args: object, **kwargs: object) -> bytes:
        if key != first:
            assert gate.wait(60), "the test's gate was never opened"
        return read_range(key, *args, **kwargs)  # type: ignore[arg-type]

    store.read_range = stuck_after_the_first_shard  # type: ignore[method-assign]
    reader = StreamingReader(store, "jsonl", cache=ShardCache(tmp_path / "c", 1 << 30), seq_len=31,
                             batch_size=4, dp_rank=0, dp_size=1, seed=1)  # a shard is one block
    got: list[object] = []
    consumer = threading.Thread(target=lambda: got.append(reader.next_batch()), daemon=True)
    consumer.start()
    consumer.join(30)
    gate.set()
    reader.close()
    assert got, "the first batch waited for the next shard's fetch"
