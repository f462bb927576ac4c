"""The block parser of jsonl shards (`trainyard.plugins.data.jsonl`) against the line parser it
replaces on the training path: for every edge case, `token_pieces` gives exactly the ids of
`iter_documents` (the line parser) — or raises the same error naming the same line — whatever
the block size, and the block path itself answers for ordinary rows."""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zstandard

from tests.support.datasets import write_jsonl_dataset
from trainyard.plugins.data import jsonl
from trainyard.plugins.data.documents import (
    ByteTokenizer,
    FileTokenizer,
    Tokenizer,
    encode_pieces,
    iter_documents,
    token_pieces,
)
from trainyard.plugins.data.manifest import ShardEntry

ROWS = [json.dumps({"text": t}) for t in ("plain", "é ü 東京 😀", "", "a\nb\tc \"q\" \\ \u0000", "x" * 300)]

CASES: dict[str, bytes] = {
    "ordinary": "\n".join(ROWS).encode() + b"\n",
    "unicode_raw_and_escaped": '{"text": "naïve 東京 😀"}\n{"text": "na\\u00efve \\ud83d\\ude00"}\n'.encode(),
    "ensure_ascii_false": (json.dumps({"text": "Grüße"}, ensure_ascii=False) + "\n").encode(),
    "empty_lines_and_crlf": b'\n{"text": "a"}\r\n\r\n\n{"text": "b"}\n\n',
    "no_final_newline": b'{"text": "a"}\n{"text": "b"}',
    "whitespace_lines_and_padding": b'  \n {"text": "a"} \n\t\n{"text": "b"}\r\r\n',
    "unicode_blank_line": '{"text": "a"}\n\u00a0\n{"text": "b"}\n'.encode(),
    "other_fields": b'{"id": 1, "meta": {"a": [1, {"b": null}]}, "text": "a", "ok": true}\n',
    "standard_library_only": b'{"text": "a", "x": NaN, "y": -Infinity, "z": 1e400}\n{"text": "b", "s": "\\ud800"}\n',
    "big_integer": b'{"text": "a", "n": 123456789012345678901234567890}\n',
    "duplicate_text_key": b'{"text": "first", "text": "last"}\n',
    "escaped_key": b'{"t\\u0065xt": "a"}\n',
    "two_objects_on_a_line": b'{"text": "a"}\n{"text": "b"} {"text": "c"}\n',
    "object_across_lines": b'{"text": "a"}\n{"text":\n"b"}\n',
    "carriage_return_between_objects": b'{"text": "a"}\r{"text": "b"}\n',
    "byte_order_mark": b'\xef\xbb\xbf{"text": "a"}\n',
    "bad_utf8_in_text": b'{"text": "a"}\n{"text": "\xff"}\n',
    "bad_utf8_in_another_field": b'{"text": "a"}\n{"text": "b", "x": "\xed\xa0\x80"}\n',
    "not_json": b'{"text": "a"}\n{"text": "b"\n',
    "a_list": b'{"text": "a"}\n[1, 2]\n',
    "no_text_field": b'{"text": "a"}\n{"body": "b"}\n',
    "null_text": b'{"text": null}\n',
    "number_text": b'{"text": 3}\n',
    "lone_surrogate_in_text": b'{"text": "a\\ud800"}\n',
    "Infinity_spelled_as_Inf": b'{"text": "a", "x": Inf}\n',
    "trailing_comma": b'{"text": "a",}\n',
    "empty_shard": b"",
}


def by_lines(data: bytes, tokenizer: Tokenizer, key: str = "s.jsonl") -> tuple[str, object]:
    """The line parser's answer: the shard's ids, or its error's type and message."""
    try:
        return "ids", encode_pieces(tokenizer, list(iter_documents(io.BytesIO(data), key, "jsonl"))).tolist()
    except ValueError as e:
        return type(e).__name__, str(e)


def by_blocks(data: bytes, tokenizer: Tokenizer, key: str = "s.jsonl") -> tuple[str, object]:
    try:
        pieces = list(token_pieces(io.BytesIO(data), key, "jsonl", tokenizer))
    except ValueError as e:
        return type(e).__name__, str(e)
    return "ids", np.concatenate(pieces).tolist() if pieces else []


