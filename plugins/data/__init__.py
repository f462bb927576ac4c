"""Datasets: where they are, how their rows are read, which version a run saw.

- `shards.py`   `open_dataset(source)` (a URI or a prefix in the object store) and `list_shards`
- `rows.py`     the one row parser (JSONL / text, `.zst`), shared by the worker and validation
- `datasets.py` a dataset's identity for lineage (`DatasetRef`: URI, version, digest) and a
                sample of its rows for data-quality checks
- streaming, for training: `manifest.py` (the shards a run reads, kept in its checkpoints),
  `cache.py` (the node's bounded, verified shard cache), `documents.py` (documents of every
  format, tokenizers), `jsonl.py` (a jsonl shard's texts a block of lines at a time),
  `stream.py` (the global sample order, resumable on any data-parallel size), `reader.py`
  (`StreamingReader`: one rank's batches, prefetched in the background)

Used by the worker, `plugins/validation/` and `plugins/tracking/`; imports none of them. No torch.
"""
