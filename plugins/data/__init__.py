"""Datasets: where they are, how their rows are read, which version a run saw.

- `shards.py`   `open_dataset(source)` (a URI or a prefix in the object store) and `list_shards`
- `rows.py`     the one row parser (JSONL / text, `.zst`), shared by the worker and validation
- `datasets.py` a dataset's identity for lineage (`DatasetRef`: URI, version, digest) and a
                sample of its rows for data-quality checks

Used by the worker, `plugins/validation/` and `plugins/tracking/`; imports none of them. No torch.
"""
