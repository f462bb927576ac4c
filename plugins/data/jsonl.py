"""A JSONL shard's texts a block of lines at a time: one msgspec call per block, not one per row.

`trainyard.plugins.data.rows` parses a shard line by line (orjson, then `json` for what orjson
refuses) and stays the definition of a row. Training needs only each row's text field, so
`trainyard.plugins.data.documents.token_pieces` reads a jsonl shard here: `line_blocks` cuts the
decompressed bytes into blocks of whole lines (about `BLOCK_BYTES`; a line split across reads
of the stream is carried into the next block), and `block_texts` decodes a block's rows in one
`msgspec.json.Decoder.decode_lines` call into a struct holding only the text field (the other
fields are skipped, never built as Python objects). It also hands back the block's newline
count, which its check of the lines (below) finds anyway: the caller numbers the next block's
lines from it, and a block is scanned for newlines once, not twice: the parse of 64 MB of
the benchmark's rows took 0.046 CPU-s instead of 0.069 with a `bytes.count` of every block
(medians of 7 interleaved passes each, load 6.6 on 2 cores).

The block path answers only when its answer is provably the line parser's; otherwise it says
None and the caller reads that block with `rows.rows_of_lines` — the same rows, and the same
error naming the shard and line. It answers when:

- msgspec decoded the block: every row is a JSON object whose text field is a string. msgspec
  is strict JSON: what the standard library also accepts (NaN, Infinity, lone surrogates)
  goes the line parser's way;
- every line that is not empty (after one trailing `\\r`) starts with `{` and ends with `}`, and
  there are as many rows as such lines — so each line holds one object: `}`, whitespace, `{`
  occurs only between two top-level values (a raw newline cannot be inside a string), and
  msgspec alone would accept two objects on a line, or one across lines;
- the block is UTF-8: msgspec checks the strings it decodes, not the ones it skips. An ASCII
  block needs no check (`bytes.isascii`, ~0.06 ms a MB); another is decoded by CPython (~0.6
  ms a MB of mostly-ASCII text, ~1.1 of text dense in CJK; pyarrow's validator, 0.7, is not
  in the training image's dependencies).

Measured against the alternatives on the same bytes by `benchmarks/data_pipeline.py` (64 shards
of 2 KB rows; parse-only passes, parse + cut, medians of 3 rounds, samples/s and CPU-s a pass):

| run | this parser | line parser (orjson a line) | pyarrow's JSON reader | this, 2 processes |
|---|---|---|---|---|
| fde7f92, load 18.6 -> 13 | 592 k, 0.098 | 505 k, 0.104 | 276 k, 0.191 | 333 k, 0.467 |
| 1035b5a, load 1.5 -> 1.9 | 2.21 M, 0.110 | 2.63 M, 0.095 | 1.15 M, 0.196 | 0.81 M, 0.549 |
| 2848ca0, load 7.5 -> 10.9 | 3.29 M, 0.066 | 2.86 M, 0.078 | 1.10 M, 0.163 | 0.60 M, 0.411 |

And inside the reader's cold pass (`stream_*_samples_s`: `StreamingReader` with its parser
swapped; CPU-s a pass, this process's and the pool's workers'), the same runs (and 414c558's, load
8.9 -> 7.2: 348 k, 0.367 | 429 k, 0.464 | 355 k, 0.694):

| run | this parser | pyarrow's JSON reader | this, 2 processes |
|---|---|---|---|
| 2848ca0, load 7.5 -> 10.9 | 396 k, 0.382 | 349 k, 0.465 | 350 k, 0.718 |
| 3aae33a, load 10.7 -> 16.2 | 139 k, 0.383 | 106 k, 0.470 | 154 k, 0.656 |
| 23a82ed, load 5.5 -> 5.6 | 425 k, 0.319 | 465 k, 0.405 | 348 k, 0.632 |
| 23a82ed, load 5.4 -> 4.6 | 611 k, 0.375 | 579 k, 0.415 | 429 k, 0.673 |

So this parser stays: pyarrow's reader and the pool move the parse off the GIL, but the cold
pass is bound by the CPU it asks of the machine's two cores (shared with the store's endpoint
and other work), not by the GIL, and pyarrow's column building costs 11-27 % more of it a pass
in every run (its wall rate 0.76-1.23x this parser's, the runs disagreeing), the pool's pickling
70-100 % more. The line parser it replaced is within ~15 % either way (the
runs disagree on the sign; since 801f7f1 a block is scanned for newlines once, 0.069 -> 0.046
CPU-s a 64 MB parse). Neither parser binds the cold stream: parse-only runs 2-5x fetch-only.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import IO, Any, NamedTuple

import msgspec
import numpy as np

BLOCK_BYTES = 4 << 20
"""About how much of a shard one block holds (memory: a few times this)."""

_NEWLINE, _RETURN, _OPEN, _CLOSE = 10, 13, ord("{"), ord("}")


def line_blocks(raw: IO[bytes], block_bytes: int | None = None) -> Iterator[bytes]:
    """Blocks of whole lines of the stream's bytes, read `block_bytes` (default `BLOCK_BYTES`)
    at a time, in order; a line longer than a read is held until its newline (or the end)
    arrives. Every block but the last ends with a newline; the caller numbers the lines."""
    block_bytes = block_bytes or BLOCK_BYTES
    held: list[bytes] = []  # a line the reads so far have not finished
    while chunk := raw.read(block_bytes):
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            held.append(chunk)
            continue
        yield b"".join([*held, chunk[:cut]]) if held else chunk[:cut]
        held = [chunk[cut:]] if cut < len(chunk) else []
    if held:
        yield b"".join(held)


@lru_cache(maxsize=16)
def _decoder(text_field: str) -> msgspec.json.Decoder[Any]:
    # gc=False: a block's thousands of rows are not tracked by the garbage collector (with them
    # tracked, its passes tripled the block's decoding time).
    row = msgspec.defstruct("Row", [("text", str)], rename={"text": text_field}, gc=False)
    return msgspec.json.Decoder(row)


class BlockTexts(NamedTuple):
    texts: list[str]
    """Each row's text field, in order."""
    newlines: int
    """The block's newlines: how many lines the next block's numbering starts after."""


def block_texts(block: bytes, text_field: str) -> BlockTexts | None:
    """Each row's text field and the block's newline count, when the line parser would read the
    block's rows the same (the module docstring); None when it must be asked."""
    try:
        rows = _decoder(text_field).decode_lines(block)
    except msgspec.DecodeError:  # a ValidationError too: not an object, no string text field
        return None
    newlines = object_lines(block, len(rows))
    if newlines is None or not is_utf8(block):
        return None
    return BlockTexts([row.text for row in rows], newlines)


def object_lines(block: bytes, rows: int) -> int | None:
    """The block's newline count when `rows` is the number of its lines that are not empty (but
    for one trailing `\\r`) and each of those starts with `{` and ends with `}`; else None."""
    a = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(a == _NEWLINE)
    newlines = len(ends)
    if len(a) and a[-1] != _NEWLINE:
        ends = np.append(ends, len(a))  # the last line has no newline
    if not len(ends):
        return 0 if rows == 0 else None
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, ends[:-1] + 1
    last = ends - 1
    last -= (last >= starts) & (a[np.maximum(last, 0)] == _RETURN)
    full = last >= starts
    if np.count_nonzero(full) != rows:
        return None
    if (a[starts[full]] == _OPEN).all() and (a[last[full]] == _CLOSE).all():
        return newlines
    return None


def is_utf8(data: bytes) -> bool:
    """Whether `data` is valid UTF-8 (ASCII is, and is told apart fastest)."""
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
