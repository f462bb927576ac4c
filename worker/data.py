"""Byte-level language-model data: a dataset's text shards → fixed-length token windows.

The tokenizer is the identity on UTF-8 bytes (vocabulary 256). A dataset's rows are read in
shard-key order and joined with a 0 byte between rows (a document boundary: 0 never occurs in
text), and the stream is cut into non-overlapping windows of `seq_len + 1` bytes; sample i is
window i, its input the first `seq_len` tokens and its target the last `seq_len` (shifted by
one). Samples are addressed by index, so the sampler alone decides the order.

The whole dataset is held in memory as one uint8 tensor: the demo's 466 kB (and anything up
to a few GB) fits; a streaming reader for larger data would keep this module's interface.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from plugins.storage.store import ObjectStore

log = logging.getLogger(__name__)

DOCUMENT_SEPARATOR = 0
"""Byte between two rows: a document boundary the model learns to predict."""

READABLE_FORMATS = ("jsonl", "text")
"""What the byte-level loader reads (parquet shards validate, but are not read here)."""


def shard_keys(store: ObjectStore, fmt: str) -> list[str]:
    """The dataset's shard keys, sorted (the order that defines the byte stream)."""
    from plugins.data.shards import list_shards

    if fmt not in READABLE_FORMATS:
        raise ValueError(f"dataset format {fmt!r} is not readable by the byte-level loader; "
                         f"use one of {list(READABLE_FORMATS)}")
    keys = [o.key for o in list_shards(store, fmt)]
    if not keys:
        raise FileNotFoundError(f"no {fmt} shards under {store.uri}")
    return keys


def iter_rows(raw: bytes, key: str, fmt: str, text_field: str) -> Iterator[bytes]:
    """UTF-8 bytes of each row of one shard (its whole content in `raw`). A text shard is one
    document; a JSONL shard is parsed by `plugins.data.rows` (the parser validation uses), and
    this loader's policy is strict: blank lines are skipped, any bad line stops the run."""
    from plugins.data.rows import BLANK, BadRow, open_shard, read_rows

    if fmt == "text":
        yield open_shard(io.BytesIO(raw), key).read()
        return
    for number, row in read_rows(io.BytesIO(raw), key, fmt):
        if row is BLANK:
            continue
        if isinstance(row, BadRow):
            raise ValueError(row.describe())
        text = row.get(text_field)  # type: ignore[union-attr]
        if not isinstance(text, str):
            raise ValueError(f"{key}:{number}: row has no string field {text_field!r}")
        yield text.encode("utf-8")


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
    from plugins.data.shards import open_dataset

    store = open_dataset(source, object_store=object_store, endpoint_url=endpoint_url)
    tokens = load_bytes(store, fmt=fmt, text_field=text_field)
    windows = TokenWindows(tokens, seq_len)
    log.info("dataset %s: %d bytes, %d samples of %d tokens", store.uri, tokens.numel(),
             len(windows), seq_len)
    return windows
