"""A run's summary: final step, losses, and a digest of the trained parameters.

The digest is a SHA-256 over every rank's parameter shards (each rank hashes the bytes of its
local tensors in parameter order; rank 0 hashes the ranks' digests in rank order). Two runs of
the same plan and world size have the same digest exactly when their parameters are
bit-identical — which is how the resume test proves that an interrupted and resumed run ends
where an uninterrupted one does (DESIGN §5). It reads nothing across ranks but 32 bytes each.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainyard.plugins.files import write_atomic
from trainyard.worker.distributed.objects import all_gather_objects

if TYPE_CHECKING:
    from trainyard.worker.distributed.parallelize import ParallelModel


def local_param_digest(model: ParallelModel) -> str:
    h = hashlib.sha256()
    for part in model.parts:
        for name, p in part.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            h.update(name.encode())
            h.update(local.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def param_digest(model: ParallelModel) -> str:
    """The model's parameter digest (a collective: every rank calls it; all get the result)."""
    digests = all_gather_objects(local_param_digest(model))
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()


def write_summary(path: Path, model: ParallelModel, *, step: int, losses: dict[int, float]) -> None:
    """Write the summary JSON (rank 0; every rank must call it, the digest is a collective)."""
    digest = param_digest(model)
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    write_atomic(path, json.dumps({"step": step, "params_sha256": digest,
                                   "losses": {str(k): v for k, v in sorted(losses.items())}}, indent=1))
