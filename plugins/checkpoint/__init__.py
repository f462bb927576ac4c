"""Checkpoints: async sharded writer, BLAKE3-hashed manifests (SHA-256 ones still read),
catalog, retention (the object store they live in is `plugins/storage/`).

The control plane imports the torch-free modules (`manifest`, `catalog`, `retention`,
`uris`) directly; the names below that need torch (`CheckpointManager`,
`SaveResult`, `export_safetensors`) are loaded on first use, so `import trainyard.plugins.checkpoint`
stays cheap for Airflow sensors and DAG files.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainyard.plugins.checkpoint.catalog import (
    CheckpointRecord,
    VerifyReport,
    latest_valid,
    list_checkpoints,
    select_latest_valid,
    verify,
)
from trainyard.plugins.checkpoint.manifest import CheckpointManifest, ManifestFile
from trainyard.plugins.checkpoint.retention import (
    RetentionDecision,
    RetentionPolicy,
    apply_retention,
    plan_retention,
)

if TYPE_CHECKING:
    from trainyard.plugins.checkpoint.export import export_safetensors
    from trainyard.plugins.checkpoint.manager import CheckpointManager, SaveResult

_LAZY = {
    "CheckpointManager": "trainyard.plugins.checkpoint.manager",
    "SaveResult": "trainyard.plugins.checkpoint.manager",
    "export_safetensors": "trainyard.plugins.checkpoint.export",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CheckpointManager",
    "CheckpointManifest",
    "CheckpointRecord",
    "ManifestFile",
    "RetentionDecision",
    "RetentionPolicy",
    "SaveResult",
    "VerifyReport",
    "apply_retention",
    "export_safetensors",
    "latest_valid",
    "list_checkpoints",
    "plan_retention",
    "select_latest_valid",
    "verify",
]
