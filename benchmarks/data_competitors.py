"""What `benchmarks/data_pipeline.py` holds the streaming reader against, beside its baseline.

- `dataloader_pass`: what a PyTorch user writes first — a `torch.utils.data.DataLoader` with
  `num_workers=2` over an `IterableDataset` of the same shards: each worker lists nothing (it
  is given the keys), makes its own boto3 client, `get_object`s its shards (every second one
  of the epoch's order), parses each line with orjson, tokenizes with the pipeline's own
  tokenizer (`ByteTokenizer.encode_pieces`), cuts the same windows, shuffles each block of 256
  with the same permutation and yields batches of 16 as NumPy arrays (`_as_is`: its fastest
  collate here). Same samples as the pipeline, in another order (the workers interleave),
  workers started per epoch as a user's would be;
- `parse_only_pass`: the ceiling of parsing — every shard's bytes already in memory, through
  the pipeline's own parser, tokenizer and cutter (`SampleStream`), one epoch. `parser` names
  the alternatives measured beside the pipeline's (`product`: msgspec, a block of lines per
  call, `trainyard.plugins.data.jsonl`): `line` — the line parser it replaced (orjson per
  line, `rows.read_rows`); `pyarrow` — `pyarrow.json.read_json` of the shard (multi-threaded
  C++, outside the GIL) with the documents joined by `pyarrow.compute`, no Python object per
  row; `process_pool` — the pipeline's parser in two worker processes (`ProcessPoolExecutor`,
  started before the clock, three shards submitted ahead; the bytes go there and the token
  ids come back pickled). `check_parsers` holds each one's token ids to the pipeline's, untimed;
- `jsonl_parser`: the same alternatives inside the streaming reader itself, for its cold pass
  (`StreamingReader` with its jsonl parser swapped: pyarrow's reader, or the pool) — what each
  lever does where the fetch, the cut and the cache's writes share the machine with it;
- `bpe_tokenizer` / `bpe_pass`: the tokenizer lever — a BPE `tokenizer.json` trained here on
  the benchmark's rows, its documents encoded in one batched call (`FileTokenizer.encode_documents`:
  `encode_batch`, the library's threads outside the GIL) or one `encode` call per document;
- `mmap_pass`: the ceiling of the warm cache — the same token ids in one memory-mapped file
  (written untimed), cut into the same windows, block-shuffled the same way and stacked into
  the same batches (checked byte for byte against the baseline by the caller).

No wall-clock threshold lives here: each returns (samples, seconds) for the caller's ratios.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

BLOCK = 256
"""The pipeline's shuffle block (`SampleStream(shuffle_block=256)`, its default)."""


def _blocks_to_batches(windows: np.ndarray, key: str, pending: list[np.ndarray], batch: int,
                       ) -> Iterator[np.ndarray]:
    """Shuffle `windows` block by block as the pipeline does and emit whole batches; what
    does not fill a batch stays in `pending` for the next shard."""
    from trainyard.plugins.data.stream import ORDER_VERSION, block_permutation

    for number, start in enumerate(range(0, len(windows), BLOCK)):
        block = windows[start:start + BLOCK]
        pending.append(block[block_permutation(len(block), 0, 0, key, number, ORDER_VERSION)])
    rows = np.concatenate(pending) if len(pending) > 1 else pending[0]
    whole = len(rows) // batch * batch
    for at in range(0, whole, batch):
        yield rows[at:at + batch]
    pending[:] = [rows[whole:]] if whole < len(rows) else []


