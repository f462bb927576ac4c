"""Byte-level language-model data: a dataset's text shards → fixed-length token windows.

The tokenizer is the identity on UTF-8 bytes (vocabulary 256). A dataset's rows are read in
shard-key order and joined with a 0 byte between rows (a document boundary: 0 never occurs in
text), and the stream is cut into non-overlapping windows of `seq_len + 1` bytes; sample i is
window i, its input the first `seq_len` tokens and its target the last `seq_len` (shifted by
one). Samples are addressed by index, so the sampler alone decides the order.

Two ways to read it:
- `StreamingData` (what `worker/train.py` uses): the streaming reader of `trainyard.plugins.data.reader`
  — shards through the node's bounded cache, batches prepared ahead in a background thread,
  resumable on any data-parallel size; memory does not grow with the dataset;
- `TokenWindows` + `trainyard.worker.sampler.ResumableSampler`: the whole dataset in memory as one uint8
  tensor, samples addressed by index (kept for small in-memory experiments and the worker
  overhead benchmark).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainyard.plugins.data.reader import StreamingReader
    from trainyard.plugins.storage.store import ObjectStore

log = logging.getLogger(__name__)

DOCUMENT_SEPARATOR = 0
"""Byte between two rows: a document boundary the model learns to predict."""

READABLE_FORMATS = ("jsonl", "text")
"""What the byte-level loader reads (parquet shards validate, but are not read here)."""


def shard_keys(store: ObjectStore, fmt: str) -> list[str]:
    """The dataset's shard keys, sorted (the order that defines the byte stream)."""
    from trainyard.plugins.data.shards import list_shards

    if fmt not in READABLE_FORMATS:
        raise ValueError(f"dataset format {fmt!r} is not readable by the byte-level loader; "
                         f"use one of {list(READABLE_FORMATS)}")
    keys = [o.key for o in list_shards(store, fmt)]
    if not keys:
        raise FileNotFoundError(f"no {fmt} shards under {store.uri}")
    return keys


def iter_rows(raw: bytes, key: str, fmt: str, text_field: str) -> Iterator[bytes]:
    """UTF-8 bytes of each document of one shard (its whole content in `raw`), by the one
    training policy (`trainyard.plugins.data.documents.iter_documents`: strict, blank lines skipped)."""
    from trainyard.plugins.data.documents import END, iter_documents

    pieces: list[bytes] = []
    for piece in iter_documents(io.BytesIO(raw), key, fmt, text_field):
        if piece is END:
            yield b"".join(pieces)
            pieces = []
        else:
            pieces.append(piece)  # type: ignore[arg-type]


def load_bytes(store: ObjectStore, *, fmt: str = "jsonl", text_field: str = "text") -> torch.Tensor:
    """Every row of every shard, joined by `DOCUMENT_SEPARATOR`, as one uint8 tensor."""
    chunks: list[bytes] = []
    for key in shard_keys(store, fmt):
        for row in iter_rows(store.get_bytes(key), key, fmt, text_field):
            chunks.append(row)
            chunks.append(bytes([DOCUMENT_SEPARATOR]))
    data = b"".join(chunks)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class TokenWindows:
    """Non-overlapping windows of `seq_len + 1` tokens over a token stream."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if tokens.numel() < seq_len + 1:
            raise ValueError(f"the dataset has {tokens.numel()} tokens, fewer than one sample of "
                             f"seq_len + 1 = {seq_len + 1}")
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (self.tokens.numel() - 1) // self.seq_len

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range [0, {len(self)})")
        start = index * self.seq_len
        return self.tokens[start:start + self.seq_len + 1]

    def batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (len(indices), seq_len) int64."""
        windows = torch.stack([self[i] for i in indices]).long()
        return windows[:, :-1], windows[:, 1:]


def open_dataset_windows(source: str, *, object_store: str, seq_len: int, fmt: str = "jsonl",
                         text_field: str = "text", endpoint_url: str | None = None) -> TokenWindows:
    """Resolve a spec's `dataset.source` (a URI, or a prefix under the object store) the way
    the dry run does, and load it as windows."""
    from trainyard.plugins.data.shards import open_dataset

    store = open_dataset(source, object_store=object_store, endpoint_url=endpoint_url)
    tokens = load_bytes(store, fmt=fmt, text_field=text_field)
    windows = TokenWindows(tokens, seq_len)
    log.info("dataset %s: %d bytes, %d samples of %d tokens", store.uri, tokens.numel(),
             len(windows), seq_len)
    return windows


class StreamingData:
    """One data-parallel rank's batches from `trainyard.plugins.data.reader.StreamingReader`, as tensors.

    A `Stateful` for the checkpoint (the reader's state: epoch, samples consumed, cursor and
    shard manifest — with stripes, every rank's stripes joined, so the same on every rank).
    `metrics()` is what `TrainingSession.step_end` reports beside the data stall."""

    def __init__(self, reader: StreamingReader) -> None:
        self.reader = reader

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (batch_size, seq_len) int64."""
        windows = torch.from_numpy(self.reader.next_batch().samples).long()
        return windows[:, :-1], windows[:, 1:]

    def metrics(self) -> dict[str, float]:
        return self.reader.metrics()

    def state_dict(self) -> dict[str, Any]:
        """The reader's state; with stripes, every rank's joined (`merge_states`) — a collective:
        every rank takes it at the same step, as it saves its checkpoint."""
        from trainyard.plugins.data.stripes import merge_states
        from trainyard.worker.distributed.objects import all_gather_objects

        state = self.reader.state_dict()
        if "consumed" not in state:
            return state  # one stream: the same on every rank
        return merge_states(all_gather_objects(state))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reader.load_state_dict(state)

    def close(self) -> None:
        self.reader.close()
        self.reader.cache.close()


def open_streaming_data(source: str, *, object_store: str, seq_len: int, batch_size: int,
                        dp_rank: int, dp_size: int, seed: int, fmt: str = "jsonl",
                        text_field: str = "text", endpoint_url: str | None = None,
                        prefetch_batches: int = 4, tokenizer: str = "bytes",
                        stripes: int | None = None) -> StreamingData:
    """The streaming reader for a spec's `dataset.source` (resolved as the dry run does), with
    the node's cache from the settings (`TRAINYARD_DATA_CACHE_DIR`, `TRAINYARD_DATA_CACHE_BYTES`)."""
    from trainyard.config.settings import Settings
    from trainyard.plugins.data.cache import ShardCache
    from trainyard.plugins.data.documents import load_tokenizer
    from trainyard.plugins.data.reader import StreamingReader
    from trainyard.plugins.data.shards import open_dataset
    from trainyard.worker.distributed.objects import broadcast_from_rank0

    settings = Settings()
    store = open_dataset(source, object_store=object_store, endpoint_url=endpoint_url)
    loaded = load_tokenizer(tokenizer, store)
    assert settings.data_cache_dir is not None  # derived from the home when not set
    cache = ShardCache(settings.data_cache_dir, settings.data_cache_bytes)
    reader = StreamingReader(store, fmt, cache=cache, seq_len=seq_len, batch_size=batch_size,
                             dp_rank=dp_rank, dp_size=dp_size, seed=seed, text_field=text_field,
                             tokenizer=loaded,
                             prefetch_batches=prefetch_batches, stripes=stripes, agree=broadcast_from_rank0)
    return StreamingData(reader)
