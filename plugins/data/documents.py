"""A shard's documents as UTF-8 pieces, for every format, in bounded memory — and the tokenizers.

`iter_documents` yields the text of a shard as `bytes` pieces with `END` after each document:

- `jsonl` (`.jsonl`, `.jsonl.zst`): one document per row, the row's `text_field`, parsed by
  `trainyard.plugins.data.rows` (the parser validation uses). The training policy is strict: blank lines
  are skipped, any bad line stops the run naming the shard and line;
- `text` (`.txt`): the whole file is one document, read in `TEXT_PIECE_BYTES` pieces;
- `parquet`: one document per row of the `text_field` column, read one row group at a time
  with pyarrow (never the whole file).

A tokenizer turns pieces into token ids; `token_pieces` hands a shard's ids out as NumPy
arrays of a few MB of text each, the unit the sample stream cuts windows from. It reads a jsonl
shard a block of lines at a time instead (`trainyard.plugins.data.jsonl`: one msgspec call per
block, its figures there), with the same ids and errors. Two ship:

- `ByteTokenizer` (vocabulary 256, the identity on UTF-8 bytes; 0 never occurs in text and marks
  document ends) — the demo's;
- `FileTokenizer`: any `tokenizer.json` of Hugging Face's `tokenizers` library (BPE, WordPiece,
  Unigram), whose own end-of-text token ends documents; a batch of documents is encoded in
  one call (the library's threads, outside the GIL).

No torch here.
"""

from __future__ import annotations

import codecs
import io
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final, Protocol

import numpy as np

if TYPE_CHECKING:
    from trainyard.plugins.data.rows import BadRow, Row, _Blank
    from trainyard.plugins.storage.store import ObjectStore

TEXT_PIECE_BYTES = 1 << 20
TOKEN_PIECE_BYTES = 4 << 20
"""About how much text `token_pieces` tokenizes at once (memory: a few times this)."""


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
        from trainyard.plugins.data.rows import open_shard

        raw = open_shard(f, key)
        while piece := raw.read(TEXT_PIECE_BYTES):
            yield piece
        yield END
    elif fmt == "jsonl":
        from trainyard.plugins.data.rows import read_rows

        yield from _jsonl_documents(read_rows(f, key, "jsonl"), key, text_field)
    else:
        raise ValueError(f"unknown dataset format {fmt!r}; expected jsonl, text or parquet")


def _jsonl_documents(rows: Iterable[tuple[int, Row | _Blank | BadRow]], key: str, text_field: str,
                     ) -> Iterator[bytes | _End]:
    from trainyard.plugins.data.rows import BLANK, BadRow

    for number, row in rows:
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
    name: str
    """What a checkpoint records: a resume with another tokenizer is refused."""
    vocab_size: int
    end_of_document: int
    """The id appended after each document."""

    def encode(self, piece: bytes) -> Sequence[int]:
        """Token ids of a UTF-8 piece (a `bytes` object is a sequence of ints)."""
        ...


def token_pieces(f: IO[bytes], key: str, fmt: str, tokenizer: Tokenizer,
                 text_field: str = "text") -> Iterator[np.ndarray]:
    """The shard's token ids, `end_of_document` after each document, as int64-or-narrower
    arrays of about `TOKEN_PIECE_BYTES` of text each (bounded memory for any shard size).
    A jsonl shard is read a block of lines at a time (`_jsonl_token_pieces`): the same ids."""
    if fmt == "jsonl":
        yield from _jsonl_token_pieces(f, key, tokenizer, text_field)
        return
    batch: list[bytes | _End] = []
    size = 0
    for piece in iter_documents(f, key, fmt, text_field):
        batch.append(piece)
        if piece is not END:
            size += len(piece)  # type: ignore[arg-type]
            if size >= TOKEN_PIECE_BYTES:
                yield encode_pieces(tokenizer, batch)
                batch, size = [], 0
    if batch:
        yield encode_pieces(tokenizer, batch)


