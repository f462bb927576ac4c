"""Reading a shard's rows: the one parser, for the worker's loader and for data validation.

Both used to parse JSONL themselves with different rules (the worker decoded strict UTF-8 and
skipped blank lines; validation replaced bad bytes and reported blank lines as empty rows), so
a shard could pass validation and then stop the worker. Now `read_rows` yields every line as
one of three things and each caller applies its own *policy* to the same answer:

- a `dict` — a JSON object (jsonl) or `{"text": line}` (text);
- `BLANK` — an empty line: the worker skips it, validation counts it as an empty row;
- a `BadRow` — not UTF-8, not JSON, or JSON but not an object: the worker stops with the
  shard and line, validation counts it and keeps a few examples.

`.zst` shards are decompressed as they stream (`open_shard`). No torch here.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Final

import orjson

SNIPPET_CHARS = 120
"""How much of a bad line a report keeps."""


class _Blank:
    def __repr__(self) -> str:
        return "BLANK"


BLANK: Final = _Blank()
"""A line with nothing but whitespace."""


@dataclass(frozen=True)
class BadRow:
    """A line that is not a row: which shard and line, a snippet, and why."""

    shard: str
    line: int
    snippet: str
    error: str

    def describe(self) -> str:
        return f"{self.shard}:{self.line}: {self.error}"


Row = dict[str, Any]


def open_shard(raw: IO[bytes], key: str) -> IO[bytes]:
    """The shard's bytes, decompressed when the key ends in `.zst`."""
    if key.endswith(".zst"):
        import zstandard

        # Buffered, so lines can be iterated (the decompressor itself only reads blocks).
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))  # type: ignore[arg-type]
    return raw


def parse_line(line: bytes, fmt: str) -> Row | _Blank:
    """One line (without its newline) as a row; raises `ValueError` naming why it is not one.

    JSON is parsed by orjson (about 5× the standard library on text-heavy rows); a line it
    refuses goes through `json` too, which decides — so the rows accepted (NaN, huge integers)
    and the reasons given are exactly the standard library's."""
    if fmt == "jsonl":
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
        else:
            if isinstance(row, dict):
                return row
    text = line.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if fmt == "text":
        return {"text": text}
    if not text.strip():
        return BLANK
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg})") from e
    if not isinstance(row, dict):
        raise ValueError(f"a JSON {type(row).__name__}, not an object")
    return row


def read_rows(raw: IO[bytes], key: str, fmt: str) -> Iterator[tuple[int, Row | _Blank | BadRow]]:
    """(line number, row / BLANK / BadRow) for every line of one shard, in order."""
    if fmt not in ("jsonl", "text"):
        raise ValueError(f"rows of {fmt!r} shards are not read line by line; expected jsonl or text")
    yield from rows_of_lines(open_shard(raw, key), key, fmt)


def rows_of_lines(lines: Iterable[bytes], key: str, fmt: str, first_line: int = 1,
                  ) -> Iterator[tuple[int, Row | _Blank | BadRow]]:
    """`read_rows` of lines already decompressed (each with its newline), numbered from
    `first_line`: what a block of a shard that `trainyard.plugins.data.jsonl` hands back is read with."""
    for number, line in enumerate(lines, start=first_line):
        line = line.rstrip(b"\r\n")
        try:
            yield number, parse_line(line, fmt)
        except ValueError as e:
            snippet = line[:SNIPPET_CHARS].decode("utf-8", errors="replace")
            reason = str(e) if not isinstance(e, UnicodeDecodeError) else f"not UTF-8 ({e.reason})"
            yield number, BadRow(key, number, snippet, reason[:SNIPPET_CHARS])
