"""The sample stream: a dataset's shards → fixed-length token windows, in one global order.

The order (the same on every rank, for any world size):

1. epoch e visits the manifest's shards in a permutation drawn from (seed, e);
2. each shard's documents are tokenized and joined with the end-of-document id, and cut into
   windows of `seq_len + 1` tokens starting every `seq_len` tokens (input and shifted target);
   a shard's last partial window is dropped, so shards stay independent of each other;
3. inside a shard, every `shuffle_block` consecutive windows are permuted from
   (seed, e, shard key, block) — local shuffling in bounded memory;
4. epoch e+1 follows epoch e: the stream is infinite.

A `StreamPosition` names a place in that stream — (epoch, samples of the epoch before it) plus
a cursor (which shard of the epoch's order holds it, and how many samples precede that shard)
so a resume skips whole shards without reading them and re-reads at most one shard.

Data parallelism (`GlobalBatches`): each step takes the next `dp_size · batch_size` samples of
the stream; data-parallel rank r keeps the samples r, r + dp_size, …. Every rank walks the
whole stream (through the node's shared cache, so each shard is fetched once per node) and
the position after a step is the same on every rank: a checkpoint's position resumes on any
data-parallel size without repeating or skipping a sample. (The price: every rank parses
every shard. Assigning shards to ranks would need the sample count of each shard before
reading it — an index pass — which this reader does not build.)
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, NamedTuple

from plugins.data.documents import END, Tokenizer, iter_documents
from plugins.data.manifest import ShardEntry, ShardManifest

Window = array
"""`seq_len + 1` token ids (typecode 'B' for vocabularies up to 256, else 'I')."""

ShardOpener = Callable[[ShardEntry], IO[bytes]]


class StreamPosition(NamedTuple):
    """A named tuple, not a dataclass: one is made per sample, and that cost showed (20 % of
    the packing loop). `checked()` validates one that comes from outside (a checkpoint)."""

    epoch: int = 0
    offset: int = 0
    """Samples of this epoch before the position."""
    shard: int = 0
    """Index, in the epoch's shard order, of the shard the position falls in."""
    shard_start: int = 0
    """Samples of this epoch before that shard."""

    def checked(self) -> StreamPosition:
        if min(self) < 0 or self.shard_start > self.offset:
            raise ValueError(f"invalid stream position {self}")
        return self


def epoch_order(num_shards: int, seed: int, epoch: int) -> list[int]:
    """Shard indices in the order epoch `epoch` visits them (Python's Mersenne Twister: the
    same on every machine and version)."""
    order = list(range(num_shards))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


class SampleStream:
    """Iterates the global sample stream from any `StreamPosition` (module docstring)."""

    def __init__(self, manifest: ShardManifest, open_shard: ShardOpener, tokenizer: Tokenizer, *,
                 seq_len: int, seed: int = 0, text_field: str = "text", shuffle_block: int = 256,
                 prefetch: Callable[[ShardEntry], None] | None = None, prefetch_ahead: int = 1) -> None:
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if shuffle_block <= 0:
            raise ValueError(f"shuffle_block must be positive, got {shuffle_block}")
        self.manifest = manifest
        self.open_shard = open_shard
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.seed = seed
        self.text_field = text_field
        self.shuffle_block = shuffle_block
        self.prefetch = prefetch
        """Called with each of the next `prefetch_ahead` shards when a shard starts (to fill a cache)."""
        self.prefetch_ahead = prefetch_ahead
        self._typecode = "B" if tokenizer.vocab_size <= 256 else "I"

    def samples(self, start: StreamPosition) -> Iterator[tuple[StreamPosition, Window]]:
        """(position after the sample, sample) from `start` on, forever."""
        pos = start
        n = len(self.manifest.shards)
        while True:
            order = epoch_order(n, self.seed, pos.epoch)
            produced_in_epoch = pos.shard_start
            for i in range(pos.shard, n):
                shard = self.manifest.shards[order[i]]
                if self.prefetch is not None:
                    ahead = (order + epoch_order(n, self.seed, pos.epoch + 1))[i + 1:i + 1 + self.prefetch_ahead]
                    for nxt in ahead:
                        self.prefetch(self.manifest.shards[nxt])
                skip = pos.offset - produced_in_epoch if i == pos.shard else 0
                count = 0
                for count, window in enumerate(self.shard_windows(shard, pos.epoch), start=1):
                    if count <= skip:
                        continue
                    yield StreamPosition(pos.epoch, produced_in_epoch + count, i, produced_in_epoch), window
                if count < skip:
                    raise ValueError(f"stream position {start} points {skip} samples into shard "
                                     f"{shard.key!r}, which has {count}: the data changed")
                produced_in_epoch += count
                pos = StreamPosition(pos.epoch, produced_in_epoch, i + 1, produced_in_epoch)
            if produced_in_epoch == 0:
                raise ValueError(f"{self.manifest.uri}: no shard holds one sample of seq_len + 1 = "
                                 f"{self.seq_len + 1} tokens")
            pos = StreamPosition(pos.epoch + 1)

    def shard_windows(self, shard: ShardEntry, epoch: int) -> Iterator[Window]:
        """The shard's windows in this epoch's order (block-shuffled)."""
        block: list[Window] = []
        number = 0
        for window in self._windows_in_order(shard):
            block.append(window)
            if len(block) == self.shuffle_block:
                yield from self._shuffled(block, shard, epoch, number)
                block, number = [], number + 1
        yield from self._shuffled(block, shard, epoch, number)

    def _shuffled(self, block: list[Window], shard: ShardEntry, epoch: int, number: int) -> list[Window]:
        random.Random(f"{self.seed}/{epoch}/{shard.key}/{number}").shuffle(block)
        return block

    def _windows_in_order(self, shard: ShardEntry) -> Iterator[Window]:
        span = self.seq_len + 1
        buf = array(self._typecode)
        start = 0
        with self.open_shard(shard) as f:
            for piece in iter_documents(f, shard.key, self.manifest.format, self.text_field):
                if piece is END:
                    buf.append(self.tokenizer.end_of_document)
                else:
                    tokens = self.tokenizer.encode(piece)  # type: ignore[arg-type]
                    if isinstance(tokens, bytes) and self._typecode == "B":
                        buf.frombytes(tokens)  # a memcpy; extend() would walk it int by int
                    else:
                        buf.extend(tokens)
                while len(buf) - start >= span:
                    yield buf[start:start + span]
                    start += self.seq_len
                if start > (1 << 16):  # drop what no window needs any more
                    del buf[:start]
                    start = 0


@dataclass(frozen=True)
class Batch:
    samples: list[Window]
    """This rank's samples of the step."""
    after: StreamPosition
    """The stream position after the step's global batch (the same on every rank)."""


def global_batches(stream: SampleStream, start: StreamPosition, *, batch_size: int, dp_rank: int,
                   dp_size: int) -> Iterator[Batch]:
    """Each step's `dp_size · batch_size` samples; this rank keeps r, r + dp_size, …."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if dp_size <= 0 or not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank ({dp_rank}) must be in [0, dp_size={dp_size})")
    it = stream.samples(start)
    per_step = batch_size * dp_size
    pos = start
    while True:
        mine: list[Window] = []
        for k in range(per_step):
            pos, window = next(it)
            if k % dp_size == dp_rank:
                mine.append(window)
        yield Batch(mine, pos)

