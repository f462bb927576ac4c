"""The object store (a local folder or S3 / MinIO / any S3-compatible API) that checkpoints,
datasets and artifacts share: "everything durable" goes through `ObjectStore`.

- `store.py`  `open_store(uri)` and the guarantees (whole-or-absent writes, hashing on the way)
- `api.py`    the `ObjectStore` interface, `ObjectInfo`, key rules, streaming helpers
- `local.py`, `s3.py`  the two implementations (boto3 imported only when an S3 store opens)
- `errors.py` `ObjectNotFoundError`, `UnsafeKeyError`, `IntegrityError`
- `credentials.py` a run's own S3 keys: an IAM role per run, its policy, assumed with STS

No torch, no Airflow: the control plane, sensors and the worker all import it.
"""
