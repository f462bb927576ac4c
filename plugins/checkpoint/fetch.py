"""Getting a checkpoint's files onto one rank, verified, before DCP may read any of them.

Restore is collective; each step below runs on every rank, with an all-gather between steps
(done by the caller), so all ranks reach the same verdict:

1. `plan_fetch` — check the folder listing (every file present, sizes right), fetch the
   verified `.metadata`, and ask DCP's own load plan which data files this rank will read.
2. `assign_verifiers` — on a local store every rank can hard-link the stored files instead of
   copying them, and a hard link is the very same bytes for every rank on the file system
   (stored objects are only ever replaced by rename, never rewritten). Then each file needs
   hashing once, not once per rank that reads it: files are dealt out to the ranks that need
   them (files only one rank reads first, then shared ones largest first) to whoever has the
   fewest bytes to hash so far.
3. `materialize` — link (or download) what this rank needs, hash what it was dealt (or, for
   downloads, everything it fetched) and report the identity of each link, so the caller can
   check that all ranks hold the same inode that was hashed. What it hashes it reads into
   memory where memory allows (`direct_read`), and the load reads those bytes: the disk is
   read once, and DCP parses exactly the bytes that were hashed.
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard.plugins.checkpoint.catalog import CheckpointRecord, verify
from trainyard.plugins.checkpoint.dcp_io import METADATA_NAME, files_needed, load_metadata
from trainyard.plugins.checkpoint.direct_read import HeldFile
from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME
from trainyard.plugins.checkpoint.transfer import (
    download_verified,
    read_verified,
    verify_local_file,
)
from trainyard.plugins.storage.errors import IntegrityError
from trainyard.plugins.storage.store import LocalStore, ObjectStore

Identity = tuple[int, int]
"""(st_dev, st_ino) of a hard link: equal identities are the same bytes."""


@dataclass
class FetchPlan:
    needed: set[str] = field(default_factory=set)
    can_link: bool = False
    problem: str | None = None
    fatal: bool = False
    """The problem is not this checkpoint's fault (e.g. the model does not match what was
    saved): every rank raises rather than falling back to an older checkpoint."""


def plan_fetch(store: ObjectStore, record: CheckpointRecord, state: Mapping[str, Any],
               local: Path, extra_path: str, rank: int) -> FetchPlan:
    """Step 1 (see the module docstring). Never raises for a bad checkpoint."""
    shutil.rmtree(local, ignore_errors=True)
    try:
        listing = verify(store, record, hashes=False)
        if not listing.ok:
            return FetchPlan(problem=f"rank {rank}: {listing.reason}")
        download_verified(store, record.folder, record.manifest.file(METADATA_NAME),
                          local / METADATA_NAME)
        needed = files_needed(state, load_metadata(local / METADATA_NAME)) | {extra_path}
        for path in needed:
            record.manifest.file(path)  # KeyError: DCP wants a file the manifest does not list
    except Exception as e:  # noqa: BLE001 - reported to every rank before anyone raises
        problem, fatal = _describe(e, rank)
        return FetchPlan(problem=problem, fatal=fatal)
    return FetchPlan(needed, _can_link(store, record, local))


def assign_verifiers(needed_by_rank: Sequence[set[str]], sizes: Mapping[str, int]
                     ) -> dict[str, int]:
    """Step 2: file → the one rank that hashes it (only ranks that read a file may hash it)."""
    load = [0] * len(needed_by_rank)
    readers: dict[str, list[int]] = {}
    for rank, needed in enumerate(needed_by_rank):
        for path in needed:
            readers.setdefault(path, []).append(rank)
    assignment: dict[str, int] = {}
    # Files only one rank reads are that rank's anyway: place them first, then deal out the
    # shared ones, largest first, to whichever of their readers has the least to hash.
    for path in sorted(readers, key=lambda p: (len(readers[p]), -sizes[p], p)):
        rank = min(readers[path], key=lambda r: (load[r], r))
        assignment[path] = rank
        load[rank] += sizes[path]
    return assignment


def materialize(store: ObjectStore, record: CheckpointRecord, needed: set[str], local: Path,
                *, link: bool, to_hash: set[str], rank: int, threads: int = 1, hold: int = 0
                ) -> tuple[str | None, bool, dict[str, Identity], dict[str, HeldFile]]:
    """Step 3: (problem or None, whether the problem is fatal — not the checkpoint's fault, as
    in `FetchPlan.fatal` —, identities of this rank's links, files held in memory).
    Never raises. Files are fetched or hashed `threads` at a time (hashlib, blake3 and file
    I/O release the GIL). Of the linked files this rank hashes, the largest that fit in `hold`
    bytes are read into memory as they are hashed (`read_verified`), for the load to read
    from there; the rest are hashed from the page cache and read again by the load. Held
    files are keyed by their local path; on a problem nothing is held."""
    identities: dict[str, Identity] = {}
    held: dict[str, HeldFile] = {}
    sizes = {f.path: f.size for f in record.manifest.files}
    # METADATA_NAME was fetched and verified by this rank in step 1; biggest files first.
    order = sorted((p for p in needed if p != METADATA_NAME), key=lambda p: -sizes.get(p, 0))
    to_hold: set[str] = set()
    for path in order:
        if link and path in to_hash and sizes.get(path, 0) <= hold:
            to_hold.add(path)
            hold -= sizes[path]

    # the cores left to each file's hash when `threads` files are hashed at once (BLAKE3
    # splits one file's hash across them; SHA-256 cannot)
    hash_threads = max(1, threads // max(1, min(threads, len(order))))

    def one(path: str) -> None:
        entry = record.manifest.file(path)
        dest = local / path
        if not (link and entry.compression == "none"):
            download_verified(store, record.folder, entry, dest)
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not isinstance(store, LocalStore) or not store.link_to(f"{record.folder}/{path}", dest):
            raise IntegrityError(f"{path}: could not hard-link it from the store")
        st = dest.stat()
        identities[path] = (st.st_dev, st.st_ino)
        if path in to_hold:
            held[os.fspath(dest)] = read_verified(entry, dest, threads=hash_threads)
        elif path in to_hash:
            verify_local_file(entry, dest, threads=hash_threads)

    try:
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            for future in [pool.submit(one, path) for path in order]:
                future.result()
    except Exception as e:  # noqa: BLE001 - reported to every rank, then all reject together
        release(held)
        problem, fatal = _describe(e, rank)
        return problem, fatal, identities, {}
    return None, False, identities, held


def release(held: Mapping[str, HeldFile]) -> None:
    """Give back the memory of files `materialize` held."""
    for file in held.values():
        file.close()


def same_bytes_everywhere(identities_by_rank: Sequence[Mapping[str, Identity]]) -> list[str]:
    """Files whose links differ between ranks (replaced in the store mid-restore)."""
    seen: dict[str, set[Identity]] = {}
    for identities in identities_by_rank:
        for path, identity in identities.items():
            seen.setdefault(path, set()).add(identity)
    return sorted(path for path, ids in seen.items() if len(ids) > 1)


def _can_link(store: ObjectStore, record: CheckpointRecord, local: Path) -> bool:
    """Whether the store's files can be hard-linked into `local`: tried on the manifest, since
    one device is not enough (a pod's emptyDir bind-mounted beside the store's folder is one
    device under two mount points, and `link` refuses to cross them)."""
    if not isinstance(store, LocalStore):
        return False
    probe = local / f".link-probe-{os.getpid()}"
    try:
        return store.link_to(f"{record.folder}/{MANIFEST_NAME}", probe)
    except OSError:  # the manifest went meanwhile: the copying path reports it to every rank
        return False
    finally:
        probe.unlink(missing_ok=True)


def _describe(error: BaseException, rank: int) -> tuple[str, bool]:
    """(message, fatal): integrity and I/O problems reject the checkpoint; anything else
    (a model that does not match the checkpoint, a bug) is fatal."""
    if isinstance(error, IntegrityError):
        return f"rank {rank}: {error}", False
    if isinstance(error, KeyError):
        return f"rank {rank}: {error.args[0] if error.args else error}", False
    if isinstance(error, OSError | ValueError | EOFError | pickle.UnpicklingError):
        return f"rank {rank}: {type(error).__name__}: {error}", False
    return f"rank {rank}: {type(error).__name__}: {error}", True
