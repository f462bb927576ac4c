"""Sampler properties (hypothesis): shards partition the global stream; resuming — on the same
or on a different number of ranks — never repeats or skips a sample."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.worker.sampler import ResumableSampler


def stream_prefix(size: int, seed: int, n: int) -> list[int]:
    """The first n samples of the stream, as one rank with batch 1 sees it."""
    one = ResumableSampler(size, rank=0, world_size=1, seed=seed)
    return [one.next_batch(1)[0] for _ in range(n)]


def run(samplers: list[ResumableSampler], batch: int, steps: int) -> list[list[int]]:
    """Each step, every rank takes its batch; returns the indices of each step (all ranks)."""
    out = []
    for _ in range(steps):
        out.append([i for s in samplers for i in s.next_batch(batch)])
    return out


def ranks(size: int, world: int, seed: int, state: dict | None = None) -> list[ResumableSampler]:
    samplers = [ResumableSampler(size, rank=r, world_size=world, seed=seed) for r in range(world)]
    for s in samplers:
        if state is not None:
            s.load_state_dict(state)
    return samplers


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 300), world=st.integers(1, 8), batch=st.integers(1, 6),
       steps=st.integers(1, 12), seed=st.integers(0, 2**31))
def test_steps_partition_the_stream(size: int, world: int, batch: int, steps: int, seed: int) -> None:
    samplers = ranks(size, world, seed)
    stream = stream_prefix(size, seed, steps * world * batch)
    for step in range(steps):
        start = step * world * batch
        shards = [s.next_batch(batch) for s in samplers]
        # Rank r takes the step's positions r, r + world, r + 2·world, … (the documented layout):
        # disjoint shards whose union is exactly the step's slice of the stream.
        for r, shard in enumerate(shards):
            assert shard == [stream[start + r + k * world] for k in range(batch)]
    for epoch in range(len(stream) // size):  # each whole epoch holds every sample once
        assert sorted(stream[epoch * size:(epoch + 1) * size]) == list(range(size))
    assert len({s.position for s in samplers}) == 1
    assert len({tuple(sorted(s.state_dict().items())) for s in samplers}) == 1


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 300), world_a=st.integers(1, 8), world_b=st.integers(1, 8),
       batch_a=st.integers(1, 6), batch_b=st.integers(1, 6), steps_a=st.integers(0, 10),
       steps_b=st.integers(1, 10), seed=st.integers(0, 2**31))
def test_resume_and_reshard_never_repeat_or_skip(size: int, world_a: int, world_b: int, batch_a: int,
                                                 batch_b: int, steps_a: int, steps_b: int, seed: int) -> None:
    before = ranks(size, world_a, seed)
    part_a = [i for step in run(before, batch_a, steps_a) for i in step]
    state = before[world_a - 1].state_dict()  # any rank's: they are all the same
    after = ranks(size, world_b, seed, state)
    part_b = [i for step in run(after, batch_b, steps_b) for i in step]
    expected = stream_prefix(size, seed, len(part_a) + len(part_b))
    assert Counter(part_a + part_b) == Counter(expected)
    assert Counter(part_b) == Counter(expected[len(part_a):])


def test_four_ranks_resumed_on_two_consume_exactly_the_rest() -> None:
    size = 64
    four = ranks(size, 4, seed=11)
    seen = [i for step in run(four, 2, 3) for i in step]  # 3 steps × 4 ranks × 2 = 24 samples
    two = ranks(size, 2, seed=11, state=four[0].state_dict())
    rest = [i for step in run(two, 4, 5) for i in step]  # 5 steps × 2 ranks × 4 = 40 samples
    assert sorted(seen + rest) == list(range(size))


def test_epochs_are_fresh_permutations() -> None:
    s = ResumableSampler(50, rank=0, world_size=1, seed=5)
    e0, e1 = s.epoch_permutation(0), s.epoch_permutation(1)
    assert sorted(e0) == sorted(e1) == list(range(50)) and e0 != e1
    assert ResumableSampler(50, rank=0, world_size=1, seed=5).epoch_permutation(0) == e0
    assert ResumableSampler(50, rank=0, world_size=1, seed=6).epoch_permutation(0) != e0


def test_state_mismatches_are_refused() -> None:
    state = ResumableSampler(10, rank=0, world_size=1, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        ResumableSampler(10, rank=0, world_size=1, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset of 10 samples"):
        ResumableSampler(11, rank=0, world_size=1, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"rank \(2\)"):
        ResumableSampler(10, rank=2, world_size=2)
