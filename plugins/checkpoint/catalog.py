"""The checkpoint catalog: what is committed, what verifies, what to restore.

Used by the control plane (Airflow sensors, the CLI, maintenance DAGs) as well as the workers,
so it imports neither torch nor Airflow. A checkpoint is *committed* when its folder holds a
`MANIFEST.json` that parses; it is *valid* when every file the manifest lists exists with the
listed size and digest (BLAKE3, or SHA-256 in manifests written before; each entry says
which). `latest_valid` walks from the newest committed checkpoint backwards
and logs why it skipped each one it could not trust.

A committed checkpoint can be *quarantined* (`quarantine`): a `QUARANTINED.json` beside its
manifest, written by the control plane when a restore from it failed verification. It is kept
(evidence; never deleted by a recovery or by retention) but no longer listed as committed, so
no restore, fallback or retention rule ever picks it again; `Scan.quarantined` still shows it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

from trainyard.plugins.checkpoint.manifest import (
    MANIFEST_NAME,
    CheckpointManifest,
    ManifestFile,
    manifest_sha256,
    parse_step_dir,
    step_dir,
)
from trainyard.plugins.checkpoint.uris import identity_of, split_manifest_uri
from trainyard.plugins.storage.errors import ObjectNotFoundError
from trainyard.plugins.storage.store import ObjectInfo, ObjectStore, copy_hashing, open_store

log = logging.getLogger(__name__)

QUARANTINE_NAME = "QUARANTINED.json"
"""Beside `MANIFEST.json`: this checkpoint must never be restored again (see the docstring)."""

HASH_THREADS = 4
"""Files hashed in parallel by `verify` (hashlib and blake3 release the GIL; S3 reads overlap)."""


@dataclass(frozen=True)
class CheckpointRecord:
    """A committed checkpoint: its parsed manifest and where that manifest lives."""

    manifest: CheckpointManifest
    manifest_uri: str
    folder: str
    """The step folder's key relative to the checkpoint root (`step-00000100`)."""

    @property
    def step(self) -> int:
        return self.manifest.step

    @property
    def created_at(self) -> datetime:
        return self.manifest.created_at

    @property
    def metrics(self) -> dict[str, float]:
        return self.manifest.metrics


@dataclass(frozen=True)
class VerifyReport:
    step: int
    folder: str
    problems: tuple[str, ...]
    hashed_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def reason(self) -> str:
        return "; ".join(self.problems) if self.problems else "ok"


@dataclass
class Scan:
    """Everything found under a checkpoint root, committed or not."""

    committed: list[CheckpointRecord] = field(default_factory=list)
    invalid: dict[str, str] = field(default_factory=dict)
    """Folder → why its manifest was rejected (unreadable JSON, unsafe path, wrong step, …)."""
    uncommitted: dict[str, list[ObjectInfo]] = field(default_factory=dict)
    """Folders with objects but no manifest: saves in flight, or crashed before the commit."""
    quarantined: dict[str, str] = field(default_factory=dict)
    """Folder → why it was quarantined (kept, never restored; see `quarantine`)."""


@dataclass(frozen=True)
class Selection:
    chosen: CheckpointRecord | None
    rejected: tuple[tuple[CheckpointRecord, VerifyReport], ...] = ()


def as_store(store_or_uri: ObjectStore | str, *, endpoint_url: str | None = None) -> ObjectStore:
    if isinstance(store_or_uri, ObjectStore):
        return store_or_uri
    return open_store(store_or_uri, endpoint_url=endpoint_url)


def read_manifest(store: ObjectStore, folder: str) -> CheckpointRecord:
    """Read and check one folder's manifest; raises `ObjectNotFoundError` / `ValueError`.

    Its identity must match the folder that holds it: the step of `step-NNNNNNNN`, and the job
    and run of the root (`…/jobs/<job>/runs/<run>/checkpoints`, `<storage>/runs/<run>`), so a
    manifest copied in from another job or run is invalid — never restored, never exported."""
    manifest = CheckpointManifest.from_json_bytes(store.get_bytes(f"{folder}/{MANIFEST_NAME}"))
    expected = parse_step_dir(folder)
    if expected != manifest.step:
        raise ValueError(f"manifest in {folder!r} says step {manifest.step}")
    problem = identity_problem(manifest, store.uri)
    if problem:
        raise ValueError(problem)
    return CheckpointRecord(manifest, store.key_uri(f"{folder}/{MANIFEST_NAME}"), folder)


def identity_problem(manifest: CheckpointManifest, root_uri: str) -> str | None:
    """Why the manifest's job/run do not match the root that holds it, or None. A root with
    no job structure (a scratch folder) is not compared."""
    identity = identity_of(root_uri)
    if identity is None:
        return None
    job, run = identity
    if manifest.job != job:
        return f"the manifest claims job {manifest.job[:80]!r} but lies in job {job!r}'s folder"
    if manifest.run != run:
        return (f"the manifest claims run {(manifest.run or '')[:80]!r} but lies in "
                f"{'run ' + repr(run) if run else 'a folder without runs'}")
    return None