def _jsonl_token_pieces(f: IO[bytes], key: str, tokenizer: Tokenizer, text_field: str) -> Iterator[np.ndarray]:
    """A jsonl shard's token ids a block of lines at a time (`trainyard.plugins.data.jsonl`): a
    block its one msgspec call cannot vouch for is read by
    the line parser (`rows.rows_of_lines`, numbered from the block's first line), so the ids —
    and a bad line's error — are exactly `iter_documents`'s."""
    from trainyard.plugins.data.jsonl import block_texts, line_blocks
    from trainyard.plugins.data.rows import open_shard, rows_of_lines

    line = 1  # the number of the block's first line
    for block in line_blocks(open_shard(f, key)):
        parsed = block_texts(block, text_field)
        if parsed is not None:
            ids = encode_documents(tokenizer, parsed.texts)
            line += parsed.newlines
        else:
            rows = rows_of_lines(io.BytesIO(block), key, "jsonl", line)
            ids = encode_pieces(tokenizer, list(_jsonl_documents(rows, key, text_field)))
            line += block.count(b"\n")
        if len(ids):
            yield ids


def encode_documents(tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    """Token ids of whole documents, `end_of_document` after each, in one array. A tokenizer
    with its own `encode_documents` does it; others are handed UTF-8 pieces."""
    own = getattr(tokenizer, "encode_documents", None)
    if own is not None:
        return own(texts)  # type: ignore[no-any-return]
    pieces: list[bytes | _End] = []
    for text in texts:
        pieces += (text.encode("utf-8"), END)
    return encode_pieces(tokenizer, pieces)


def encode_pieces(tokenizer: Tokenizer, pieces: list[bytes | _End]) -> np.ndarray:
    """Token ids of consecutive pieces (`END` → `end_of_document`), in one array. A tokenizer
    with its own `encode_pieces` (batched) does it; others are asked piece by piece."""
    own = getattr(tokenizer, "encode_pieces", None)
    if own is not None:
        return own(pieces)  # type: ignore[no-any-return]
    ids: list[int] = []
    for piece in pieces:
        if piece is END:
            ids.append(tokenizer.end_of_document)
        else:
            ids.extend(tokenizer.encode(piece))  # type: ignore[arg-type]
    return np.asarray(ids, dtype=np.int64)


class ByteTokenizer:
    """The identity on UTF-8 bytes (vocabulary 256); 0 ends a document."""

    name = "bytes"
    vocab_size = 256
    end_of_document = 0

    def encode(self, piece: bytes) -> bytes:
        return piece

    def encode_pieces(self, pieces: list[bytes | _End]) -> np.ndarray:
        end = b"\x00"
        return np.frombuffer(b"".join(end if p is END else p for p in pieces), dtype=np.uint8)  # type: ignore[misc]

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        """The documents' UTF-8 bytes, 0 after each, in one join of the encoded documents — one
        large allocation, not two: a second block-sized buffer (joining the strings, then
        encoding) cost ~1 ms a MB in fresh pages, 9x this."""
        parts = [text.encode("utf-8") for text in texts]
        parts.append(b"")
        return np.frombuffer(b"\x00".join(parts), dtype=np.uint8)


END_OF_TEXT_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]", "<|eot_id|>")
"""The special tokens a `tokenizer.json` may name its end of text with, in the order tried."""


