"""The sample stream: a dataset's shards → fixed-length token windows, in one global order.

The order (the same on every rank, for any world size):

1. epoch e visits the manifest's shards in a permutation drawn from (seed, e);
2. each shard's documents are tokenized and joined with the end-of-document id, and cut into
   windows of `seq_len + 1` tokens starting every `seq_len` tokens (input and shifted target);
   a shard's last partial window is dropped, so shards stay independent of each other;
3. inside a shard, every `shuffle_block` consecutive windows are permuted from
   (seed, e, shard key, block) — local shuffling in bounded memory (`block_permutation`;
   version 2, an argsort of SplitMix64 hashes, is the default, version 1 — Python's
   `random.shuffle` — is what runs started before it use: a checkpoint records its version);
4. epoch e+1 follows epoch e: the stream is infinite.

A `StreamPosition` names a place in that stream — (epoch, samples of the epoch before it) plus
a cursor (which shard of the epoch's order holds it, and how many samples precede that shard)
so a resume skips whole shards without reading them and re-reads at most one shard.

Data parallelism (`GlobalBatches`): each step takes the next `dp_size · batch_size` samples of
the stream; data-parallel rank r keeps the samples r, r + dp_size, …. Every rank walks the
whole stream (through the node's shared cache, so each shard is fetched once per node) and
the position after a step is the same on every rank: a checkpoint's position resumes on any
data-parallel size without repeating or skipping a sample. The price — every rank parses
every shard — is what `trainyard.plugins.data.stripes` removes for larger jobs: there each rank reads
only its stripes, each stripe a `SampleStream` of its own.

Speed: the stream is cut per shuffle block, not per sample. A block's windows are strided views
of one token array, permuted by one fancy index into a `(k, seq_len + 1)` NumPy array, and a
step's batch is a slice of those — so no Python object is made per sample (the per-sample
generator this replaced spent most of its time on tuples and slices). `samples()` still walks
sample by sample, for tests and tools.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, NamedTuple

import numpy as np

from trainyard.plugins.data.documents import Tokenizer, token_pieces
from trainyard.plugins.data.manifest import ShardEntry, ShardManifest

Window = np.ndarray
"""`seq_len + 1` token ids (uint8 for vocabularies up to 256, else int32)."""

ShardOpener = Callable[[ShardEntry], IO[bytes]]
WINDOW_ARRAY_BYTES = 4 << 20
"""About the most window bytes `SampleStream.shard_blocks` hands out at once."""

ShardTokens = Callable[[ShardEntry], Iterator[np.ndarray]]
"""A shard's token ids in pieces (the reader's: from the node cache's tokenized copy, or parsed)."""


def token_dtype(tokenizer: Tokenizer) -> np.dtype:
    """uint8 for a vocabulary of at most 256 ids, else int32."""
    return np.dtype(np.uint8 if tokenizer.vocab_size <= 256 else np.int32)


class StreamPosition(NamedTuple):
    """A named tuple, not a dataclass: it is made often and compared as a tuple. `checked()`
    validates one that comes from outside (a checkpoint)."""

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


_new = tuple.__new__
"""Builds a named tuple from a tuple without its `__new__`'s argument handling, as the named
tuples' own `_make` does: the positions and batches made per step (~400 ns a step, not ~585)."""

ORDER_VERSION = 2
"""The block permutation new runs use (`block_permutation`)."""


def block_permutation(count: int, seed: int, epoch: int, key: str, number: int, version: int) -> np.ndarray:
    """The order of a block's `count` windows. Version 1: Python's `random.shuffle` seeded with
    the block's name (about 1.5 µs a window — the reader's largest cost once shards are
    tokenized). Version 2: the indices sorted by a SplitMix64 hash of (the block name's SHA-256,
    index) — defined here, so no library upgrade can change it, and ~20× faster."""
    return block_permutations(count, seed, epoch, key, number, 1, version)[0]


