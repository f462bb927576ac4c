"""`StreamingReader`: one data-parallel rank's batches, prepared ahead in a background thread.

    reader = StreamingReader(store, "jsonl", cache=ShardCache(dir, 8 << 30), seq_len=256,
                             batch_size=8, dp_rank=r, dp_size=n, seed=0)
    batch = reader.next_batch()        # this rank's windows of the next global batch
    reader.state_dict()                # into the checkpoint (see "stripes" below)

- The shard manifest is listed on the first batch (or comes from the checkpoint, see
  `trainyard.plugins.data.manifest`); `agree` lets the ranks use one listing (the worker broadcasts
  rank 0's).
- The shards are split into stripes (`trainyard.plugins.data.stripes`; `stripes`, default one per data-
  parallel rank, at most one per shard): the rank reads only the stripes its samples come
  from, each a stream of its own, and the state names their positions only —
  `merge_states` joins the ranks' states into the checkpoint's. With one stripe every rank
  walks the one stream below and its state is the same on every rank.
- A producer thread walks the stream (`trainyard.plugins.data.stream`): it takes each shard's token ids
  (below), cuts them into windows in the epoch's order, block by block (`batch_groups`), and
  hands the batches of `HANDOVER_BLOCKS` (4) blocks, or of `HANDOVER_BYTES` (4 MB), whichever
  comes first, over at once — sooner when it may have to wait for a shard's tokens (what it
  holds goes first). The consumer takes all that are ready at once: one lock and one wake-up
  per hand-over on each side, not per batch or block — a waiting consumer woken per block cost
  a quarter of a warm epoch of small shards, per batch more than cutting the batches. While
  `prefetch_batches` or more are ready the producer waits (back-pressure), so memory is
  bounded by three hand-overs (ready, taken but not yet handed out, and gathering), one block
  and the fetch buffers (and, when the cache is too small to keep a shard's tokens, those of
  the `prefetch_shards + 1` shards in flight, for each stripe it reads) — not by the dataset.
  (With stripes, a shuffle block's worth of this rank's batches at a time.)
- While a shard is cut into batches, the next `prefetch_shards` in the epoch's order are made
  ready by other threads: their tokenized copy from the node cache (memory-mapped,
  hash-verified), or, on a miss, the shard read by ranged GETs over parallel connections
  (`trainyard.plugins.data.fetch`), tokenized as its bytes arrive and stored tokenized in the cache
  (`ShardCache.fill_tokens`). Only the tokens are kept: a raw copy would cost as much to write
  as the parse and take half the cache (parquet, read by row group, is copied whole into the
  cache first). The next epoch, and the node's other ranks, read token ids instead of parsing
  again; the ranks that want a shard at once wait for the one parsing it.
- The state in a checkpoint is the position *after the last batch handed out*, not where
  the producer has got to: batches handed over but not taken are produced again after a resume.
- An error in the producer (a shard gone, a bad row) is raised by the next `next_batch()`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from trainyard.plugins.data.documents import ByteTokenizer, Tokenizer, token_pieces
from trainyard.plugins.data.manifest import ShardEntry, ShardManifest, list_manifest
from trainyard.plugins.data.stream import (
    ORDER_VERSION,
    Batch,
    SampleStream,
    StreamPosition,
    batch_groups,
    token_dtype,
)
from trainyard.plugins.data.stripes import (
    StripedPosition,
    decode_positions,
    encode_positions,
    read_by,
    stripe_manifest,
    stripe_members,
    stripe_seed,
    striped_batches,
)

if TYPE_CHECKING:
    from trainyard.plugins.data.cache import ShardCache
    from trainyard.plugins.storage.store import ObjectStore

log = logging.getLogger(__name__)

STATE_FORMAT = 1
HANDOVER_BLOCKS, HANDOVER_BYTES = 4, 4 << 20
"""The producer hands batches over once it has cut this many blocks or they hold this many
bytes (module docstring)."""


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class StreamingReader:
    """See the module docstring. Not thread-safe: one consumer calls `next_batch`."""

    def __init__(self, store: ObjectStore, fmt: str, *, cache: ShardCache, seq_len: int,
                 batch_size: int, dp_rank: int, dp_size: int, seed: int = 0,
                 text_field: str = "text", tokenizer: Tokenizer | None = None,
                 tokenizer_name: str | None = None, prefetch_batches: int = 4, prefetch_shards: int = 4,
                 shuffle_block: int = 256, stripes: int | None = None,
                 agree: Callable[[Callable[[], ShardManifest]], ShardManifest] | None = None) -> None:
        if prefetch_batches <= 0:
            raise ValueError(f"prefetch_batches must be positive, got {prefetch_batches}")
        if dp_size <= 0 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank ({dp_rank}) must be in [0, dp_size={dp_size})")
        self.store, self.format, self.cache = store, fmt, cache
        self.seq_len, self.batch_size = seq_len, batch_size
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.text_field = text_field
        self.tokenizer = tokenizer or ByteTokenizer()
        self.tokenizer_name = tokenizer_name or self.tokenizer.name
        self.prefetch_batches = prefetch_batches
        self.shuffle_block = shuffle_block
        self._agree = agree or (lambda make: make())
        self.manifest: ShardManifest | None = None
        if stripes is not None and stripes <= 0:
            raise ValueError(f"stripes must be positive, got {stripes}")
        self.stripes_wanted = stripes
        """Stripes for a new run (`trainyard.plugins.data.stripes`); None: one per data-parallel rank."""
        self.stripes: int | None = None
        """The run's stripes: decided when it starts (at most one per shard), or its checkpoint's."""
        self.position: StreamPosition | StripedPosition = StreamPosition()
        """After the last batch handed out (a `StripedPosition` with more than one stripe)."""
        self._ready: deque[Batch | _Failed] = deque()
        """Batches the producer has handed over, in order (a failure last)."""
        self._taken: deque[Batch | _Failed] = deque()
        """Batches the consumer took from `_ready` and has not returned yet, in order."""
        self._handover = threading.Condition(threading.Lock())
        self._room_below = prefetch_batches
        """The producer hands a group over while fewer batches than this are ready: at least
        `prefetch_batches`, and the last group's size (so the next block is cut while the
        consumer takes this one, not after)."""
        self._stop = threading.Event()
        self._gathered: list[Batch] = []
        """Batches the producer holds for its next hand-over (`_produce`)."""
        self._gathered_bytes = 0
        self._thread: threading.Thread | None = None
        self.prefetch_shards = prefetch_shards
        """Shards made ready ahead, each by a thread of its own. A cold epoch waits on the store's
        latency more than on parsing (a 1 MB shard is one GET, then ~1 ms of parsing): four, not
        two, as the fetch-only ceiling keeps three shards in flight — on a loaded 2-core machine
        a cold epoch of `benchmarks/data_pipeline.py`'s data in 3.4 s median instead of 4.6 s
        (five interleaved rounds each; 3: 3.6 s, 6: 3.6 s, 8: 3.2 s)."""
        self._fill_pool = ThreadPoolExecutor(max_workers=max(1, prefetch_shards), thread_name_prefix="shard-prefetch")
        self._prefetched: dict[str, Future[np.ndarray]] = {}
        """The token ids the prefetch threads are making, by shard key (they count each shard's
        access, hit or miss)."""
        self.dtype = token_dtype(self.tokenizer)
        self.variant = f"{self.tokenizer_name}|{fmt}|{text_field}|{self.dtype.str}"
        """What a tokenized copy in the cache must have been made with."""
        self._largest_shard: int | None = None
        self.order = ORDER_VERSION
        """The block permutation (`trainyard.plugins.data.stream.block_permutation`): a resumed run keeps
        the one its checkpoint names."""
        self._prefetch_lock = threading.Lock()

    # --- batches ----------------------------------------------------------------------------

    def next_batch(self) -> Batch:
        if not self._taken:
            self._take_ready()
        item = self._taken.popleft()
        if item.__class__ is _Failed:
            self._taken.appendleft(item)  # left in place: every later call fails the same way
            raise item.error
        self.position = item.after
        return item

    def _take_ready(self) -> None:
        """Take every batch the producer has handed over, at once: the lock and the wake-up are
        paid per handed-over group, not per batch (at small batches they were most of the
        consumer's time), and the producer has room again for as many."""
        if self._thread is None:
            self._start()
        with self._handover:
            while not self._ready:
                self._handover.wait()
            self._taken, self._ready = self._ready, self._taken
            self._handover.notify()  # the producer may be waiting for room

    @property
    def prefetch_depth(self) -> int:
        """Batches ready now."""
        return len(self._taken) + len(self._ready)

    def metrics(self) -> dict[str, float]:
        return {"prefetch_depth": float(self.prefetch_depth), **self.cache.stats.as_metrics()}

    def _start(self) -> None:
        if self.manifest is None:
            self.manifest = self._agree(lambda: list_manifest(self.store, self.format))
            log.info("dataset %s: %d shards, %d bytes, manifest %s", self.manifest.uri,
                     len(self.manifest.shards), self.manifest.total_bytes, self.manifest.digest[:12])
        manifest = self.manifest
        if self.stripes is None:
            self.stripes = min(self.stripes_wanted or self.dp_size, len(manifest.shards))
        elif self.stripes_wanted is not None and self.stripes_wanted != self.stripes:
            log.warning("the checkpoint's data order has %d stripes; this run asks for %d and keeps "
                        "the checkpoint's (a change would reorder the data)", self.stripes, self.stripes_wanted)
        groups: Iterator[list[Batch]]
        if self.stripes == 1:
            assert isinstance(self.position, StreamPosition)
            groups = batch_groups(self._stream(manifest, self.seed), self.position, batch_size=self.batch_size,
                                  dp_rank=self.dp_rank, dp_size=self.dp_size)
        else:
            groups = self._striped(manifest, self.stripes)
        self._thread = threading.Thread(target=self._produce, args=(groups,), daemon=True,
                                        name=f"data-producer-{self.dp_rank}")
        self._thread.start()

    def _stream(self, manifest: ShardManifest, order_seed: int) -> SampleStream:
        return SampleStream(manifest, None, self.tokenizer, seq_len=self.seq_len, seed=self.seed,
                            text_field=self.text_field, shuffle_block=self.shuffle_block,
                            prefetch=self._prefetch if self.prefetch_shards else None,
                            prefetch_ahead=self.prefetch_shards, tokens=self._shard_tokens,
                            order=self.order, order_seed=order_seed)

    def _striped(self, manifest: ShardManifest, count: int) -> Iterator[list[Batch]]:
        """This rank's batches from the stripes it reads (`trainyard.plugins.data.stripes`)."""
        start = self.position
        if isinstance(start, StreamPosition):
            if start != StreamPosition():
                raise ValueError(f"a one-stream position ({start}) cannot start a run of {count} stripes")
            start = StripedPosition(0, {})
        members = stripe_members(manifest, count)
        mine = read_by(count, start.consumed, self.dp_rank, self.dp_size)
        positions = {}
        for s in mine:
            if s in start.stripes:
                positions[s] = start.stripes[s]
            elif start.consumed == 0:
                positions[s] = StreamPosition()
            else:
                raise ValueError(f"the checkpoint's data state has no position for stripe {s} of {count} "
                                 "(saved without every rank's stripes, see trainyard.plugins.data.stripes.merge_states)")
        self.position = start = StripedPosition(start.consumed, positions)
        log.info("data-parallel rank %d of %d reads stripes %s of %d (%d of %d shards)", self.dp_rank,
                 self.dp_size, mine, count, sum(len(members[s]) for s in mine), len(manifest.shards))
        streams = {s: self._stream(stripe_manifest(manifest, members[s]), stripe_seed(self.seed, s, count))
                   for s in mine}
        return striped_batches(streams, start, count=count, batch_size=self.batch_size,
                               dp_rank=self.dp_rank, dp_size=self.dp_size,
                               steps=max(1, self.shuffle_block // self.batch_size))

    def _produce(self, groups: Iterator[list[Batch]]) -> None:
        try:
            blocks = 0
            for group in groups:
                if self._stop.is_set():
                    return
                if not group:
                    continue
                self._gathered += group
                self._gathered_bytes += len(group) * group[0].samples.nbytes
                blocks += 1
                if blocks >= HANDOVER_BLOCKS or self._gathered_bytes >= HANDOVER_BYTES:
                    blocks = 0
                    if not self._hand_over():
                        return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            self._hand_over()  # the batches before the failure first
            with self._handover:
                self._ready.append(_Failed(e))
                self._handover.notify()

    def _hand_over(self) -> bool:
        """Hand the gathered batches to the consumer once there is room; False once closed.
        Called by the producer, also from inside the stream before it may wait for a shard."""
        group, self._gathered, self._gathered_bytes = self._gathered, [], 0
        if not group:
            return not self._stop.is_set()
        with self._handover:
            while len(self._ready) >= self._room_below and not self._stop.is_set():
                self._handover.wait()
            if self._stop.is_set():
                return False
            self._ready.extend(group)
            self._room_below = max(self.prefetch_batches, len(group))
            self._handover.notify()
        return True

    def _shard_tokens(self, shard: ShardEntry) -> Iterator[np.ndarray]:
        """The shard's token ids in one piece, as a prefetch thread made them (or made now).
        Called by the producer: the batches it gathered go to the consumer first, unless the
        tokens are ready now (no wait to hold them through)."""
        tokens = self._take_prefetched(shard)
        if tokens is None:
            self._hand_over()
            tokens = self._tokens_of(shard, count=True)
        yield tokens

    def _tokens_of(self, shard: ShardEntry, *, count: bool) -> np.ndarray:
        """The node cache's tokenized copy, or the shard parsed now (and stored there), memory-
        mapped either way — in memory only when the cache cannot keep them. The ranks of a node
        that want a shard at once wait for the one parsing it."""
        manifest = self.manifest
        assert manifest is not None  # set by _start
        tokens = self.cache.open_tokens(manifest, shard, self.variant, self.dtype, count=count)
        if tokens is not None:
            return tokens
        with self.cache.tokens_lock(manifest, shard, self.variant):
            tokens = self.cache.open_tokens(manifest, shard, self.variant, self.dtype, count=False)
            if tokens is not None:  # another rank of the node parsed it while we waited
                return tokens
            # Parquet is read by row group (random access): from the cache's raw copy. The
            # others are parsed as their bytes arrive, and only their tokens are kept.
            source = self.cache.open if manifest.format == "parquet" else self.cache.stream
            with source(self.store, manifest, shard, count=count) as f:
                pieces = token_pieces(f, shard.key, manifest.format, self.tokenizer, self.text_field)
                return self.cache.fill_tokens(manifest, shard, self.variant, self.dtype, pieces,
                                              headroom=self._headroom(shard))

    def _headroom(self, shard: ShardEntry) -> int:
        """Room a token copy must leave free: for parquet, the raw copies of the shards in
        flight (this one and those read ahead; the largest shard's size for each, an upper
        bound); nothing for the streamed formats, whose raw bytes are never kept."""
        assert self.manifest is not None
        if self.manifest.format != "parquet":
            return 0
        if self._largest_shard is None:
            self._largest_shard = max((s.size for s in self.manifest.shards), default=shard.size)
        return (self.prefetch_shards + 1) * self._largest_shard

    def _take_prefetched(self, shard: ShardEntry) -> np.ndarray | None:
        """The tokens a prefetch thread made for `shard` (its access already counted), or None;
        if they are not ready yet, the gathered batches are handed over before waiting."""
        with self._prefetch_lock:
            opening = self._prefetched.pop(shard.key, None)
        if opening is None:
            return None
        if not opening.done():
            self._hand_over()
        try:
            return opening.result()
        except Exception as e:  # noqa: BLE001 - made again by the caller, which raises it
            log.debug("prefetch of %s failed: %s", shard.key, e)
            return None

    def _prefetch(self, shard: ShardEntry) -> None:
        """Make `shard`'s tokens ready ahead: a cached copy this process has verified already is
        opened here, in the producer (~70 µs: a commit file, an open, a memory map); anything else
        — a miss to fetch and parse, a copy to hash — goes to the prefetch threads. On a warm epoch
        handing every open to a thread cost three times its CPU in hand-overs of the GIL."""
        manifest = self.manifest
        if manifest is None or self._stop.is_set():
            return
        with self._prefetch_lock:
            if shard.key in self._prefetched:
                return  # already on its way
        tokens = self.cache.open_tokens(manifest, shard, self.variant, self.dtype, count=True, hash_unknown=False)
        if tokens is not None:
            opened: Future[np.ndarray] = Future()
            opened.set_result(tokens)
        with self._prefetch_lock:
            if shard.key not in self._prefetched:
                self._prefetched[shard.key] = opened if tokens is not None else \
                    self._fill_pool.submit(self._tokens_of, shard, count=True)

    def close(self) -> None:
        with self._handover:
            self._stop.set()
            self._handover.notify_all()  # a producer waiting for room
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._fill_pool.shutdown(wait=True, cancel_futures=True)
        with self._prefetch_lock:
            self._prefetched.clear()  # token ids made ahead and never read: memory maps, no files

    # --- checkpoint state -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Epoch, samples consumed, the shard cursor and the manifest — the same on every rank
        with one stripe; with more, each rank's names the positions of the stripes it reads
        (`trainyard.plugins.data.stripes.merge_states` joins them)."""
        p = self.position
        state: dict[str, Any] = {
            "format": STATE_FORMAT, "seed": self.seed, "seq_len": self.seq_len,
            "tokenizer": self.tokenizer_name, "order": self.order,
            "manifest": self.manifest.model_dump(mode="json") if self.manifest else None,
            "manifest_digest": self.manifest.digest if self.manifest else None}
        if self.stripes is not None:
            state["stripes"] = self.stripes
        if isinstance(p, StripedPosition):
            return {**state, "consumed": p.consumed, "stripe_positions": encode_positions(p.stripes)}
        return {**state, "epoch": p.epoch, "offset": p.offset, "shard": p.shard, "shard_start": p.shard_start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._thread is not None:
            raise RuntimeError("load_state_dict() after the first batch: restore before training")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"the checkpoint's data state is not a streaming reader's (format "
                             f"{state.get('format')!r}, keys {sorted(state)}); it was written by an "
                             "older data loader: start this run fresh")
        for name, mine in (("seed", self.seed), ("seq_len", self.seq_len), ("tokenizer", self.tokenizer_name)):
            if state[name] != mine:
                raise ValueError(f"the checkpoint's data {name} ({state[name]!r}) differs from this "
                                 f"run's ({mine!r}); the samples would differ")
        order = int(state.get("order", 1))  # checkpoints from before version 2 name none
        if order not in (1, ORDER_VERSION):
            raise ValueError(f"the checkpoint's sample order is version {order}; this reader knows 1 "
                             f"and {ORDER_VERSION}: resume with the Trainyard version that wrote it")
        self.order = order
        if state["manifest"] is not None:
            manifest = ShardManifest.model_validate(state["manifest"])
            if manifest.digest != state["manifest_digest"]:
                raise ValueError("the checkpoint's shard manifest does not match its digest")
            self.manifest = manifest
        stripes = state.get("stripes")  # none before a run's first batch (and before stripes existed)
        self.stripes = None if stripes is None else int(stripes)
        if "consumed" in state:
            self.position = StripedPosition(int(state["consumed"]), decode_positions(state["stripe_positions"]))
        else:
            self.position = StreamPosition(int(state["epoch"]), int(state["offset"]), int(state["shard"]),
                                           int(state["shard_start"])).checked()
            if self.stripes is None and self.position != StreamPosition():
                self.stripes = 1  # written before stripes existed: one stream