def _windows(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    if len(tokens) < seq_len + 1:
        return np.empty((0, seq_len + 1), tokens.dtype)
    return np.lib.stride_tricks.sliding_window_view(tokens, seq_len + 1)[::seq_len]


class ShardsDataset(torch.utils.data.IterableDataset):  # type: ignore[misc]
    """The `IterableDataset` a user writes (the module docstring): one boto3 client per worker."""

    def __init__(self, bucket: str, prefix: str, keys: list[str], endpoint: str, seq_len: int,
                 batch: int) -> None:
        self.bucket, self.prefix, self.keys, self.endpoint = bucket, prefix, keys, endpoint
        self.seq_len, self.batch = seq_len, batch

    def __iter__(self) -> Iterator[np.ndarray]:
        import boto3
        import orjson

        from trainyard.plugins.data.documents import END, ByteTokenizer

        info = torch.utils.data.get_worker_info()
        mine = self.keys[info.id::info.num_workers] if info is not None else self.keys
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        tokenizer, pending = ByteTokenizer(), []
        for key in mine:
            name = f"{self.prefix}/{key}" if self.prefix else key
            body = client.get_object(Bucket=self.bucket, Key=name)["Body"].read()
            pieces: list[Any] = []
            for line in body.splitlines():
                if line.strip():
                    pieces += [orjson.loads(line)["text"].encode("utf-8"), END]
            tokens = tokenizer.encode_pieces(pieces)
            yield from _blocks_to_batches(_windows(tokens, self.seq_len), key, pending, self.batch)


def dataloader_pass(bucket: str, prefix: str, keys: list[str], endpoint: str, seq_len: int,
                    batch: int, workers: int = 2) -> tuple[int, float]:
    """One epoch through `torch.utils.data.DataLoader(num_workers=workers)`: (samples, s).
    The parent makes a client first, as a script that listed the shards has: its session has
    loaded the S3 service model, and the forked workers inherit it instead of each spending
    ~0.4 s reading it again."""
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    loader = torch.utils.data.DataLoader(ShardsDataset(bucket, prefix, keys, endpoint, seq_len, batch),
                                         batch_size=None, num_workers=workers, collate_fn=_as_is)
    start, samples = time.perf_counter(), 0
    for rows in loader:
        samples += len(torch.from_numpy(rows))
    return samples, time.perf_counter() - start


def _as_is(rows: np.ndarray) -> np.ndarray:
    """The DataLoader's collate: none. Its default turns each batch into a tensor in the worker,
    which then travels through a shared-memory segment of its own — about 1 ms a batch here,
    13 k samples/s for batches of 16 (measured): a pickled array through the worker's pipe,
    made a tensor without a copy on arrival, is the competitor at its best."""
    return rows


PARSERS = ("product", "line", "pyarrow", "process_pool")
"""The parsers `parse_only_pass` measures (the module docstring)."""


def product_tokens(blob: bytes, key: str) -> np.ndarray:
    """A jsonl shard's byte-level token ids by the pipeline's parser (`token_pieces`)."""
    from trainyard.plugins.data.documents import ByteTokenizer, token_pieces

    pieces = list(token_pieces(io.BytesIO(blob), key, "jsonl", ByteTokenizer()))
    return np.concatenate(pieces) if pieces else np.empty(0, np.uint8)


def line_tokens(blob: bytes, key: str) -> np.ndarray:
    """The same by the line parser the pipeline used before (`iter_documents`: orjson a line)."""
    from trainyard.plugins.data.documents import ByteTokenizer, encode_pieces, iter_documents

    return encode_pieces(ByteTokenizer(), list(iter_documents(io.BytesIO(blob), key, "jsonl")))


def pyarrow_tokens(blob: bytes, key: str) -> np.ndarray:
    """The same by pyarrow's JSON reader: the text column, each document joined with a 0 by
    `pyarrow.compute` (C++, no Python object per row), its data buffer viewed by NumPy."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    table = pj.read_json(io.BytesIO(blob), read_options=pj.ReadOptions(use_threads=True, block_size=1 << 20),
                         parse_options=pj.ParseOptions(explicit_schema=pa.schema([("text", pa.string())]),
                                                       unexpected_field_behavior="ignore"))
    column = table.column(0).combine_chunks()
    joined = pc.binary_join_element_wise(column, pa.scalar("", pa.string()), "\x00")
    _, offsets, data = joined.buffers()
    at = np.frombuffer(offsets, np.int32)[joined.offset:joined.offset + len(joined) + 1]
    return np.frombuffer(data, np.uint8)[at[0]:at[-1]] if len(joined) else np.empty(0, np.uint8)


TOKENS_BY = {"product": product_tokens, "line": line_tokens, "pyarrow": pyarrow_tokens}


def check_parsers(manifest: Any, blobs: dict[str, bytes]) -> None:
    """Every parser's token ids equal the pipeline's on every shard (untimed), or raise."""
    for shard in manifest.shards:
        want = product_tokens(blobs[shard.key], shard.key)
        for name, tokens in TOKENS_BY.items():
            if not np.array_equal(tokens(blobs[shard.key], shard.key), want):
                raise RuntimeError(f"the {name} parser's token ids of {shard.key} differ from the pipeline's")


def parser_pool() -> Any:
    """The process pool of `parse_only_pass(parser="process_pool")`: two spawned workers, each
    made to import the parser before the clock starts (the caller shuts it down)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    for future in [pool.submit(product_tokens, b'{"text": "warm"}\n', "w.jsonl") for _ in range(4)]:
        future.result()
    return pool


def parse_only_pass(manifest: Any, blobs: dict[str, bytes], seq_len: int, parser: str = "product",
                    pool: Any = None) -> tuple[int, float]:
    """One epoch of `SampleStream` over shards already in memory, their token ids made by
    `parser` (`PARSERS`; `process_pool` needs `pool`, from `parser_pool`): (samples, seconds)."""
    from trainyard.plugins.data.documents import ByteTokenizer
    from trainyard.plugins.data.stream import SampleStream, StreamPosition

    prefetch = None
    if parser == "process_pool":
        futures: dict[str, Any] = {}

        def prefetch(shard: Any) -> None:
            if shard.key not in futures:
                futures[shard.key] = pool.submit(product_tokens, blobs[shard.key], shard.key)

        def tokens(shard: Any) -> Iterator[np.ndarray]:
            prefetch(shard)
            yield futures.pop(shard.key).result()
    else:
        make = TOKENS_BY[parser]

        def tokens(shard: Any) -> Iterator[np.ndarray]:
            yield make(blobs[shard.key], shard.key)

    stream = SampleStream(manifest, None, ByteTokenizer(), seq_len=seq_len, seed=0, tokens=tokens,
                          prefetch=prefetch, prefetch_ahead=3)
    start, samples = time.perf_counter(), 0
    for block in stream.blocks(StreamPosition()):
        if block.epoch > 0:
            break
        samples += len(block.windows)
    return samples, time.perf_counter() - start


@contextlib.contextmanager
def jsonl_parser(parser: str, pool: Any = None) -> Iterator[None]:
    """Within the block, the pipeline reads a jsonl shard's token ids with `parser` (`pyarrow`, or
    `process_pool` — the pipeline's parser in `pool`'s workers, the shard's bytes sent there and
    the ids back) instead of its own: the one function the reader parses a jsonl shard with
    (`documents._jsonl_token_pieces`) swapped, everything else (fetch, cache, cut) the reader's.
    `check_parsers` holds their ids to the pipeline's."""
    from unittest import mock

    from trainyard.plugins.data import documents

    def pieces(f: Any, key: str, tokenizer: Any, text_field: str) -> Iterator[np.ndarray]:
        if parser == "pyarrow":
            yield pyarrow_tokens(f.read(), key)
        elif parser == "process_pool":
            yield pool.submit(product_tokens, f.read(), key).result()
        else:
            raise ValueError(f"unknown parser {parser!r}")

    with mock.patch.object(documents, "_jsonl_token_pieces", pieces):
        yield


def bpe_tokenizer(texts: list[str], vocab: int = 2000) -> Any:
    """A `FileTokenizer` over a byte-level BPE `tokenizer.json` trained on `texts` (untimed)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from trainyard.plugins.data.documents import FileTokenizer

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["[UNK]", "<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return FileTokenizer(tok.to_str().encode(), "bpe.json")


def bpe_pass(tokenizer: Any, texts: list[str], batched: bool) -> tuple[np.ndarray, float, float]:
    """The documents' token ids, the end of document after each: (ids, seconds, CPU seconds of
    this process, the library's threads included). Batched: the pipeline's one `encode_batch`
    call (`FileTokenizer.encode_documents`); else one `encode` call per document."""
    start, cpu = time.perf_counter(), time.process_time()
    if batched:
        ids = tokenizer.encode_documents(texts)
    else:
        out: list[int] = []
        for text in texts:
            out += tokenizer._tokenizer.encode(text, add_special_tokens=False).ids
            out.append(tokenizer.end_of_document)
        ids = np.asarray(out, dtype=np.int64)
    return ids, time.perf_counter() - start, time.process_time() - cpu


def write_token_file(manifest: Any, blobs: dict[str, bytes], path: Path) -> list[tuple[str, int, int]]:
    """Every shard's token ids, in epoch order, in one file; (key, start, end) per shard."""
    from trainyard.plugins.data.documents import ByteTokenizer, token_pieces
    from trainyard.plugins.data.stream import epoch_order

    spans = []
    with open(path, "wb") as f:
        at = 0
        for i in epoch_order(len(manifest.shards), 0, 0):
            key = manifest.shards[i].key
            for piece in token_pieces(io.BytesIO(blobs[key]), key, manifest.format, ByteTokenizer()):
                f.write(piece.astype(np.uint8).tobytes())
            end = f.tell()
            spans.append((key, at, end))
            at = end
    return spans


def mmap_pass(path: Path, spans: list[tuple[str, int, int]], seq_len: int, batch: int,
              digest: hashlib._Hash | None = None, *, verify: bool = False) -> tuple[int, float]:
    """One epoch of batches cut from the memory-mapped token file: (samples, seconds). With
    `verify`, the file is hashed first with the cache's hash (`CACHE_HASH`), as the cache checks a
    hit it has not hashed before: what integrity costs."""
    from trainyard.plugins.data.cache import CACHE_HASH, chunk_digest

    start, samples = time.perf_counter(), 0
    tokens = np.memmap(path, dtype=np.uint8, mode="r")
    if verify:
        chunk_digest(tokens, CACHE_HASH)
    pending: list[np.ndarray] = []
    for key, first, end in spans:
        for rows in _blocks_to_batches(_windows(tokens[first:end], seq_len), key, pending, batch):
            if digest is not None:
                digest.update(np.ascontiguousarray(rows))
            samples += len(rows)
    return samples, time.perf_counter() - start
