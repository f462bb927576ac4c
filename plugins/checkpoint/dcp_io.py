"""torch.distributed.checkpoint (DCP) glue that keeps loading free of arbitrary pickles.

Stock DCP unpickles two things with the full `pickle` machinery: the `.metadata` file
(`FileSystemReader.read_metadata`) and every non-tensor value (`DefaultLoadPlanner.load_bytes`
uses `torch.load(weights_only=False)`). A checkpoint is data, so here:

- `.metadata` is read by an allow-list unpickler that can build only DCP's metadata classes,
  `torch.Size`, dtypes and paths — the "restricting globals" recipe of Python's pickle docs;
- non-tensor values are loaded with `torch.load(weights_only=True)`;
- tensors are already loaded with `weights_only=True` by DCP itself.

Both readers are used only after the files' digests matched the manifest. On the writing side,
`HashingFileSystemWriter` computes each file's digest (BLAKE3, `manifest.HASH_ALGORITHM`) as DCP
writes it — on a second thread, at
the same time as the bytes go to the kernel, or, with `direct_io`, while the disk takes the
previous chunk with O_DIRECT (`direct_write`) — so the upload never reads the file again just to
hash it. On the reading side, `SafeFileSystemReader` reads a tensor's bytes straight into the
live tensor (`_read_into`) where DCP would unpickle it into a fresh storage and copy it over.
This module imports torch at the top: import it only where torch is wanted (the manager, export).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import pickle
import sys
import threading
import warnings
from collections.abc import Generator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.utils import _create_file_view

from trainyard.plugins.checkpoint.direct_read import HeldFile
from trainyard.plugins.checkpoint.direct_write import open_direct
from trainyard.plugins.checkpoint.manifest import HASH_ALGORITHM
from trainyard.plugins.storage.store import HashAlgorithm, new_hasher

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
    """`FileSystemReader` whose metadata goes through the allow-list unpickler, and whose
    tensors are read straight into their destination.

    Stock `read_data` `torch.load`s every item into a freshly allocated storage and copies it
    into the live tensor: two passes over the bytes, and the first touches memory nobody has
    touched yet (on a VM a page fault per 4 KiB; in the checkpoint benchmark that read ran at a
    sixth of the speed of the copy after it). Here an item whose stored tensor and destination
    are both whole and contiguous, of one dtype and shape, is `readinto` the destination's own
    bytes; any other item (resharding that narrows a chunk, a transform, a byte-swapped file)
    goes through DCP's own path unchanged. Both read only files whose digest was verified.
    Files in `held` (local path → the verified bytes in memory, `direct_read`) are read from
    there, by both paths, instead of from the disk.
    """

    def __init__(self, path: str | os.PathLike[str],
                 held: Mapping[str, HeldFile] | None = None) -> None:
        super().__init__(path)
        if held:
            self.fs = _HeldFileSystem(held)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = load_metadata(Path(self.path) / METADATA_NAME)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        direct: dict[str, list[ReadItem]] = {}
        rest: list[ReadItem] = []
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            if item.type == LoadItemType.TENSOR and not info.transform_descriptors:
                direct.setdefault(info.relative_path, []).append(item)
            else:
                rest.append(item)
        for relative_path, items in direct.items():
            with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as f:
                rest.extend(item for item in items if not self._read_into(f, item, planner))
        return super().read_data(replace_items(plan, rest), planner)

    def _read_into(self, stream: Any, item: ReadItem, planner: LoadPlanner) -> bool:
        """Read one tensor item into its destination; False (nothing read) where only DCP's
        general path can (see the class docstring)."""
        info = self.storage_data[item.storage_index]
        view = _create_file_view(stream, info.offset, info.length)
        try:
            stored = torch.load(view, map_location="meta", weights_only=True)  # shapes only
        except (RuntimeError, EOFError, pickle.UnpicklingError) as e:
            raise ValueError(f"{info.relative_path}: item {item.storage_index.fqn} is not a "
                             f"readable tensor record ({e})") from e
        target = planner.resolve_tensor(item).detach()
        if not (_whole(stored, item) and stored.dtype == target.dtype
                and stored.size() == target.size() and target.is_contiguous()
                and target.device.type == "cpu" and _native_byte_order(view)):
            return False
        start = stored.untyped_storage()._checkpoint_offset  # type: ignore[attr-defined]
        start += stored.storage_offset() * stored.element_size()
        nbytes = stored.numel() * stored.element_size()
        if start + nbytes > info.length:
            raise ValueError(f"{info.relative_path}: item {item.storage_index.fqn} runs past "
                             "its slice of the file")
        if nbytes:
            into = memoryview(target.view(-1).view(torch.uint8).numpy())
            stream.seek(info.offset + start)
            done = 0
            while done < nbytes:
                n = stream.readinto(into[done:])
                if not n:
                    raise EOFError(f"{info.relative_path}: ends inside {item.storage_index.fqn}")
                done += n
        planner.commit_tensor(item, target)
        return True


class _HeldFileSystem(FileSystem):
    """DCP's local file system, serving the held files' bytes from memory."""

    def __init__(self, held: Mapping[str, HeldFile]) -> None:
        super().__init__()
        self._held = held

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str
                      ) -> Generator[io.IOBase, None, None]:
        file = self._held.get(os.fspath(path))
        if file is None or mode != "rb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with _MemoryReader(file.view()) as stream:
            yield stream


class _MemoryReader(io.RawIOBase):
    """A read-only, seekable file over bytes in memory, without copying them first
    (`io.BytesIO` copies a memoryview it is given)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        into = memoryview(buffer).cast("B")
        n = max(0, min(len(into), len(self._view) - self._pos))
        into[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            self._view.release()
        super().close()


def replace_items(plan: LoadPlan, items: list[ReadItem]) -> LoadPlan:
    """`plan` with only `items` left for DCP's own reader."""
    import dataclasses

    return dataclasses.replace(plan, items=items)


def _whole(stored: torch.Tensor, item: ReadItem) -> bool:
    """The item asks for all of the stored tensor, which is dense in its storage."""
    return (all(o == 0 for o in item.storage_offsets)
            and tuple(item.lengths) == tuple(stored.size()) and stored.is_contiguous())


def _native_byte_order(view: Any) -> bool:
    """The saved bytes are in this machine's byte order (torch.save records the writer's)."""
    view.seek(0)
    archive = torch._C.PyTorchFileReader(view)
    if not archive.has_record("byteorder"):
        return sys.byteorder == "little"  # files older than the record were little-endian
    return bytes(archive.get_record("byteorder")).decode() == sys.byteorder


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


HASH_ASIDE_BYTES = 1 << 20
"""Writes at least this large are hashed on the stream's hashing thread while the calling
thread hands the same bytes to the kernel (both release the GIL); smaller ones inline."""


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages, do not wait


def _libc_sync_file_range() -> Any:
    """Linux's `sync_file_range(2)` through ctypes (the os module has no binding; ctypes
    releases the GIL for the call), or None where libc lacks it. Without it nothing reaches
    the disk until the upload's fsync (background writeback starts at 10 % of RAM dirty or
    after 30 s), so the disk would idle while DCP writes and hashes, then work alone."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _libc_sync_file_range()


def start_writeback(fd: int, start: int, length: int) -> bool:
    """Have the kernel start writing `length` bytes of `fd` from `start` to disk, without
    waiting; False where it cannot (not Linux, or a file system without it)."""
    if _SYNC_FILE_RANGE is None:
        return False
    return bool(_SYNC_FILE_RANGE(fd, start, length, _SYNC_FILE_RANGE_WRITE) == 0)


_crc_lock = threading.Lock()
_crc_writers = 0
_crc_before = True


@contextlib.contextmanager
def without_zip_crc32() -> Generator[None, None, None]:
    """torch.save without the CRC-32 of each zip record, while checkpoint files are written.

    DCP writes every tensor with torch.save, whose zip writer computes a CRC-32 of every byte:
    on the development machine ~0.07 s of a 0.23 s write of 201 MB per rank, a third of it. The
    digest that the manifest records covers the same bytes, and every reader here checks it
    first; torch.load reads files without the CRC (only zip tools would warn). torch's setting
    is process-wide, so a torch.save elsewhere in the process while a checkpoint is written
    goes without the CRC too; the setting is put back when the last concurrent writer ends."""
    global _crc_writers, _crc_before
    with _crc_lock:
        if _crc_writers == 0:
            _crc_before = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(False)
        _crc_writers += 1
    try:
        yield
    finally:
        with _crc_lock:
            _crc_writers -= 1
            if _crc_writers == 0:
                torch.serialization.set_crc32_options(_crc_before)


class _HashingStream(io.RawIOBase):
    """Write-through wrapper that hashes and counts every byte on its way to the file.
    Not seekable: DCP and torch.save write strictly in order, and a seek would make the
    digest describe something other than the file. A large write is hashed by `hasher` at
    the same time as it is written, and `write` returns only when both are done (the caller
    may reuse its buffer then), so the digest is always exactly the bytes written, in order."""

    def __init__(self, raw: Any, hasher: ThreadPoolExecutor | None = None,
                 algorithm: HashAlgorithm = HASH_ALGORITHM) -> None:
        self._raw = raw
        self._hasher = hasher
        self.digest = new_hasher(algorithm)
        self.size = 0
        self._writeback_from = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        pending = self._hasher.submit(self.digest.update, view) \
            if self._hasher is not None and len(view) >= HASH_ASIDE_BYTES else None
        try:
            n = 0
            while n < len(view):  # all of it: the digest covers all of it
                wrote = self._raw.write(view[n:])
                if not wrote:
                    raise OSError(f"the file took no bytes ({n} of {len(view)} written)")
                n += wrote
        finally:
            if pending is not None:
                pending.result()
        if pending is None:
            self.digest.update(view)
        self.size += n
        if self.size - self._writeback_from >= WRITEBACK_BYTES:
            self._start_writeback()
        return n

    def _start_writeback(self) -> None:
        """Ask the kernel to begin writing what we wrote so far (asynchronously)."""
        try:
            self._raw.flush()
            if not start_writeback(self._raw.fileno(), self._writeback_from,
                                   self.size - self._writeback_from):
                return  # the fsync at the upload does all the work
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
    """DCP's local file system, remembering (size, digest in `algorithm`) of every file it
    writes; with `direct`, files are written with O_DIRECT where the file system allows it
    (`direct_write`)."""

    def __init__(self, direct: bool = False, algorithm: HashAlgorithm = HASH_ALGORITHM) -> None:
        super().__init__()
        self.direct = direct
        self.algorithm: HashAlgorithm = algorithm
        self.digests: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()  # DCP may write several files from several threads

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str
                      ) -> Generator[io.IOBase, None, None]:
        if "w" not in mode or "+" in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        direct = open_direct(path, self.algorithm) if self.direct else None
        if direct is not None:
            with contextlib.closing(direct):  # DCP closes it itself when all went well
                yield direct
            self._remember(path, direct.size, direct.digest.hexdigest())
            return
        with super().create_stream(path, mode) as raw, \
                ThreadPoolExecutor(1, thread_name_prefix="hash-aside") as hasher:
            tap = _HashingStream(raw, hasher, self.algorithm)
            yield tap
            tap.flush()
            self._remember(path, tap.size, tap.digest.hexdigest())

    def _remember(self, path: str | os.PathLike[str], size: int, digest: str) -> None:
        with self._lock:
            self.digests[os.fspath(path)] = (size, digest)

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
    """`FileSystemWriter` that knows each written file's size and digest (`algorithm`)
    afterwards; `direct_io` writes them with O_DIRECT (for files that are stored where they are
    written). Its data files are written without torch.save's per-record CRC-32
    (`without_zip_crc32`)."""

    def __init__(self, path: str | os.PathLike[str], *, direct_io: bool = False,
                 algorithm: HashAlgorithm = HASH_ALGORITHM, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.algorithm = algorithm
        self.fs = _HashingFileSystem(direct=direct_io, algorithm=algorithm)
        self.path = self.fs.init_path(path)

    def write_data(self, plan: Any, planner: Any) -> Future[Any]:
        with without_zip_crc32():  # DCP's write_data writes every file before it returns
            return super().write_data(plan, planner)

    def digest_of(self, path: Path) -> tuple[int, str] | None:
        """(size, digest in `algorithm`) of a file this writer wrote; None if unknown or its
        size changed."""
        known = self.fs.digests.get(os.fspath(path))  # type: ignore[attr-defined]
        if known is None or path.stat().st_size != known[0]:
            return None
        return known
