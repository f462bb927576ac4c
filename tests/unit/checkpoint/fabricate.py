"""Write committed checkpoints by hand (no torch): files first, manifest last, like the writer."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from blake3 import blake3

from trainyard.plugins.checkpoint.manifest import (
    FORMAT_VERSION,
    HASH_ALGORITHM,
    MANIFEST_NAME,
    CheckpointManifest,
    ManifestFile,
    step_dir,
)
from trainyard.plugins.checkpoint.uris import identity_of
from trainyard.plugins.storage.store import HashAlgorithm, ObjectStore


def make_checkpoint(
    store: ObjectStore,
    step: int,
    files: dict[str, bytes] | None = None,
    *,
    metrics: dict[str, float] | None = None,
    created_at: datetime | None = None,
    job: str | None = None,
    run: str | None = None,
    commit: bool = True,
    algorithm: HashAlgorithm = HASH_ALGORITHM,
) -> CheckpointManifest:
    """Job and run default to those of the store's root (`…/jobs/<job>/runs/<run>/…`), else
    `demo` and no run — what the writer would record there. `algorithm="sha256"` writes a
    manifest as the writer did before BLAKE3 (format 1)."""
    identity = identity_of(store.uri)
    job = job if job is not None else (identity[0] if identity else "demo")
    if run is None and identity and identity[0] == job:
        run = identity[1]
    files = files if files is not None else {"__0_0.distcp": f"shard of {step}".encode() * 100,
                                             ".metadata": b"meta"}
    entries = []
    for path, data in sorted(files.items()):
        store.put_bytes(f"{step_dir(step)}/{path}", data)
        digest = (blake3(data) if algorithm == "blake3" else hashlib.sha256(data)).hexdigest()
        entries.append(ManifestFile.hashed(algorithm, digest, path=path, size=len(data),
                                           raw_size=len(data)))
    manifest = CheckpointManifest(job=job, run=run, step=step, created_at=created_at or datetime.now(UTC),
                                  world_size=1, metrics=metrics or {}, files=entries,
                                  format_version=1 if algorithm == "sha256" else FORMAT_VERSION)
    if commit:
        store.put_bytes(f"{step_dir(step)}/{MANIFEST_NAME}", manifest.to_json_bytes())
    return manifest
