"""Where a dataset is: the store rooted at its `source`, and which objects there are shards.

A dataset `source` is a full URI (`s3://bucket/prefix/`, `file:///path/`) or a prefix inside
the platform's object store (`datasets/pydoc-topics/`). `open_dataset` is the one place that
resolves it, for the dry run, data validation, lineage and the worker alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from trainyard.plugins.storage.store import ObjectInfo, ObjectStore

SHARD_SUFFIXES: dict[str, tuple[str, ...]] = {
    "jsonl": (".jsonl", ".jsonl.zst"),
    "parquet": (".parquet",),
    "text": (".txt",),
}
"""Which objects under a dataset's prefix are shards, per format (others — READMEs, manifests — are not)."""


def open_dataset(source: str, *, object_store: str, endpoint_url: str | None = None) -> ObjectStore:
    """The store rooted at the dataset's prefix."""
    from trainyard.plugins.storage.store import open_store

    if urlparse(source).scheme:
        return open_store(source, endpoint_url=endpoint_url)
    return open_store(object_store, endpoint_url=endpoint_url).child(source.strip("/"))


def list_shards(store: ObjectStore, fmt: str) -> list[ObjectInfo]:
    """The dataset's shard files, sorted by key (the order that defines the data)."""
    return sorted((o for o in store.list("") if o.key.endswith(SHARD_SUFFIXES[fmt])), key=lambda o: o.key)
