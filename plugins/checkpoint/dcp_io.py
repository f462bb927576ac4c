"""torch.distributed.checkpoint (DCP) glue that keeps loading free of arbitrary pickles.

Stock DCP unpickles two things with the full `pickle` machinery: the `.metadata` file
(`FileSystemReader.read_metadata`) and every non-tensor value (`DefaultLoadPlanner.load_bytes`
uses `torch.load(weights_only=False)`). A checkpoint is data, so here:

- `.metadata` is read by an allow-list unpickler that can build only DCP's metadata classes,
  `torch.Size`, dtypes and paths — the "restricting globals" recipe of Python's pickle docs;
- non-tensor values are loaded with `torch.load(weights_only=True)`;
- tensors are already loaded with `weights_only=True` by DCP itself.

Both readers are used only after the files' SHA-256 matched the manifest. This module imports
torch at the top: import it only where torch is wanted (the manager, export).
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

METADATA_NAME = ".metadata"

# Single-process saves and loads (no process group) are deliberate here; DCP warns on each.
warnings.filterwarnings("ignore", category=UserWarning,
                        message="torch.distributed is disabled, unavailable or uninitialized")

_ALLOWED_GLOBALS: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset({
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
        "BytesStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    }),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "Path"}),
    "collections": frozenset({"OrderedDict"}),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"DCP metadata refers to {module}.{name}, which is not on the allow-list")


def load_metadata(path: Path) -> Metadata:
    """Read a DCP `.metadata` file with the allow-list unpickler."""
    with open(path, "rb") as f:
        metadata = _MetadataUnpickler(f).load()
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f"{path} holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """`FileSystemReader` whose metadata goes through the allow-list unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = load_metadata(Path(self.path) / METADATA_NAME)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """`DefaultLoadPlanner` that loads non-tensor values with `weights_only=True`."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def files_needed(state_dict: Mapping[str, Any], metadata: Metadata) -> set[str]:
    """The data files a rank must read to fill `state_dict` — from DCP's own local plan, so a
    rank downloads only its share, whatever world size wrote the checkpoint."""
    planner = SafeLoadPlanner()
    planner.set_up_planner(dict(state_dict), metadata, is_coordinator=False)
    plan = planner.create_local_plan()
    storage = metadata.storage_data or {}
    return {storage[item.storage_index].relative_path for item in plan.items}
