"""Stripes (`trainyard.plugins.data.stripes`) against a real S3 endpoint and a local store: each rank
reads only its share of the shards, the order depends on the stripes and not on the data-
parallel size, a checkpoint resumes on any size, and each stripe's epoch is every one of its
samples once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.datasets import row_text
from tests.support.s3_server import S3Server
from trainyard.plugins.data.cache import ShardCache
from trainyard.plugins.data.manifest import ShardEntry, ShardManifest, list_manifest
from trainyard.plugins.data.reader import StreamingReader
from trainyard.plugins.data.stripes import merge_states, read_by, stripe_members, taken_from
from trainyard.plugins.storage.store import ObjectStore, S3Store, open_store

SEQ, GLOBAL_BATCH = 63, 12


@pytest.fixture(params=["s3", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        store: ObjectStore = open_store((tmp_path / "objects").as_uri())
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        store = S3Store(server.new_bucket("data"), "ds", endpoint_url=server.endpoint_url)
    for shard, rows in enumerate((10, 16, 10, 16, 10, 16)):  # uneven: stripes end their epochs apart
        store.put_bytes(f"shard-{shard:05d}.jsonl",
                        "".join(json.dumps({"text": row_text(shard, r, 200)}) + "\n" for r in range(rows)).encode())
    return store


def ranks(store: ObjectStore, cache: Path, size: int, stripes: int | None, *,
          own_caches: bool = False) -> list[StreamingReader]:
    return [StreamingReader(store, "jsonl", cache=ShardCache(cache / (f"rank{r}" if own_caches else ""), 1 << 30),
                            seq_len=SEQ, batch_size=GLOBAL_BATCH // size, dp_rank=r, dp_size=size, seed=7,
                            shuffle_block=8, stripes=stripes)
            for r in range(size)]


def global_samples(readers: list[StreamingReader], steps: int) -> Iterator[bytes]:
    """The global stream as the ranks consumed it: rank k's j-th sample of a step is the
    step's (j · size + k)-th."""
    for _ in range(steps):
        batches = [r.next_batch().samples for r in readers]
        for j in range(len(batches[0])):
            for b in batches:
                yield bytes(b[j])


def close(readers: list[StreamingReader]) -> None:
    for r in readers:
        r.close()


def test_shards_are_split_into_stripes_of_near_equal_bytes() -> None:
    sizes = [900, 100, 500, 500, 300, 700, 200, 800]
    manifest = ShardManifest(uri="s3://b/ds", format="jsonl",
                             shards=tuple(ShardEntry(key=f"s{i}", size=n) for i, n in enumerate(sizes)))
    members = stripe_members(manifest, 3)
    assert sorted(i for m in members for i in m) == list(range(len(sizes)))  # each shard once
    loads = [sum(sizes[i] for i in m) for m in members]
    assert max(loads) - min(loads) <= max(sizes)
    assert members == stripe_members(manifest, 3)
    with pytest.raises(ValueError, match="9 stripes for 8 shards: a stripe holds whole shards, so between 1 and 8"):
        stripe_members(manifest, 9)


def test_each_rank_reads_the_stripes_its_samples_come_from() -> None:
    for stripes, size in ((4, 2), (2, 4), (6, 4), (3, 2), (8, 8)):
        for consumed in (0, 5, 12):
            mine = [read_by(stripes, consumed, r, size) for r in range(size)]
            for r in range(size):
                wanted = {(consumed + r + size * k) % stripes for k in range(4 * stripes)}
                assert wanted == set(mine[r]), (stripes, size, consumed, r)
    assert [taken_from(s, 4, 10) for s in range(4)] == [3, 3, 2, 2]


@pytest.mark.parametrize("stripes", [2, 4])
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 3), (4, 2), (3, 4)])
def test_a_striped_run_resumes_on_any_data_parallel_size_in_the_same_order(
        store: ObjectStore, tmp_path: Path, stripes: int, before: int, after: int) -> None:
    reference = ranks(store, tmp_path / "ref", 1, stripes)
    expected = list(global_samples(reference, 30))
    close(reference)
    first = ranks(store, tmp_path / "c", before, stripes)
    seen = list(global_samples(first, 11))
    state = merge_states(r.state_dict() for r in first)
    close(first)
    assert state["stripes"] == stripes and state["consumed"] == 11 * GLOBAL_BATCH
    assert sorted(state["stripe_positions"]) == [str(s) for s in range(stripes)]
    second = ranks(store, tmp_path / "c", after, None)  # the checkpoint's stripes, not `after`
    for r in second:
        r.load_state_dict(state)
    seen += list(global_samples(second, 19))
    close(second)
    assert seen == expected  # nothing repeated, nothing skipped, across stripes' epochs too


def test_each_stripe_epoch_is_every_one_of_its_samples_once(store: ObjectStore, tmp_path: Path) -> None:
    one = ranks(store, tmp_path / "one", 1, 1)
    everything = set(global_samples(one, 40))  # 480 samples: more than an epoch
    close(one)
    striped = ranks(store, tmp_path / "four", 2, 4)
    stream = list(global_samples(striped, 40))
    close(striped)
    per_stripe = [stream[s::4] for s in range(4)]
    epochs = [set(samples) for samples in per_stripe]
    for samples, epoch in zip(per_stripe, epochs, strict=True):
        assert len(samples) > len(epoch)  # each stripe wrapped into its next epoch ...
        assert len(set(samples[:len(epoch)])) == len(epoch)  # ... after each sample once
    assert sum(len(e) for e in epochs) == len(everything) and set().union(*epochs) == everything
    assert len({len(e) for e in epochs}) > 1  # uneven stripes: their epochs end apart


def test_ranks_fetch_only_their_stripes(store: ObjectStore, tmp_path: Path) -> None:
    """With one stripe per rank, each rank's own cache fetches its share of the shards and the
    ranks together fetch the dataset once; with one stream, every rank fetches all of it."""
    total = list_manifest(store, "jsonl").total_bytes
    for stripes, per_rank in ((4, None), (1, total)):
        readers = ranks(store, tmp_path / f"s{stripes}", 4, stripes, own_caches=True)
        list(global_samples(readers, 40))  # every stripe past its first epoch
        fetched = [r.cache.stats.bytes_fetched for r in readers]
        close(readers)
        if per_rank is None:
            assert sum(fetched) == total and max(fetched) < total / 2, fetched
        else:
            assert fetched == [per_rank] * 4


def test_a_rank_state_alone_does_not_resume_a_striped_run(store: ObjectStore, tmp_path: Path) -> None:
    first = ranks(store, tmp_path / "c", 2, 2)
    list(global_samples(first, 3))
    alone = first[0].state_dict()
    close(first)
    assert list(alone["stripe_positions"]) == ["0"]
    whole = ranks(store, tmp_path / "c", 1, None)[0]
    whole.load_state_dict(alone)
    with pytest.raises(ValueError, match="no position for stripe 1 of 2"):
        whole.next_batch()
    whole.close()


def test_merge_refuses_states_that_disagree(store: ObjectStore, tmp_path: Path) -> None:
    first = ranks(store, tmp_path / "c", 2, 2)
    list(global_samples(first, 3))
    a, b = (r.state_dict() for r in first)
    close(first)
    with pytest.raises(ValueError, match="disagree beyond their stripes' positions: \\['consumed'\\]"):
        merge_states([a, {**b, "consumed": b["consumed"] + 1}])
    with pytest.raises(ValueError, match="different positions for stripe 0"):
        merge_states([a, {**b, "stripe_positions": {"0": [9, 9, 0, 0]}}])
