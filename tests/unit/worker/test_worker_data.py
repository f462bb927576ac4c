"""The byte-level data path: shards → token stream → windows, and the demo dataset that
`trainyard data prepare-demo` writes."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
import zstandard

from tests.support.procs import REPO_ROOT
from trainyard.cli.main import main
from trainyard.config.loader import load_spec_file
from trainyard.plugins.storage.store import open_store
from trainyard.plugins.validation.dataset import check_dataset
from trainyard.worker.data import DOCUMENT_SEPARATOR, TokenWindows, load_bytes, open_dataset_windows
from trainyard.worker.demo_data import demo_rows


def test_rows_are_joined_in_key_order_with_separators(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    store.put_bytes("b.jsonl", b'{"text": "c"}\n')
    store.put_bytes("a.jsonl", '{"text": "é"}\n\n{"text": "b"}\n'.encode())
    store.put_bytes("z.jsonl.zst", zstandard.ZstdCompressor().compress(b'{"text": "z"}\n'))
    store.put_bytes("_manifest.json", b"{}")
    data = load_bytes(store).tolist()
    sep = DOCUMENT_SEPARATOR
    assert bytes(data) == b"\xc3\xa9" + bytes([sep]) + b"b" + bytes([sep]) + b"c" + bytes([sep]) + b"z" + bytes([sep])


def test_text_format_reads_whole_files(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    store.put_bytes("doc.txt", b"hello\nworld")
    assert bytes(load_bytes(store, fmt="text").tolist()) == b"hello\nworld\x00"


@pytest.mark.parametrize(("content", "match"), [(b"not json\n", "a.jsonl:1: not JSON"),
                                                (b'{"body": "x"}\n', "no string field 'text'")])
def test_bad_rows_name_the_shard_and_line(tmp_path: Path, content: bytes, match: str) -> None:
    store = open_store(tmp_path.as_uri())
    store.put_bytes("a.jsonl", content)
    with pytest.raises(ValueError, match=match):
        load_bytes(store)


def test_missing_shards_and_unknown_formats_are_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    with pytest.raises(FileNotFoundError, match="no jsonl shards"):
        load_bytes(store)
    with pytest.raises(ValueError, match="parquet"):
        load_bytes(store, fmt="parquet")


def test_windows_are_disjoint_and_shifted_by_one() -> None:
    tokens = torch.arange(23, dtype=torch.uint8)
    windows = TokenWindows(tokens, seq_len=5)
    assert len(windows) == 4  # (23 - 1) // 5
    inputs, targets = windows.batch([0, 3])
    assert inputs.tolist() == [[0, 1, 2, 3, 4], [15, 16, 17, 18, 19]]
    assert targets.tolist() == [[1, 2, 3, 4, 5], [16, 17, 18, 19, 20]]
    assert inputs.dtype == torch.int64
    with pytest.raises(IndexError):
        windows[4]
    with pytest.raises(ValueError, match="fewer than one sample"):
        TokenWindows(torch.zeros(3, dtype=torch.uint8), seq_len=5)


def test_prepare_demo_writes_shards_manifest_and_the_dataset_validates(tmp_path: Path, capsys) -> None:
    uri = (tmp_path / "objects").as_uri()
    assert main(["data", "prepare-demo", "--object-store", uri, "--shards", "5"]) == 0
    store = open_store(uri).child("datasets/pydoc-topics")
    keys = sorted(o.key for o in store.list(""))
    assert keys == ["_manifest.json", *(f"shard-{i:05d}.jsonl" for i in range(5))]
    manifest = json.loads(store.get_bytes("_manifest.json"))
    shards = {s["key"]: s for s in manifest["shards"]}
    whole = hashlib.sha256()
    rows = []
    for key in keys[1:]:
        data = store.get_bytes(key)
        whole.update(data)
        assert shards[key]["sha256"] == hashlib.sha256(data).hexdigest()
        lines = [json.loads(line)["text"] for line in data.decode().splitlines()]
        assert shards[key]["rows"] == len(lines)
        rows += lines
    assert manifest["sha256"] == whole.hexdigest() and manifest["rows"] == len(rows)
    assert rows == demo_rows()
    assert all(0 < len(r.encode()) <= 4096 for r in rows)
    from pydoc_data.topics import topics  # every byte of the docs' text is there

    assert sum(len(r) for r in rows) >= 0.98 * sum(len(t) for t in topics.values())
    duplicates = sum(n - 1 for n in Counter(rows).values())
    assert duplicates / len(rows) < 0.01  # the data-quality gate's default threshold

    # The spec's source (a prefix under the store) resolves to it, for the dry run and the worker.
    job = load_spec_file(REPO_ROOT / "config/jobs/demo-tiny-lm.yaml")
    from trainyard.config.settings import Settings

    assert check_dataset(job, Settings(home=tmp_path, object_store=uri)) == []
    windows = open_dataset_windows(job.spec.dataset.source, object_store=uri, seq_len=128)
    assert len(windows) > 3200  # 200 steps × 16 sequences: one epoch covers the demo run


def test_prepare_demo_is_repeatable_and_drops_stale_shards(tmp_path: Path, capsys) -> None:
    uri = (tmp_path / "objects").as_uri()
    assert main(["data", "prepare-demo", "--object-store", uri, "--shards", "6", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["data", "prepare-demo", "--object-store", uri, "--shards", "3", "--json"]) == 0
    assert main(["data", "prepare-demo", "--object-store", uri, "--shards", "6", "--json"]) == 0
    capsys.readouterr()
    assert main(["data", "prepare-demo", "--object-store", uri, "--shards", "2", "--json"]) == 0
    last = json.loads(capsys.readouterr().out)
    store = open_store(uri).child("datasets/pydoc-topics")
    assert sorted(o.key for o in store.list("")) == ["_manifest.json", "shard-00000.jsonl", "shard-00001.jsonl"]
    assert last["rows"] == first["rows"]
    again = main(["data", "prepare-demo", "--object-store", uri, "--shards", "6", "--json"])
    assert again == 0 and json.loads(capsys.readouterr().out)["sha256"] == first["sha256"]


def test_prepare_demo_refuses_more_shards_than_rows(tmp_path: Path, capsys) -> None:
    assert main(["data", "prepare-demo", "--object-store", tmp_path.as_uri(), "--shards", "100000"]) == 2
    assert "shards must be between 1 and" in capsys.readouterr().err