class FileTokenizer:
    """A Hugging Face `tokenizers` tokenizer from the text of its `tokenizer.json`.

    Documents end with the file's end-of-text token (the first of `END_OF_TEXT_TOKENS` it has).
    Text arrives as UTF-8 pieces that may split a character (a text file is read 1 MB at a
    time): an incremental decoder carries the split bytes to the next piece of the document.
    `name` says which file, with the SHA-256 of its content (what a checkpoint records: a resume
    with another tokenizer is refused).
    """

    def __init__(self, content: bytes, source: str) -> None:
        import hashlib

        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tokenizer = HFTokenizer.from_str(content.decode("utf-8"))
        except Exception as e:  # the library raises a bare Exception for a bad file
            raise ValueError(f"{source}: not a tokenizers `tokenizer.json` ({str(e)[:200]})") from e
        self.name = f"{source}@sha256:{hashlib.sha256(content).hexdigest()[:16]}"
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        ends = [(t, self._tokenizer.token_to_id(t)) for t in END_OF_TEXT_TOKENS]
        found = next(((t, i) for t, i in ends if i is not None), None)
        if found is None:
            raise ValueError(f"{source}: the tokenizer has none of the end-of-text tokens "
                             f"{list(END_OF_TEXT_TOKENS)}; add one as a special token")
        self.end_of_text, self.end_of_document = found
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    @classmethod
    def from_file(cls, path: str | Path) -> FileTokenizer:
        return cls(Path(path).read_bytes(), str(path))

    def encode(self, piece: bytes) -> list[int]:
        return list(self._tokenizer.encode(piece.decode("utf-8", "replace"), add_special_tokens=False).ids)

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        """Whole documents in one `encode_batch` (the library's threads, outside the GIL). Its
        threads pay where a core is free, and cost 7-24 % more CPU than one `encode` per
        document (`bpe_*` figures of `benchmarks/data_pipeline.py`, 2 cores): at load ~5 the
        batch ran 1.28-1.7x as fast, at load 7-14 0.6-1.14x (1.9 MB at load 14: 0.25 vs 0.26
        MB/s, 1.43 vs 1.34 CPU-s); with `TOKENIZERS_PARALLELISM=false` the batch, one call, was
        the faster and the cheaper (0.78 vs 0.69 MB/s, 1.06 vs 1.15 CPU-s). So the batch stays,
        and a node without spare cores can turn its threads off."""
        out: list[int] = []
        for encoding in self._tokenizer.encode_batch(texts, add_special_tokens=False):
            out.extend(encoding.ids)
            out.append(self.end_of_document)
        return np.asarray(out, dtype=np.int64)

    def encode_pieces(self, pieces: list[bytes | _End]) -> np.ndarray:
        texts: list[str] = []
        ends: list[bool] = []  # after texts[k], does a document end?
        for piece in pieces:
            if piece is END:
                tail = self._decoder.decode(b"", final=True)
                self._decoder.reset()
                if tail or not texts or ends[-1]:
                    texts.append(tail)
                    ends.append(True)
                else:
                    ends[-1] = True
            else:
                texts.append(self._decoder.decode(piece))  # type: ignore[arg-type]
                ends.append(False)
        out: list[int] = []
        for encoding, end in zip(self._tokenizer.encode_batch(texts, add_special_tokens=False), ends, strict=True):
            out.extend(encoding.ids)
            if end:
                out.append(self.end_of_document)
        return np.asarray(out, dtype=np.int64)


BYTES = "bytes"
"""The spec's name of the byte-level tokenizer."""


def load_tokenizer(name: str, store: ObjectStore | None = None) -> Tokenizer:
    """The spec's `dataset.tokenizer`: `bytes`, or the key of a `tokenizer.json` in the
    dataset's own prefix (read from `store`, the dataset's store), or — without a store — a
    local path."""
    if name == BYTES:
        return ByteTokenizer()
    if not name.endswith(".json"):
        raise ValueError(f"unknown tokenizer {name!r}; expected 'bytes' or a `tokenizer.json` file "
                         "beside the dataset's shards (e.g. 'tokenizer.json')")
    if store is None:
        return FileTokenizer.from_file(name)
    from trainyard.plugins.storage.errors import ObjectNotFoundError

    try:
        content = store.get_bytes(name)
    except ObjectNotFoundError as e:
        raise ValueError(f"tokenizer {name!r} is not in the dataset at {store.uri}; upload it "
                         "beside the shards") from e
    return FileTokenizer(content, f"{store.uri.rstrip('/')}/{name}")
