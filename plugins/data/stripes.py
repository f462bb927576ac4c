"""Stripes: how a data-parallel rank reads only its share of the data, in an order no
data-parallel size changes.

With one stream (`trainyard.plugins.data.stream`), every rank walks the whole global stream and keeps
every dp-th sample: each rank parses, and each node fetches, the *global* batch of every step.
At a few ranks that is free; at hundreds it is the bottleneck (seed §6: ~1 GB of tokens a
step). So a run splits its shards into S *stripes*, fixed when the run starts (the spec's
`dataset.stripes`, else the data-parallel size it starts with, at most one per shard) and kept
in every checkpoint:

- stripe s holds a fixed set of the manifest's shards (largest first to the stripe with the
  fewest bytes: stripes differ by at most one shard's size) and is a `SampleStream` of its own
  — its own epochs, shard order and shuffle blocks, from (seed, s);
- the global stream's sample j is stripe (j mod S)'s sample (j div S); a step takes the next
  `dp · batch_size` samples and rank r keeps r, r + dp, … — as with one stream;
- so rank r only ever needs the stripes s ≡ (G₀ + r) mod gcd(dp, S), G₀ being the samples
  consumed when it started: with dp dividing S it reads S/dp stripes and keeps all their
  samples; with S dividing dp it shares one stripe with dp/S − 1 other ranks;
- the order depends on S, not on dp: a checkpoint (the samples consumed and each stripe's
  position) resumes on any data-parallel size without repeating or skipping a sample.

The price: each stripe runs through its epochs at its own pace, so "every sample once per
epoch" holds per stripe. Every stripe gives 1/S of the samples, so a smaller stripe starts
its next epoch earlier and its samples are seen more often, in the ratio of the stripes'
sample counts (their bytes differ by at most one shard's size; with 1 MB shards, 100 per
stripe, ~1 %). One stripe is the plain global stream (its epochs are the dataset's).

A rank knows the positions of the stripes it reads only; a checkpoint's state is the union of
every rank's (`merge_states`, which the worker calls on an all-gather of them).
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from trainyard.plugins.data.manifest import ShardManifest
from trainyard.plugins.data.stream import Batch, Block, SampleStream, StreamPosition


class StripedPosition(NamedTuple):
    """A place in the striped stream: `consumed` global samples before it, and the position in
    each stripe this rank reads (stripe → position after its samples among those)."""

    consumed: int
    stripes: Mapping[int, StreamPosition]


def stripe_members(manifest: ShardManifest, count: int) -> list[list[int]]:
    """The manifest's shard indices in each of `count` stripes (each list in manifest order):
    largest shard first to the stripe with the fewest bytes so far, ties to the lower index."""
    if not 0 < count <= len(manifest.shards):
        raise ValueError(f"{count} stripes for {len(manifest.shards)} shards: a stripe holds whole shards, "
                         f"so between 1 and {len(manifest.shards)}")
    members: list[list[int]] = [[] for _ in range(count)]
    loads = [(0, s) for s in range(count)]
    for i in sorted(range(len(manifest.shards)), key=lambda i: (-manifest.shards[i].size, i)):
        load, s = heapq.heappop(loads)
        members[s].append(i)
        heapq.heappush(loads, (load + manifest.shards[i].size, s))
    return [sorted(m) for m in members]


def stripe_manifest(manifest: ShardManifest, members: list[int]) -> ShardManifest:
    return manifest.model_copy(update={"shards": tuple(manifest.shards[i] for i in members)})


def stripe_seed(seed: int, stripe: int, count: int) -> int:
    """The seed of stripe `stripe`'s shard order: the run's own with one stripe (so a one-
    stripe run is the plain stream), else drawn from (seed, stripe)."""
    if count == 1:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}/stripe/{stripe}".encode()).digest()[:6], "little")


def taken_from(stripe: int, count: int, consumed: np.ndarray) -> np.ndarray:
    """Samples of stripe `stripe` among the global stream's first `consumed` (an int or an
    array of them)."""
    return np.maximum(0, -(-(consumed - stripe) // count))


def read_by(count: int, consumed: int, dp_rank: int, dp_size: int) -> list[int]:
    """The stripes data-parallel rank `dp_rank` of `dp_size` reads when it starts after
    `consumed` samples (its later steps start dp · batch_size apart: the same stripes)."""
    g = math.gcd(dp_size, count)
    return [s for s in range(count) if s % g == (consumed + dp_rank) % g]


class _Cursor:
    """One stripe's samples by index: the block holding the next ones, and its first's index."""

    def __init__(self, blocks: Iterator[Block], start: StreamPosition, taken: int) -> None:
        self.blocks = blocks
        self.block: Block | None = None
        self.first = taken
        """Stripe index of `block.windows[0]` (of the next block while `block` is None)."""
        self.position = start
        """The stripe's position after the samples `take` last passed."""

    def take(self, wanted: np.ndarray, ends: list[int]) -> tuple[list[np.ndarray], list[StreamPosition]]:
        """The windows at the (ascending) stripe indices `wanted`, and the stripe's position
        after each of the (ascending) sample counts `ends` — where it is left."""
        pieces: list[np.ndarray] = []
        positions: list[StreamPosition] = []
        k = e = 0
        while True:
            if self.block is not None:
                stop = self.first + len(self.block.windows)
                here = int(np.searchsorted(wanted, stop, side="left"))
                if here > k:
                    lo, hi = int(wanted[k]) - self.first, int(wanted[here - 1]) - self.first + 1
                    # Consecutive (a stripe only this rank reads): a view, not a gather.
                    pieces.append(self.block.windows[lo:hi] if hi - lo == here - k
                                  else self.block.windows[wanted[k:here] - self.first])
                    k = here
                while e < len(ends) and ends[e] <= stop:
                    if ends[e] > self.first:
                        self.position = self.block.position_after(ends[e] - self.first)
                    positions.append(self.position)
                    e += 1
                if e == len(ends):
                    return pieces, positions
                self.first = stop
            self.block = next(self.blocks)


