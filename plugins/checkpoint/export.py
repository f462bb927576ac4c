"""Export a checkpoint's model weights to one `safetensors` file (for the model registry).

Runs in one process without torch.distributed: DCP reassembles full tensors from however many
ranks wrote the shards. Only the files that hold model weights are downloaded (optimizer state
is usually 2–3× larger and not needed), each verified against the manifest first; the output
is written to a temporary name and renamed, and carries the job, step and manifest hash in its
header so a registered model can always be traced back to its checkpoint.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainyard.plugins.checkpoint.catalog import open_manifest_uri
from trainyard.plugins.checkpoint.errors import OutsideJobPrefixError
from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME, manifest_sha256
from trainyard.plugins.checkpoint.transfer import download_verified
from trainyard.plugins.checkpoint.uris import require_job_prefix
from trainyard.plugins.storage.store import sha256_of_file

log = logging.getLogger(__name__)

MODEL_PREFIX = "model."


@dataclass(frozen=True)
class ExportResult:
    path: Path
    step: int
    tensors: int
    bytes: int
    sha256: str


def export_safetensors(manifest_uri: str, dest: str | os.PathLike[str], *,
                       endpoint_url: str | None = None, job: str | None = None,
                       area: str | None = None,
                       scratch_dir: str | os.PathLike[str] | None = None) -> ExportResult:
    """Write the model weights of the checkpoint at `manifest_uri` to `dest` (.safetensors).

    With `job`, the manifest must lie inside that job's area (`area`, else the one the URI
    claims by its structure) and say it is `job`'s. Whatever the caller, a manifest whose job
    or run does not match its folder is invalid (`catalog.read_manifest`) and never exported.
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from trainyard.plugins.checkpoint.dcp_io import (
        METADATA_NAME,
        SafeFileSystemReader,
        SafeLoadPlanner,
        load_metadata,
    )

    if job is not None:
        require_job_prefix(manifest_uri, job, area=area)
    store, record = open_manifest_uri(manifest_uri, endpoint_url=endpoint_url)
    manifest = record.manifest
    if job is not None and manifest.job != job:
        raise OutsideJobPrefixError(f"{manifest_uri}: the manifest says job {manifest.job[:80]!r}, "
                                    f"not {job!r}; refusing to export it")
    dest = Path(dest)
    work = Path(tempfile.mkdtemp(prefix="trainyard-export-", dir=scratch_dir))
    try:
        download_verified(store, record.folder, manifest.file(METADATA_NAME), work / METADATA_NAME)
        metadata = load_metadata(work / METADATA_NAME)
        weights = {fqn: md for fqn, md in metadata.state_dict_metadata.items()
                   if fqn.startswith(MODEL_PREFIX) and isinstance(md, TensorStorageMetadata)}
        if not weights:
            raise ValueError(f"checkpoint step {manifest.step} holds no model weights")
        files = {info.relative_path for index, info in (metadata.storage_data or {}).items()
                 if index.fqn in weights}
        for path in sorted(files):
            download_verified(store, record.folder, manifest.file(path), work / path)
        tensors = {fqn[len(MODEL_PREFIX):]: torch.empty(md.size, dtype=md.properties.dtype)
                   for fqn, md in weights.items()}
        dcp.load({"model": tensors}, storage_reader=SafeFileSystemReader(work),
                 planner=SafeLoadPlanner(), no_dist=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".partial")
        save_file(tensors, str(tmp), metadata={
            "trainyard.job": manifest.job, "trainyard.step": str(manifest.step),
            "trainyard.manifest": manifest_uri,
            "trainyard.manifest_sha256": manifest_sha256(
                store.get_bytes(f"{record.folder}/{MANIFEST_NAME}")),
        })
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size, sha256 = sha256_of_file(dest)
    result = ExportResult(dest, manifest.step, len(tensors), size, sha256)
    log.info("exported %d tensors of step %d to %s (%d bytes)", result.tensors, result.step,
             dest, result.bytes)
    return result
