"""The Airflow asset that names a dataset: what `retrain.onAsset` schedules on and what
`trainyard data publish` (and a data-preparation task) emits. One definition, pure Python: the
DAG factory calls it while parsing, the CLI when publishing.
"""

from __future__ import annotations

ASSET_SCHEME = "trainyard"


def dataset_asset_uri(source: str) -> str:
    """`s3://bucket/data/` → `s3://bucket/data`; `datasets/pydoc-topics/` (a source under the
    object store) → `trainyard://datasets/pydoc-topics`. A URI with a scheme stays itself (less a
    trailing slash), so a spec may name any asset another pipeline emits."""
    text = source.strip()
    if not text.strip("/"):
        raise ValueError(f"dataset source {source!r} names no dataset; write e.g. datasets/<name>/")
    if "://" in text:
        return text.rstrip("/")
    return f"{ASSET_SCHEME}://{text.strip('/')}"