def striped_batches(streams: Mapping[int, SampleStream], start: StripedPosition, *, count: int,
                    batch_size: int, dp_rank: int, dp_size: int, steps: int = 1) -> Iterator[list[Batch]]:
    """This rank's batches of the striped stream (module docstring) from `start` on — which
    holds a position for every stripe in `streams`, the stripes `read_by` gives this rank —
    `steps` at a time: they are cut together, a NumPy call per stripe, not per step."""
    if batch_size <= 0 or steps <= 0:
        raise ValueError(f"batch_size and steps must be positive, got {batch_size} and {steps}")
    cursors = {s: _Cursor(stream.blocks(start.stripes[s]), start.stripes[s],
                          int(taken_from(s, count, np.asarray(start.consumed))))
               for s, stream in streams.items()}
    per_step = batch_size * dp_size
    mine = ((per_step * np.arange(steps))[:, None] + dp_rank + dp_size * np.arange(batch_size)).ravel()
    after = per_step * np.arange(1, steps + 1)
    consumed = start.consumed
    while True:
        samples = consumed + mine
        stripe_of, index = samples % count, samples // count
        out: np.ndarray | None = None
        filled = 0
        positions: list[dict[int, StreamPosition]] = [{} for _ in range(steps)]
        for s, cursor in cursors.items():
            rows = np.nonzero(stripe_of == s)[0]
            pieces, stripe_positions = cursor.take(index[rows], taken_from(s, count, consumed + after).tolist())
            for step, position in zip(positions, stripe_positions, strict=True):
                step[s] = position
            if not len(rows):
                continue
            windows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            if len(rows) == len(mine):  # every sample from this stripe: no scatter
                out = windows
            else:
                if out is None:
                    out = np.empty((len(mine), windows.shape[1]), windows.dtype)
                out[rows] = windows
            filled += len(rows)
        if out is None or filled != len(mine):
            raise RuntimeError(f"rank {dp_rank} of {dp_size} does not read every stripe its samples "
                               f"come from ({sorted(set(stripe_of.tolist()))}, reads {sorted(cursors)})")
        yield [Batch(out[t * batch_size:(t + 1) * batch_size], StripedPosition(consumed + int(after[t]), positions[t]))
               for t in range(steps)]
        consumed += per_step * steps


# --- checkpoint state ---------------------------------------------------------------------------

def encode_positions(positions: Mapping[int, StreamPosition]) -> dict[str, list[int]]:
    return {str(s): list(p) for s, p in sorted(positions.items())}


def decode_positions(raw: Mapping[str, Iterable[int]]) -> dict[int, StreamPosition]:
    return {int(s): StreamPosition(*(int(v) for v in p)).checked() for s, p in raw.items()}


def merge_states(states: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One checkpoint state from every rank's: each names the positions of the stripes it
    reads; the rest of the state must be the same on all."""
    states = list(states)
    if not states:
        raise ValueError("no data states to merge")
    merged = dict(states[0])
    common = {k: v for k, v in merged.items() if k != "stripe_positions"}
    positions: dict[str, list[int]] = {}
    for state in states:
        rest = {k: v for k, v in state.items() if k != "stripe_positions"}
        if rest != common:
            raise ValueError("the ranks' data states disagree beyond their stripes' positions: "
                             f"{sorted(k for k in rest.keys() | common.keys() if rest.get(k) != common.get(k))}")
        for s, p in (state.get("stripe_positions") or {}).items():
            if positions.setdefault(s, p) != p:
                raise ValueError(f"two ranks hold different positions for stripe {s}: {positions[s]} and {p}")
    if "stripe_positions" in merged:
        merged["stripe_positions"] = dict(sorted(positions.items(), key=lambda kv: int(kv[0])))
    return merged
