"""torch.distributed.checkpoint (DCP) glue that keeps loading free of arbitrary pickles.

Stock DCP unpickles two things with the full `pickle` machinery: the `.metadata` file
(`FileSystemReader.read_metadata`) and every non-tensor value (`DefaultLoadPlanner.load_bytes`
uses `torch.load(weights_only=False)`). A checkpoint is data, so here:

- `.metadata` is read by an allow-list unpickler that can build only DCP's metadata classes,
  `torch.Size`, dtypes and paths — the "restricting globals" recipe of Python's pickle docs;
- non-tensor values are loaded with `torch.load(weights_only=True)`;
- tensors are already loaded with `weights_only=True` by DCP itself.

Both readers are used only after the files' SHA-256 matched the manifest. On the writing side,
`HashingFileSystemWriter` computes each file's SHA-256 as DCP writes it, so the upload never
reads the file again just to hash it. This module imports torch at the top: import it only
where torch is wanted (the manager, export).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import threading
import warnings
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
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


WRITEBACK_BYTES = 32 << 20
"""Start the disk writing every this many bytes (`sync_file_range`), so that the fsync before
the commit finds most of the file already on disk instead of starting from zero."""


class _HashingStream(io.RawIOBase):
    """Write-through wrapper that hashes and counts every byte on its way to the file.
    Not seekable: DCP and torch.save write strictly in order, and a seek would make the
    digest describe something other than the file."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.digest = hashlib.sha256()
        self.size = 0
        self._writeback_from = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        n = self._raw.write(b)
        view = memoryview(b).cast("B")
        n = len(view) if n is None else n
        self.digest.update(view[:n])
        self.size += n
        if self.size - self._writeback_from >= WRITEBACK_BYTES:
            self._start_writeback()
        return n

    def _start_writeback(self) -> None:
        """Ask the kernel to begin writing what we wrote so far (asynchronously)."""
        sync_file_range = getattr(os, "sync_file_range", None)
        if sync_file_range is None:
            return
        try:
            self._raw.flush()
            sync_file_range(self._raw.fileno(), self._writeback_from,
                            self.size - self._writeback_from, os.SYNC_FILE_RANGE_WRITE)
        except (OSError, AttributeError, io.UnsupportedOperation):
            return
        self._writeback_from = self.size

    def tell(self) -> int:
        return int(self._raw.tell())

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return int(self._raw.fileno())


class _HashingFileSystem(FileSystem):
    """DCP's local file system, remembering (size, SHA-256) of every file it writes."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()  # DCP may write several files from several threads

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str
                      ) -> Generator[io.IOBase, None, None]:
        if "w" not in mode or "+" in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            tap = _HashingStream(raw)
            yield tap
            tap.flush()
            with self._lock:
                self.digests[os.fspath(path)] = (tap.size, tap.digest.hexdigest())

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            if os.fspath(path) in self.digests:
                self.digests[os.fspath(new_path)] = self.digests.pop(os.fspath(path))

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        super().rm_file(path)
        with self._lock:
            self.digests.pop(os.fspath(path), None)


class HashingFileSystemWriter(FileSystemWriter):
    """`FileSystemWriter` that knows each written file's size and SHA-256 afterwards."""

    def __init__(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = _HashingFileSystem()
        self.path = self.fs.init_path(path)

    def digest_of(self, path: Path) -> tuple[int, str] | None:
        """(size, sha256) of a file this writer wrote; None if unknown or its size changed."""
        known = self.fs.digests.get(os.fspath(path))  # type: ignore[attr-defined]
        if known is None or path.stat().st_size != known[0]:
            return None
        return known
