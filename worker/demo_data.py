"""The demo dataset: Python's own documentation topics (`pydoc_data.topics`, ~465 kB of text
that ships with every CPython), written as JSONL shards into the object store.

Each topic is cut at paragraph boundaries into rows of at most `max_row_bytes` (a few KB), the
rows are written in topic order to `shards` files `shard-00000.jsonl …` (`{"text": …}` per
line), and `_manifest.json` records the rows, bytes and SHA-256 of every shard and of the
whole dataset. The output depends only on the Python version's topics, so preparing twice
writes the same bytes; shards left from an earlier run with more shards are deleted.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.plugins.storage.store import ObjectStore

DEMO_PREFIX = "datasets/pydoc-topics/"
MANIFEST_KEY = "_manifest.json"
DEFAULT_SHARDS = 8
DEFAULT_MAX_ROW_BYTES = 4096


@dataclass(frozen=True)
class ShardInfo:
    key: str
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class PreparedDataset:
    uri: str
    """The store URI of the dataset's root."""
    rows: int
    bytes: int
    sha256: str
    """SHA-256 over the shards' bytes, in key order."""
    shards: tuple[ShardInfo, ...]


def topic_texts() -> list[tuple[str, str]]:
    """(topic, text) of every pydoc topic, sorted by topic."""
    from pydoc_data.topics import topics

    return sorted(topics.items())


def split_rows(text: str, max_row_bytes: int) -> Iterator[str]:
    """Cut `text` at paragraph (else line) boundaries into rows of at most `max_row_bytes`
    UTF-8 bytes; a single line longer than that becomes a row of its own."""
    pieces: list[str] = []
    for paragraph in text.split("\n\n"):
        if len(paragraph.encode()) <= max_row_bytes:
            pieces.append(paragraph)
        else:
            pieces.extend(paragraph.split("\n"))
    row: list[str] = []
    size = 0
    for piece in pieces:
        if not piece.strip():
            continue
        cost = len(piece.encode()) + 2
        if row and size + cost > max_row_bytes:
            yield "\n\n".join(row)
            row, size = [], 0
        row.append(piece)
        size += cost
    if row:
        yield "\n\n".join(row)


def demo_rows(max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> list[str]:
    return [row for _, text in topic_texts() for row in split_rows(text, max_row_bytes)]


def _split_evenly(rows: list[str], parts: int) -> Iterable[list[str]]:
    for i in range(parts):
        yield rows[i * len(rows) // parts:(i + 1) * len(rows) // parts]


def prepare_demo_dataset(store: ObjectStore, *, shards: int = DEFAULT_SHARDS,
                         max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> PreparedDataset:
    """Write the demo dataset's shards and manifest into `store` (rooted at the dataset)."""
    rows = demo_rows(max_row_bytes)
    if not 1 <= shards <= len(rows):
        raise ValueError(f"shards must be between 1 and the number of rows ({len(rows)}), got {shards}")
    written: list[ShardInfo] = []
    whole = hashlib.sha256()
    for i, part in enumerate(_split_evenly(rows, shards)):
        data = "".join(json.dumps({"text": row}, ensure_ascii=False) + "\n" for row in part).encode()
        key = f"shard-{i:05d}.jsonl"
        store.put_bytes(key, data)
        whole.update(data)
        written.append(ShardInfo(key, len(part), len(data), hashlib.sha256(data).hexdigest()))
    keep = {s.key for s in written}
    for info in list(store.list("")):
        if info.key.startswith("shard-") and info.key.endswith(".jsonl") and info.key not in keep:
            store.delete(info.key)
    result = PreparedDataset(uri=store.uri, rows=len(rows), bytes=sum(s.bytes for s in written),
                             sha256=whole.hexdigest(), shards=tuple(written))
    manifest = {
        "name": "pydoc-topics",
        "source": "pydoc_data.topics",
        "python_version": platform.python_version(),
        "format": "jsonl",
        "text_field": "text",
        "rows": result.rows,
        "bytes": result.bytes,
        "sha256": result.sha256,
        "shards": [s.__dict__ for s in written],
    }
    store.put_bytes(MANIFEST_KEY, (json.dumps(manifest, indent=2) + "\n").encode())
    return result
