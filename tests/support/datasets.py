"""Small synthetic datasets for the data-pipeline tests and benchmark: rows whose windows are
all distinct, so a sample identifies itself."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.plugins.storage.store import ObjectStore


def row_text(shard: int, row: int, row_bytes: int) -> str:
    """A row no other row shares a 16-character stretch with (hex digests of its own name)."""
    head = f"shard {shard:04d} row {row:06d} "
    filler = "".join(hashlib.sha256(f"{shard}/{row}/{i}".encode()).hexdigest()
                     for i in range(row_bytes // 64 + 1))
    return (head + filler)[:max(row_bytes, len(head))]


def write_jsonl_dataset(store: ObjectStore, *, shards: int, rows: int, row_bytes: int = 200,
                        prefix: str = "", compress: bool = False) -> int:
    """`shards` JSONL shards of `rows` rows each; returns the total bytes written."""
    total = 0
    for s in range(shards):
        data = "".join(json.dumps({"text": row_text(s, r, row_bytes)}) + "\n" for r in range(rows)).encode()
        key = f"{prefix}shard-{s:05d}.jsonl"
        if compress:
            import zstandard

            data, key = zstandard.ZstdCompressor().compress(data), key + ".zst"
        store.put_bytes(key, data)
        total += len(data)
    return total
