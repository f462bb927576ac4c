"""One row parser: the worker's loader and data validation read a shard the same way and differ
only in policy (the worker stops at a bad line, validation counts it)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import zstandard

from trainyard.plugins.data.datasets import sample_rows
from trainyard.plugins.data.rows import BLANK, BadRow, read_rows
from trainyard.plugins.storage.store import open_store
from trainyard.worker.data import load_bytes

SHARD = b'{"text": "a"}\n\n[1, 2]\nnot json\n{"text": "\xff"}\n' + '{"text": "é"}\r\n'.encode()


def test_each_line_is_a_row_a_blank_or_a_bad_row() -> None:
    rows = list(read_rows(io.BytesIO(SHARD), "s.jsonl", "jsonl"))
    assert [n for n, _ in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0][1] == {"text": "a"} and rows[1][1] is BLANK and rows[5][1] == {"text": "é"}
    bad = [r for _, r in rows if isinstance(r, BadRow)]
    assert [(b.line, b.error) for b in bad] == [
        (3, "a JSON list, not an object"), (4, "not JSON (Expecting value)"),
        (5, "not UTF-8 (invalid start byte)")]
    assert bad[0].describe() == "s.jsonl:3: a JSON list, not an object"


def test_compressed_shards_and_text_lines() -> None:
    packed = zstandard.ZstdCompressor().compress(b'{"text": "z"}\n')
    assert list(read_rows(io.BytesIO(packed), "s.jsonl.zst", "jsonl")) == [(1, {"text": "z"})]
    assert list(read_rows(io.BytesIO(b"x\ny\n"), "s.txt", "text")) == [(1, {"text": "x"}), (2, {"text": "y"})]
    with pytest.raises(ValueError, match="parquet"):
        list(read_rows(io.BytesIO(b""), "s.parquet", "parquet"))


def test_validation_flags_exactly_the_lines_that_stop_the_worker(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    store.put_bytes("s.jsonl", SHARD)
    sample = sample_rows(store, "jsonl", 10)
    assert sample.invalid_count == 3 and [b.line for b in sample.invalid] == [3, 4, 5]
    assert sample.rows == [{"text": "a"}, {}, {"text": "é"}]  # a blank line is an empty row here
    with pytest.raises(ValueError, match=r"^s\.jsonl:3: a JSON list, not an object$"):
        load_bytes(store)
    store.put_bytes("s.jsonl", b'{"text": "a"}\n\n{"text": "b"}\n')  # blank lines: skipped by the worker
    assert bytes(load_bytes(store).tolist()) == b"a\x00b\x00"
