"""A shard's documents as UTF-8 pieces, for every format, in bounded memory — and the tokenizers.

`iter_documents` yields the text of a shard as `bytes` pieces with `END` after each document:

- `jsonl` (`.jsonl`, `.jsonl.zst`): one document per row, the row's `text_field`, parsed by
  `plugins.data.rows` (the parser validation uses). The training policy is strict: blank lines
  are skipped, any bad line stops the run naming the shard and line;
- `text` (`.txt`): the whole file is one document, read in `TEXT_PIECE_BYTES` pieces;
- `parquet`: one document per row of the `text_field` column, read one row group at a time
  with pyarrow (never the whole file).

A tokenizer turns pieces into token ids. `ByteTokenizer` (vocabulary 256, the identity on
UTF-8 bytes; 0 never occurs in text and marks document ends) is the demo's. A tokenizer from
the `tokenizers` library would plug in through the same `Tokenizer` protocol; that library is
not installed here, so no adapter ships yet. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import IO, Final, Protocol

TEXT_PIECE_BYTES = 1 << 20


class _End:
    def __repr__(self) -> str:
        return "END"


END: Final = _End()
"""Marks the end of a document in `iter_documents`."""


def iter_documents(f: IO[bytes], key: str, fmt: str, text_field: str = "text") -> Iterator[bytes | _End]:
    """The documents of one shard (opened binary, seekable for parquet), see the module docstring."""
    if fmt == "parquet":
        yield from _parquet_documents(f, key, text_field)
    elif fmt == "text":
        from plugins.data.rows import open_shard

        raw = open_shard(f, key)
        while piece := raw.read(TEXT_PIECE_BYTES):
            yield piece
        yield END
    elif fmt == "jsonl":
        yield from _jsonl_documents(f, key, text_field)
    else:
        raise ValueError(f"unknown dataset format {fmt!r}; expected jsonl, text or parquet")


def _jsonl_documents(f: IO[bytes], key: str, text_field: str) -> Iterator[bytes | _End]:
    from plugins.data.rows import BLANK, BadRow, read_rows

    for number, row in read_rows(f, key, "jsonl"):
        if row is BLANK:
            continue
        if isinstance(row, BadRow):
            raise ValueError(row.describe())
        text = row.get(text_field)  # type: ignore[union-attr]
        if not isinstance(text, str):
            raise ValueError(f"{key}:{number}: row has no string field {text_field!r}")
        yield text.encode("utf-8")
        yield END


def _parquet_documents(f: IO[bytes], key: str, text_field: str) -> Iterator[bytes | _End]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(f)
    if text_field not in pf.schema_arrow.names:
        raise ValueError(f"{key}: parquet shard has no column {text_field!r} "
                         f"(columns: {pf.schema_arrow.names})")
    for group in range(pf.num_row_groups):
        column = pf.read_row_group(group, columns=[text_field]).column(0)
        for number, value in enumerate(column.to_pylist(), start=1):
            if not isinstance(value, str):
                raise ValueError(f"{key}: row group {group} row {number}: {text_field!r} is "
                                 f"{type(value).__name__}, not a string")
            yield value.encode("utf-8")
            yield END


class Tokenizer(Protocol):
    vocab_size: int
    end_of_document: int
    """The id appended after each document."""

    def encode(self, piece: bytes) -> Sequence[int]:
        """Token ids of a UTF-8 piece (a `bytes` object is a sequence of ints)."""
        ...


class ByteTokenizer:
    """The identity on UTF-8 bytes (vocabulary 256); 0 ends a document."""

    vocab_size = 256
    end_of_document = 0

    def encode(self, piece: bytes) -> bytes:
        return piece


def load_tokenizer(name: str) -> Tokenizer:
    """`bytes` (the byte-level tokenizer); others are refused with what exists."""
    if name == "bytes":
        return ByteTokenizer()
    raise ValueError(f"unknown tokenizer {name!r}; available: 'bytes' (the `tokenizers` library "
                     "is not installed in this environment)")