def open_manifest_uri(manifest_uri: str, *, endpoint_url: str | None = None
                      ) -> tuple[ObjectStore, CheckpointRecord]:
    """`(store rooted at the checkpoint root, record)` for an explicit manifest URI."""
    root_uri, folder, _ = split_manifest_uri(manifest_uri)
    store = open_store(root_uri, endpoint_url=endpoint_url)
    return store, read_manifest(store, folder)


def scan(store_or_uri: ObjectStore | str, *, endpoint_url: str | None = None) -> Scan:
    """One listing of the root, grouped by step folder; manifests parsed, oldest first."""
    store = as_store(store_or_uri, endpoint_url=endpoint_url)
    by_folder: dict[str, list[ObjectInfo]] = {}
    for info in store.list("step-"):
        folder, _, rest = info.key.partition("/")
        if rest and parse_step_dir(folder) is not None:
            by_folder.setdefault(folder, []).append(info)
    result = Scan()
    for folder in sorted(by_folder, key=lambda f: parse_step_dir(f) or 0):
        objects = by_folder[folder]
        keys = {o.key for o in objects}
        if f"{folder}/{MANIFEST_NAME}" not in keys:
            result.uncommitted[folder] = objects
            continue
        if f"{folder}/{QUARANTINE_NAME}" in keys:
            why = _quarantine_reason(store, folder)
            if why is not None:
                result.quarantined[folder] = why
                continue
        try:
            result.committed.append(read_manifest(store, folder))
        except ObjectNotFoundError:  # deleted between the listing and the read
            continue
        except ValueError as e:
            log.warning("checkpoint %s in %s has an invalid manifest: %s", folder, store.uri, e)
            result.invalid[folder] = str(e)
    return result


def quarantine(manifest_uri: str, reason: str, *, endpoint_url: str | None = None,
               by: str = "") -> str:
    """Mark the checkpoint of `manifest_uri` quarantined: write `QUARANTINED.json` beside its
    manifest (reason, time, who, and the SHA-256 of the manifest it condemns), delete nothing.
    Idempotent (the first reason stays); returns the marker's URI.

    The marker names the manifest's digest because a step can be committed again (a run
    rolled back before a divergence saves the same step numbers anew): a marker whose digest
    no longer matches the manifest beside it condemns nothing. The new save overwrites the
    condemned files of that step (the writer owns its step folder): the bad bytes are kept
    until then, not forever."""
    root_uri, folder, _ = split_manifest_uri(manifest_uri)
    store = open_store(root_uri, endpoint_url=endpoint_url)
    marker = f"{folder}/{QUARANTINE_NAME}"
    digest = manifest_sha256(store.get_bytes(f"{folder}/{MANIFEST_NAME}"))
    if store.exists(marker) and _quarantine_reason(store, folder) is not None:
        return store.key_uri(marker)
    body = {"manifest_uri": manifest_uri, "manifest_sha256": digest, "reason": reason, "by": by,
            "quarantined_at": datetime.now(UTC).isoformat()}
    store.put_bytes(marker, json.dumps(body, indent=2).encode())
    return store.key_uri(marker)


def _quarantine_reason(store: ObjectStore, folder: str) -> str | None:
    """Why the folder's current manifest is quarantined, or None when the marker condemns an
    earlier manifest of the same step (committed again since)."""
    try:
        marker = json.loads(store.get_bytes(f"{folder}/{QUARANTINE_NAME}"))
        digest = manifest_sha256(store.get_bytes(f"{folder}/{MANIFEST_NAME}"))
    except ObjectNotFoundError:
        return None
    except (ValueError, AttributeError) as e:  # an unreadable marker still quarantines
        return f"(unreadable {QUARANTINE_NAME}: {e})"
    if not isinstance(marker, dict):
        return f"(unreadable {QUARANTINE_NAME})"
    if marker.get("manifest_sha256") not in (None, digest):
        log.info("checkpoint %s was committed again after its quarantine; the marker is stale", folder)
        return None
    return str(marker.get("reason", ""))


def list_checkpoints(store_or_uri: ObjectStore | str, *, endpoint_url: str | None = None
                     ) -> list[CheckpointRecord]:
    """Committed checkpoints (those with a manifest that parses), oldest step first; quarantined
    ones are left out."""
    return scan(store_or_uri, endpoint_url=endpoint_url).committed


