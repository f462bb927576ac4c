"""What data a run saw: the dataset's identity (URI, version, digest) and a sample of its rows.

Lineage (seed §14: "which checkpoints used dataset v3?") needs a dataset identity that does
not depend on how the spec spelled the source: `datasets/demo/` and
`file:///…/objects/datasets/demo` are the same data, so runs and model versions record the
URI of the store opened at the dataset's root (`canonical_dataset_uri`).

The digest says whether the data changed under the same version tag. `content` digests hash
every shard's bytes (exact, but a full read); `listing` digests hash each shard's key and size
(and its SHA-256 where the store knows it) — cheap on a 50 GB dataset and still changed by any
added, removed, renamed or resized shard. `describe_dataset` hashes contents up to
`CONTENT_DIGEST_MAX_BYTES` and falls back to the listing above that; the method is recorded
next to the digest.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from trainyard.plugins.data.rows import BLANK, BadRow, read_rows
from trainyard.plugins.data.shards import list_shards, open_dataset

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.config.spec import Dataset
    from trainyard.plugins.storage.store import ObjectStore

DatasetFormat = Literal["jsonl", "parquet", "text"]

CONTENT_DIGEST_MAX_BYTES = 1 << 30
"""Hash shard contents for datasets up to 1 GiB; list-based digest above."""


class DatasetRef(BaseModel):
    """A dataset as lineage records it: where, which version, which bytes."""

    model_config = ConfigDict(frozen=True)

    uri: str
    """Canonical URI of the dataset's root (the store's own URI)."""
    version: str | None = None
    """The spec's version tag (`v3`), if any."""
    format: DatasetFormat = "jsonl"
    digest: str
    """SHA-256 (hex) over the shards; see the module docstring."""
    digest_method: Literal["content", "listing"]
    num_shards: int
    total_bytes: int

    @property
    def label(self) -> str:
        """`uri@version` (or just the URI): how people name a dataset on the command line."""
        return f"{self.uri}@{self.version}" if self.version else self.uri


def open_dataset_store(source: str, settings: Settings) -> ObjectStore:
    """The store rooted at a spec's `dataset.source` (a URI or a prefix in the object store)."""
    return open_dataset(source, object_store=settings.object_store, endpoint_url=settings.s3_endpoint_url)


def canonical_dataset_uri(source: str, settings: Settings) -> str:
    """The URI lineage records for `source`; opening a store touches no network."""
    return open_dataset_store(source, settings).uri.rstrip("/")


def describe_dataset(
    store: ObjectStore,
    dataset: Dataset,
    *,
    hash_contents: bool | None = None,
) -> DatasetRef:
    """Identity of the dataset in `store` (opened at its root). Raises FileNotFoundError when the
    prefix holds no shard of the declared format."""
    shards = list_shards(store, dataset.format)
    if not shards:
        raise FileNotFoundError(f"no {dataset.format} shards under {store.uri}")
    total = sum(s.size for s in shards)
    by_content = total <= CONTENT_DIGEST_MAX_BYTES if hash_contents is None else hash_contents
    digest = hashlib.sha256()
    for shard in shards:
        sha = shard.sha256
        if by_content and sha is None:
            from trainyard.plugins.storage.store import sha256_of_stream

            with store.open_read(shard.key) as f:
                _, sha = sha256_of_stream(f)
        line = f"{shard.key}\t{shard.size}\t{sha or ''}\n" if not by_content else f"{shard.key}\t{sha}\n"
        digest.update(line.encode())
    return DatasetRef(
        uri=store.uri.rstrip("/"), version=dataset.version, format=dataset.format,
        digest=digest.hexdigest(), digest_method="content" if by_content else "listing",
        num_shards=len(shards), total_bytes=total,
    )


@dataclass
class RowSample:
    """Rows read from the shards, and what could not be read."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    origins: list[tuple[str, int]] = field(default_factory=list)
    """(shard key, line number) of each row, for examples in reports (parquet: row number)."""
    invalid: list[BadRow] = field(default_factory=list)
    invalid_count: int = 0
    shards_read: int = 0
    shards_total: int = 0


def sample_rows(store: ObjectStore, fmt: str, limit: int, *, max_invalid_examples: int = 5) -> RowSample:
    """Up to `limit` rows, taken from the head of every shard in turn so each shard is seen.

    Shard i of n contributes at most `remaining // (n - i)` rows, so a shard shorter than its
    share leaves the rest to the shards after it.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    shards = list_shards(store, fmt)
    sample = RowSample(shards_total=len(shards))
    for i, shard in enumerate(shards):
        remaining = limit - len(sample.rows)
        if remaining <= 0:
            break
        quota = max(1, remaining // (len(shards) - i))
        with store.open_read(shard.key) as raw:
            for line, row in _read_rows(raw, shard.key, fmt, quota, sample, max_invalid_examples):
                sample.rows.append(row)
                sample.origins.append((shard.key, line))
        sample.shards_read += 1
    return sample


def _read_rows(
    raw: IO[bytes], key: str, fmt: str, quota: int, sample: RowSample, max_examples: int
) -> Iterator[tuple[int, dict[str, Any]]]:
    if fmt == "parquet":
        import pandas as pd

        frame = pd.read_parquet(io.BytesIO(raw.read()))
        yield from enumerate(frame.head(quota).to_dict(orient="records"), start=1)
        return
    produced = 0
    for number, row in read_rows(raw, key, fmt):
        if produced >= quota:
            return
        if isinstance(row, BadRow):
            sample.invalid_count += 1
            if len(sample.invalid) < max_examples:
                sample.invalid.append(row)
            continue
        produced += 1
        # A blank line in JSONL is an empty row, which the schema check should report.
        yield number, {} if row is BLANK else row  # type: ignore[misc]