def block_permutations(count: int, seed: int, epoch: int, key: str, first: int, blocks: int,
                       version: int) -> np.ndarray:
    """`block_permutation` of blocks `first` … `first + blocks - 1` of a shard, all `count`
    windows long, as rows of one array (version 2 hashes and sorts them in one NumPy call each)."""
    names = [f"{seed}/{epoch}/{key}/{number}" for number in range(first, first + blocks)]
    if version == 1:
        orders = []
        for name in names:
            order = list(range(count))
            random.Random(name).shuffle(order)
            orders.append(order)
        return np.asarray(orders, dtype=np.intp).reshape(blocks, count)
    if version != 2:
        raise ValueError(f"unknown sample order version {version}; this reader knows 1 and 2")
    bases = np.array([int.from_bytes(hashlib.sha256(n.encode()).digest()[:8], "little") for n in names],
                     dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = bases[:, None] + np.arange(count, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    # A block's hashes are distinct (SplitMix64's mix is a bijection and its inputs differ), so
    # every sort gives the one order: NumPy's default introsort, ~3x faster here than a stable one.
    return np.argsort(z, axis=1)


def epoch_order(num_shards: int, seed: int, epoch: int) -> list[int]:
    """Shard indices in the order epoch `epoch` visits them (Python's Mersenne Twister: the
    same on every machine and version)."""
    order = list(range(num_shards))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


@dataclass(frozen=True)
class Block:
    """Consecutive samples of the stream, all from one shard: `windows[j]` is the sample after
    which the position is `(epoch, before + j + 1, shard, shard_start)`."""

    windows: np.ndarray
    """(k, seq_len + 1) token ids."""
    epoch: int
    shard: int
    shard_start: int
    before: int
    """Samples of this epoch before the block's first."""

    def position_after(self, taken: int) -> StreamPosition:
        """The stream position after the block's first `taken` samples."""
        return _new(StreamPosition, (self.epoch, self.before + taken, self.shard, self.shard_start))


class SampleStream:
    """Iterates the global sample stream from any `StreamPosition` (module docstring)."""

    def __init__(self, manifest: ShardManifest, open_shard: ShardOpener | None, tokenizer: Tokenizer, *,
                 seq_len: int, seed: int = 0, text_field: str = "text", shuffle_block: int = 256,
                 prefetch: Callable[[ShardEntry], None] | None = None, prefetch_ahead: int = 1,
                 tokens: ShardTokens | None = None, order: int = ORDER_VERSION,
                 order_seed: int | None = None) -> None:
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if shuffle_block <= 0:
            raise ValueError(f"shuffle_block must be positive, got {shuffle_block}")
        self.manifest = manifest
        self.open_shard = open_shard
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.seed = seed
        self.order_seed = seed if order_seed is None else order_seed
        """What the epochs' shard orders are drawn from (a stripe's own, `trainyard.plugins.data.stripes`)."""
        self.text_field = text_field
        self.shuffle_block = shuffle_block
        self.prefetch = prefetch
        """Called with each of the next `prefetch_ahead` shards when a shard starts (to fill a cache)."""
        self.prefetch_ahead = prefetch_ahead
        self.dtype = token_dtype(tokenizer)
        self.order = order
        """The block permutation's version (`block_permutation`)."""
        block_permutation(1, seed, 0, "", 0, order)  # an unknown version fails here, not mid-epoch
        if tokens is None and open_shard is None:
            raise ValueError("a SampleStream needs open_shard or tokens")
        self.tokens = tokens or self._parsed
        """Where a shard's token ids come from (default: `open_shard`, then the tokenizer)."""

    def _parsed(self, shard: ShardEntry) -> Iterator[np.ndarray]:
        assert self.open_shard is not None  # checked in __init__
        with self.open_shard(shard) as f:
            yield from token_pieces(f, shard.key, self.manifest.format, self.tokenizer, self.text_field)

    def blocks(self, start: StreamPosition) -> Iterator[Block]:
        """The stream from `start` on, forever, a shuffle block (or the rest of one) at a time."""
        pos = start
        n = len(self.manifest.shards)
        while True:
            order = epoch_order(n, self.order_seed, pos.epoch)
            both = order + epoch_order(n, self.order_seed, pos.epoch + 1)  # the prefetch looks past the end
            produced_in_epoch = pos.shard_start
            for i in range(pos.shard, n):
                shard = self.manifest.shards[order[i]]
                if self.prefetch is not None:
                    for nxt in both[i + 1:i + 1 + self.prefetch_ahead]:
                        self.prefetch(self.manifest.shards[nxt])
                skip = pos.offset - produced_in_epoch if i == pos.shard else 0
                count = 0
                for windows in self.shard_blocks(shard, pos.epoch):
                    first = count
                    count += len(windows)
                    if count <= skip:
                        continue
                    cut = max(0, skip - first)
                    yield Block(windows[cut:], pos.epoch, i, produced_in_epoch, produced_in_epoch + first + cut)
                if count < skip:
                    raise ValueError(f"stream position {start} points {skip} samples into shard "
                                     f"{shard.key!r}, which has {count}: the data changed")
                produced_in_epoch += count
                pos = StreamPosition(pos.epoch, produced_in_epoch, i + 1, produced_in_epoch)
            if produced_in_epoch == 0:
                raise ValueError(f"{self.manifest.uri}: no shard holds one sample of seq_len + 1 = "
                                 f"{self.seq_len + 1} tokens")
            pos = StreamPosition(pos.epoch + 1)

    def samples(self, start: StreamPosition) -> Iterator[tuple[StreamPosition, Window]]:
        """(position after the sample, sample) from `start` on, forever — one at a time."""
        for block in self.blocks(start):
            for j, window in enumerate(block.windows, start=1):
                yield block.position_after(j), window

    def shard_blocks(self, shard: ShardEntry, epoch: int) -> Iterator[np.ndarray]:
        """The shard's windows in this epoch's order: consecutive blocks of `shuffle_block`
        windows, each permuted from (seed, epoch, shard key, block number) — handed out as
        many whole blocks at a time as `WINDOW_ARRAY_BYTES` holds (at least one), since a
        NumPy call per block costs more than the block's work."""
        span, step, size = self.seq_len + 1, self.seq_len, self.shuffle_block
        block_tokens = size * step  # a full block's windows start in its first block_tokens tokens
        per_array = max(1, WINDOW_ARRAY_BYTES // (size * span * self.dtype.itemsize))
        pending = np.empty(0, self.dtype)
        number = 0
        for piece in self.tokens(shard):
            piece = piece.astype(self.dtype, copy=False)
            # A view when nothing is pending: a memory-mapped shard is never copied whole.
            pending = np.concatenate([pending, piece]) if len(pending) else piece
            ready = (len(pending) - (span - step)) // block_tokens  # whole blocks
            while ready > 0:
                blocks = min(ready, per_array)
                yield self._permuted(pending, size, blocks, shard, epoch, number)
                pending, number, ready = pending[blocks * block_tokens:], number + blocks, ready - blocks
        if len(pending) >= span:
            yield self._permuted(pending, (len(pending) - span) // step + 1, 1, shard, epoch, number)

    def _permuted(self, tokens: np.ndarray, count: int, blocks: int, shard: ShardEntry, epoch: int,
                  first: int) -> np.ndarray:
        """`blocks` blocks of `count` windows from the start of `tokens`, each in its shuffled
        order, by one fancy index."""
        orders = block_permutations(count, self.seed, epoch, shard.key, first, blocks, self.order)
        orders += np.arange(0, blocks * count, count)[:, None]
        return windows_of(tokens, self.seq_len)[orders.ravel()]


def windows_of(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """The (k, seq_len + 1) windows of `tokens` starting every `seq_len` tokens, as a read-only
    view: `sliding_window_view(tokens, seq_len + 1)[::seq_len]` without its argument checks,
    which cost a tenth of the warm cache's cutting time when called once per shard."""
    span = seq_len + 1
    count = (len(tokens) - span) // seq_len + 1 if len(tokens) >= span else 0
    item = tokens.strides[0]
    return np.lib.stride_tricks.as_strided(tokens, shape=(count, span), strides=(seq_len * item, item),
                                           writeable=False)


class Batch(NamedTuple):
    """A named tuple: a reader makes one per step and hands them over a block at a time."""

    samples: np.ndarray
    """This rank's samples of the step: (batch_size, seq_len + 1) token ids."""
    after: StreamPosition
    """The stream position after the step's global batch (the same on every rank)."""


def global_batches(stream: SampleStream, start: StreamPosition, *, batch_size: int, dp_rank: int,
                   dp_size: int) -> Iterator[Batch]:
    """Each step's `dp_size · batch_size` samples; this rank keeps r, r + dp_size, …."""
    for group in batch_groups(stream, start, batch_size=batch_size, dp_rank=dp_rank, dp_size=dp_size):
        yield from group


def batch_groups(stream: SampleStream, start: StreamPosition, *, batch_size: int, dp_rank: int,
                 dp_size: int) -> Iterator[list[Batch]]:
    """`global_batches`, a list at a time: the steps that end in one block come out together,
    cut from it by one reshape (and one copy when dp_size > 1) — a step costs no NumPy call of
    its own, and a reader hands a block's batches to its consumer at once, not one by one."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if dp_size <= 0 or not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank ({dp_rank}) must be in [0, dp_size={dp_size})")
    per_step = batch_size * dp_size
    begun: list[np.ndarray] = []  # the first samples of a step that spans blocks
    missing = per_step
    for block in stream.blocks(start):
        windows, group = block.windows, []
        used = 0
        if begun:
            used = min(missing, len(windows))
            begun.append(windows[:used])
            missing -= used
            if missing:
                continue
            step = np.concatenate(begun)
            group.append(Batch(np.ascontiguousarray(step[dp_rank::dp_size]), block.position_after(used)))
            begun, missing = [], per_step
        whole = (len(windows) - used) // per_step
        if whole:
            steps = windows[used:used + whole * per_step].reshape(whole, per_step, -1)
            mine = np.ascontiguousarray(steps[:, dp_rank::dp_size])
            group += [_new(Batch, (samples, block.position_after(used + k * per_step)))
                      for k, samples in enumerate(mine, 1)]
            used += whole * per_step
        if used < len(windows):
            begun, missing = [windows[used:]], per_step - (len(windows) - used)
        if group:
            yield group