def verify(
    store_or_uri: ObjectStore | str,
    record: CheckpointRecord | int,
    *,
    hashes: bool = True,
    endpoint_url: str | None = None,
    listing: Iterable[ObjectInfo] | None = None,
) -> VerifyReport:
    """Check every file of one checkpoint: present, right size, and (with `hashes`) right
    digest, in the algorithm its manifest entry names. Never raises for a bad checkpoint — the problems are in the report."""
    store = as_store(store_or_uri, endpoint_url=endpoint_url)
    if isinstance(record, int):
        folder = step_dir(record)
        try:
            record = read_manifest(store, folder)
        except (ObjectNotFoundError, ValueError) as e:
            return VerifyReport(parse_step_dir(folder) or 0, folder, (f"manifest: {e}",))
    folder = record.folder
    objects = listing if listing is not None else store.list(folder + "/")
    sizes = {o.key: o.size for o in objects}
    problems: list[str] = []
    to_hash: list[ManifestFile] = []
    for entry in record.manifest.files:
        key = f"{folder}/{entry.path}"
        if key not in sizes:
            problems.append(f"{entry.path}: missing")
        elif sizes[key] != entry.size:
            problems.append(f"{entry.path}: size {sizes[key]} != manifest {entry.size}")
        else:
            to_hash.append(entry)
    hashed = 0
    if hashes and to_hash:
        with ThreadPoolExecutor(max_workers=min(HASH_THREADS, len(to_hash))) as pool:
            for entry, outcome in zip(to_hash, pool.map(lambda e: _hash_one(store, folder, e),
                                                         to_hash), strict=True):
                if isinstance(outcome, str):
                    problems.append(f"{entry.path}: {outcome}")
                else:
                    hashed += outcome
    return VerifyReport(record.step, folder, tuple(problems), hashed)


def _hash_one(store: ObjectStore, folder: str, entry: ManifestFile) -> int | str:
    """Bytes hashed, or a description of what is wrong."""
    try:
        with store.open_read(f"{folder}/{entry.path}") as f:
            size, digest = copy_hashing(f, None, entry.algorithm)
    except ObjectNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({type(e).__name__}: {e})"
    return entry.mismatch(size, digest) or size


def candidates_newest_first(store: ObjectStore, *, before_step: int | None = None
                            ) -> Iterator[CheckpointRecord]:
    for record in reversed(list_checkpoints(store)):
        if before_step is None or record.step < before_step:
            yield record


def select_latest_valid(
    store_or_uri: ObjectStore | str,
    *,
    hashes: bool = True,
    before_step: int | None = None,
    endpoint_url: str | None = None,
) -> Selection:
    """The newest checkpoint that verifies, plus every newer one rejected and why."""
    store = as_store(store_or_uri, endpoint_url=endpoint_url)
    rejected: list[tuple[CheckpointRecord, VerifyReport]] = []
    for record in candidates_newest_first(store, before_step=before_step):
        report = verify(store, record, hashes=hashes)
        if report.ok:
            for bad, why in rejected:
                log.warning("checkpoint step %d rejected (%s); fell back to step %d",
                            bad.step, why.reason, record.step)
            return Selection(record, tuple(rejected))
        rejected.append((record, report))
    for bad, why in rejected:
        log.error("checkpoint step %d rejected (%s); no older valid checkpoint", bad.step,
                  why.reason)
    return Selection(None, tuple(rejected))


def latest_valid(store_or_uri: ObjectStore | str, *, hashes: bool = True,
                 endpoint_url: str | None = None) -> CheckpointRecord | None:
    """The newest checkpoint whose files all verify; falls back (with a logged reason)."""
    return select_latest_valid(store_or_uri, hashes=hashes, endpoint_url=endpoint_url).chosen


def delete_checkpoint(store: ObjectStore, folder: str) -> int:
    """Delete one step folder, **manifest first**: if this is interrupted, what remains has no
    manifest and so never looks valid. Returns the number of objects deleted."""
    if parse_step_dir(folder) is None:
        raise ValueError(f"{folder!r} is not a step folder; refusing to delete it")
    store.delete(f"{folder}/{MANIFEST_NAME}")
    count = 1
    for info in list(store.list(folder + "/")):
        store.delete(info.key)
        count += 1
    return count


def list_runs(object_store_uri: str, job: str, *, storage: str = "", endpoint_url: str | None = None
              ) -> list[str]:
    """The training runs of `job` that stored anything, oldest first (run ids sort by start
    time), so `trainyard checkpoints … JOB` can default to the latest run."""
    from trainyard.config.runs import check_run_id
    from trainyard.plugins.checkpoint.uris import runs_uri

    store = open_store(runs_uri(object_store_uri, job, storage=storage), endpoint_url=endpoint_url)
    runs: set[str] = set()
    for info in store.list():
        head = info.key.split("/", 1)[0]
        try:
            runs.add(check_run_id(head))
        except ValueError:
            continue
    return sorted(runs)