@pytest.mark.parametrize("block_bytes", [None, 1, 7, 40])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_block_parser_gives_the_line_parsers_ids_or_error(case: str, block_bytes: int | None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if block_bytes is not None:  # small reads: lines split across reads of the stream
        monkeypatch.setattr(jsonl, "BLOCK_BYTES", block_bytes)
    assert by_blocks(CASES[case], ByteTokenizer()) == by_lines(CASES[case], ByteTokenizer())


def test_errors_name_the_shards_line_whichever_block_it_is_in(monkeypatch: pytest.MonkeyPatch) -> None:
    data = CASES["ordinary"] * 3 + b'{"text": "a"}\nnot json\n'
    monkeypatch.setattr(jsonl, "BLOCK_BYTES", 64)
    assert by_blocks(data, ByteTokenizer()) == ("ValueError", "s.jsonl:17: not JSON (Expecting value)")


def test_the_block_path_answers_for_ordinary_rows_and_refuses_what_it_cannot_vouch_for() -> None:
    for case in ("ordinary", "unicode_raw_and_escaped", "ensure_ascii_false", "empty_lines_and_crlf",
                 "no_final_newline", "other_fields", "duplicate_text_key"):
        assert jsonl.block_texts(CASES[case], "text") is not None, case
    assert jsonl.block_texts(CASES["ordinary"], "text") == ([json.loads(r)["text"] for r in ROWS], len(ROWS))
    for case in ("two_objects_on_a_line", "object_across_lines", "carriage_return_between_objects",
                 "byte_order_mark", "bad_utf8_in_another_field", "standard_library_only",
                 "whitespace_lines_and_padding", "no_text_field", "Infinity_spelled_as_Inf"):
        assert jsonl.block_texts(CASES[case], "text") is None, case
    assert jsonl.block_texts(b'{"body": "b"}\n', "body") == (["b"], 1)  # the spec's text field


def test_line_blocks_carry_a_split_line_into_the_next_block() -> None:
    data = b'{"text": "aaaa"}\n\n{"text": "bbbbbbbbbbbbbbbbbbbb"}\n{"text": "c"}'
    blocks = list(jsonl.line_blocks(io.BytesIO(data), 10))
    assert b"".join(blocks) == data
    assert all(b.endswith(b"\n") for b in blocks[:-1])
    assert [b.count(b"\n") for b in blocks] == [2, 1, 0]
    assert jsonl.is_utf8("東京".encode()) and not jsonl.is_utf8(b"\xed\xa0\x80")


@pytest.mark.parametrize("block_bytes", [1, 7, 40, 1 << 20])
def test_a_block_the_block_path_answers_for_counts_its_newlines(block_bytes: int) -> None:
    """The next block's line numbers start from the count the block path hands back (the
    parse scans a block for newlines once): it is the block's own, whatever the block."""
    answered = 0
    for case, data in CASES.items():
        for block in jsonl.line_blocks(io.BytesIO(data), block_bytes):
            parsed = jsonl.block_texts(block, "text")
            if parsed is not None:
                assert parsed.newlines == block.count(b"\n"), (case, block)
                answered += 1
    assert answered >= 7  # at least the ordinary cases (the test above names them)


def test_a_bad_line_after_blocks_the_block_path_read_is_named_by_its_own_number(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Blank lines, CRLF and a final line without a newline in the blocks before it: the
    error names the line the line parser names."""
    good = CASES["empty_lines_and_crlf"] + CASES["ordinary"] * 2
    data = good + b'{"text": "a"}\n{"text": "b",}\n'
    bad_line = good.count(b"\n") + 2
    for block_bytes in (16, 64, 1 << 20):
        monkeypatch.setattr(jsonl, "BLOCK_BYTES", block_bytes)
        error = by_blocks(data, ByteTokenizer())
        assert error == by_lines(data, ByteTokenizer())
        assert error[0] == "ValueError" and f"s.jsonl:{bad_line}: not JSON" in str(error[1])


def test_a_stream_resumed_mid_shard_gives_the_line_parsers_samples(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The sample stream read through the block parser (several blocks a shard), from the start
    and resumed from positions inside a shard, gives the samples of the same stream read
    through the line parser (`iter_documents`): same ids, same cut, same order."""
    from trainyard.plugins.data.manifest import list_manifest
    from trainyard.plugins.data.stream import SampleStream, StreamPosition
    from trainyard.plugins.storage.store import open_store

    store = open_store((tmp_path / "ds").as_uri())
    write_jsonl_dataset(store, shards=3, rows=40, row_bytes=90)
    store.put_bytes("shard-00003.jsonl", CASES["empty_lines_and_crlf"] * 30 + CASES["unicode_raw_and_escaped"] * 20)
    manifest = list_manifest(store, "jsonl")
    monkeypatch.setattr(jsonl, "BLOCK_BYTES", 500)

    def line_parsed(shard: ShardEntry) -> Iterator[np.ndarray]:
        with store.open_read(shard.key) as f:
            yield encode_pieces(ByteTokenizer(), list(iter_documents(f, shard.key, "jsonl")))

    def stream(**kw: object) -> SampleStream:
        return SampleStream(manifest, lambda shard: store.open_read(shard.key), ByteTokenizer(), seq_len=15, seed=3,
                            shuffle_block=8, **kw)  # type: ignore[arg-type]

    blocks, lines = stream(), stream(tokens=line_parsed)
    expected = list(itertools.islice(lines.samples(StreamPosition()), 400))
    got = list(itertools.islice(blocks.samples(StreamPosition()), 400))
    assert [(p, w.tolist()) for p, w in got] == [(p, w.tolist()) for p, w in expected]
    inside = [k for k, (p, _) in enumerate(expected[:-20]) if p.offset > p.shard_start][::37]
    assert len(inside) >= 5
    for k in inside:
        resumed = list(itertools.islice(blocks.samples(expected[k][0]), 20))
        assert [(p, w.tolist()) for p, w in resumed] == [(p, w.tolist()) for p, w in expected[k + 1:k + 21]]


def test_compressed_shards_and_a_tokenizers_file_give_the_same_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.train_from_iterator([json.loads(r)["text"] for r in ROWS] * 5, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]", "<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe = FileTokenizer(hf.to_str().encode(), "tokenizer.json")
    data = b"".join(CASES[c] for c in ("ordinary", "unicode_raw_and_escaped", "empty_lines_and_crlf"))
    packed = zstandard.ZstdCompressor().compress(data)
    monkeypatch.setattr(jsonl, "BLOCK_BYTES", 50)
    for tokenizer in (ByteTokenizer(), bpe):
        expected = by_lines(data, tokenizer)
        assert expected[0] == "ids" and len(expected[1]) > 20  # type: ignore[arg-type]
        assert by_blocks(data, tokenizer) == expected
        assert by_blocks(packed, tokenizer, "s.jsonl.zst") == expected
