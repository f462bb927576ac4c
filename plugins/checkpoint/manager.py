"""`CheckpointManager`: the checkpoint writer and reader that runs inside training processes.

A save, as every rank sees it (all ranks call `save` together):

1. *Blocking* — wait for the previous save if it is still in flight (at most one at a time;
   the wait is reported), take `get_state_dict(model, optimizer)` and copy it into host
   buffers (`staging.ReusingStager`: DCP's `DefaultStager` the first time, then a copy into
   the same buffers), so in steady state this is one memcpy (or device→host copy) of the
   rank's shard — the only time training is held. With `staging="deferred"` the copy moves
   to the background thread too and overlaps the next step's forward and backward, as
   torchtitan's `async_with_pinned_mem` overlaps its device→host copy (and CheckFreq,
   FAST '21, its snapshot): the state only changes in `optimizer.step()`, so a pre-hook there
   waits for the copy (`wait_staged`), as does a forward pre-hook on every module with
   persistent buffers (batch norm's running statistics change in forward). Anything else
   that changes the state in place before the copy ends is caught by the tensors' version
   counters and fails that save, saying so, instead of committing a torn state
   (`staging.StateVersions`); a change through `.data`, which bypasses them, is not — a
   script that does that sets `staging="blocking"` or calls `wait_staged()` first. Host
   memory only, for now: with CUDA the copy would need a stream of its own ordered after the
   step that made the state, which has not run on a GPU here, so on CUDA machines the copy
   stays blocking (`staging` is then only a wish).
2. *Background thread* — `dcp.save` of the staged copy into this rank's local staging
   folder (no fsync: the staging copy is scratch), plus a JSON file with the rank's extra
   state (step, RNG states, LR scheduler, sampler — never a pickle), each file hashed with
   BLAKE3 as it is written. Then each rank uploads its own files (a local store adopts them
   by rename; a store that copies them hashes the bytes as they stream and checks them
   against the writer's digest), and deletes its staging copy.
3. *Commit* — rank 0 gathers every rank's file list and writes `step-<N>/MANIFEST.json`
   last, in one atomic PUT / rename, and tells every rank the outcome. A crash anywhere
   before that leaves a folder without a manifest, which the catalog never lists.

The background work uses its own gloo process group, so its collectives never interleave with
the training loop's (which may be NCCL). A restore picks the newest committed checkpoint (or
the one asked for), downloads only the files this rank's DCP load plan needs, verifies each
against the manifest while downloading, agrees with the other ranks that every rank's files
verified — else all ranks fall back together to the previous checkpoint and log why — and
only then `dcp.load`s into the live model and optimizer, so a corrupt byte never reaches them.
DCP reshards on load: a checkpoint written by 2 ranks restores onto 1 or 4.

Tricky cases:
- A second save of an existing step (after a rollback) first deletes that step's old
  manifest, before any rank overwrites the files it describes.
- A failed background save does not stop training: the next `save` reports it in
  `SaveResult.previous`, and `wait()` / `save_sync()` raise `CheckpointSaveError`.
- Staging buffers stay allocated between saves (one host copy of the rank's state): that
  memory is what makes the blocking part a plain copy instead of an allocation.
- `on_commit` runs on rank 0 once every rank knows the save committed, in the thread that
  committed it (the background one; the caller's for `save_sync`). The worker hands it the
  bookkeeping of a commit (MLflow record, retention) and keeps that off this thread itself
  (`trainyard.worker.checkpoint_records`): a slow tracking server must not hold the next save.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed.checkpoint as dcp

from trainyard.plugins.checkpoint.catalog import (
    CheckpointRecord,
    list_checkpoints,
    open_manifest_uri,
)
from trainyard.plugins.checkpoint.collectives import RankGroup
from trainyard.plugins.checkpoint.dcp_io import (
    HashingFileSystemWriter,
    SafeFileSystemReader,
    SafeLoadPlanner,
)
from trainyard.plugins.checkpoint.direct_read import HeldFile, memory_to_hold
from trainyard.plugins.checkpoint.errors import (
    CheckpointCatalogError,
    CheckpointMismatchError,
    CheckpointSaveError,
    ManagerClosedError,
    NoValidCheckpointError,
)
from trainyard.plugins.checkpoint.extra_state import (
    Stateful,
    apply_extra_state,
    encode_extra_state,
    extra_file_for,
    extra_state_path,
)
from trainyard.plugins.checkpoint.fetch import (
    FetchPlan,
    assign_verifiers,
    materialize,
    plan_fetch,
    release,
    same_bytes_everywhere,
)
from trainyard.plugins.checkpoint.manifest import (
    MANIFEST_NAME,
    CheckpointManifest,
    ManifestFile,
    step_dir,
    utc_now,
)
from trainyard.plugins.checkpoint.transfer import upload_file
from trainyard.plugins.checkpoint.uris import (
    check_job_name,
    identity_of,
    require_job_prefix,
    split_manifest_uri,
)
from trainyard.plugins.storage.store import LocalStore, ObjectStore, open_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveResult:
    """What one save did. `save()` returns it `pending`; `wait()` returns it final."""

    step: int
    status: Literal["pending", "committed", "failed"]
    manifest_uri: str
    blocking_s: float = 0.0
    """How long the call held the training loop (waiting for the previous save + staging)."""
    waited_s: float = 0.0
    """Part of `blocking_s` spent waiting for the previous save to finish."""
    staging_s: float = 0.0
    """The copy into host buffers: part of `blocking_s`, or of the background with deferred
    staging (then `stage_wait_s` is what training waited for it)."""
    stage_wait_s: float = 0.0
    """Deferred staging: how long training waited for the copy at a guard (the next
    optimizer step, a forward that changes buffers, `wait_staged`); final results only."""
    commit_s: float | None = None
    """From the `save` call to the manifest being written (rank 0's clock)."""
    stored_bytes: int = 0
    state_bytes: int = 0
    error: str | None = None
    previous: SaveResult | None = None
    """The earlier save this one had to wait for, final."""
    phases: dict[str, float] = field(default_factory=dict)
    """Background phases, slowest rank: `queued_s` (save call → background start),
    `write_s` (dcp.save into staging), `upload_s` (hash + upload of this rank's files)."""

    @property
    def committed(self) -> bool:
        return self.status == "committed"


class CheckpointManager:
    """Async sharded checkpoints with BLAKE3-hashed manifests for one job (see the module docstring).

    All ranks construct it, and call `save`, `save_sync`, `wait`, `restore` and `close`,
    together. Convention: `save(step)` is called after step `step` finished; a restore returns
    that manifest, and training continues with step `manifest.step + 1`.
    """

    def __init__(
        self,
        *,
        checkpoint_uri: str,
        job: str,
        rank: int,
        world_size: int,
        staging_dir: Path,
        compression: Literal["none", "zstd"] = "none",
        endpoint_url: str | None = None,
        process_group: Any = None,
        plan_json: str | None = None,
        io_threads: int | None = None,
        area: str | None = None,
        init_from: str = "",
        on_commit: Callable[[SaveResult], None] | None = None,
        staging: Literal["blocking", "deferred"] = "blocking",
    ) -> None:
        self.job = check_job_name(job)
        self.checkpoint_uri = require_job_prefix(checkpoint_uri, job, area=area).rstrip("/")
        self.area = area
        """The job's area (`uris.area_for`): explicit restores must lie inside it. Without
        one, the area the checkpoint root claims by its structure."""
        self.init_from = init_from
        """The spec's read-only `checkpoint.initFrom`: the one foreign manifest it may read."""
        self.on_commit = on_commit
        """Called on rank 0 with each committed save (see the module docstring); its errors are
        logged, never raised: the checkpoint is committed whatever the bookkeeping does."""
        identity = identity_of(self.checkpoint_uri)
        self.run = identity[1] if identity and identity[0] == job else None
        """Written into every manifest beside the job: the folder's run (`…/runs/<run>/…`)."""
        if compression not in ("none", "zstd"):
            raise ValueError(f"compression must be 'none' or 'zstd', got {compression!r}")
        self.compression: Literal["none", "zstd"] = compression
        self.endpoint_url = endpoint_url
        self.store: ObjectStore = open_store(self.checkpoint_uri, endpoint_url=endpoint_url)
        self.rank, self.world_size = rank, world_size
        self._ranks = RankGroup(process_group, rank, world_size)
        self.staging_dir = Path(staging_dir)
        self.plan: dict[str, Any] | None = json.loads(plan_json) if plan_json else None
        self.io_threads = io_threads or default_io_threads()
        """Files each rank writes (DCP `thread_count`) and hashes at once; default: the cores
        this rank can count on (CPU count / ranks on this node), 1 to 4."""
        if staging not in ("blocking", "deferred"):
            raise ValueError(f"staging must be 'blocking' or 'deferred', got {staging!r}")
        self.staging: Literal["blocking", "deferred"] = staging
        if staging == "deferred" and torch.cuda.is_available():
            log.info("checkpoint staging: deferred is host-only for now; with CUDA the copy stays "
                     "inside save() (see trainyard.plugins.checkpoint.manager)")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainyard-ckpt")
        self._inflight: tuple[SaveResult, Future[SaveResult]] | None = None
        self._staged: threading.Event | None = None
        """Deferred staging: set once the in-flight save's copy is done (or failed)."""
        self._stage_wait_s = 0.0
        """What the guards waited for the in-flight save's copy."""
        self._guards: dict[tuple[int, int], list[Any]] = {}
        """Hook handles (`_guard`), by (id(model), id(optimizer))."""
        self._stager: Any = None
        self._closed = False
        self.last_restore_phases: dict[str, float] = {}
        """This rank's timings of the last restore: catalog, fetch + verify, load (diagnostics)."""

    # -- public API ---------------------------------------------------------------------------

    def save(self, step: int, *, model: torch.nn.Module, optimizer: Any,
             extra: Mapping[str, Any] | None = None,
             metrics: Mapping[str, float] | None = None) -> SaveResult:
        """Start an asynchronous save; returns once the state is staged (status `pending`)."""
        return self._save(step, model, optimizer, extra, metrics, sync=False)

    def save_sync(self, step: int, *, model: torch.nn.Module, optimizer: Any,
                  extra: Mapping[str, Any] | None = None,
                  metrics: Mapping[str, float] | None = None) -> SaveResult:
        """Save and commit before returning (SIGTERM, preemption, end of training)."""
        return self._save(step, model, optimizer, extra, metrics, sync=True)

    def wait(self) -> SaveResult | None:
        """Block until the in-flight save commits; raise `CheckpointSaveError` if it failed."""
        return self._finish_inflight(raise_on_error=True)

    def wait_staged(self) -> None:
        """Deferred staging: return once the in-flight save has copied the state, so it may
        change. The guards call it (module docstring); a no-op when nothing is being copied."""
        staged = self._staged
        if staged is None or staged.is_set():
            return
        t0 = time.perf_counter()
        staged.wait()
        self._stage_wait_s += time.perf_counter() - t0

    def restore(self, *, model: torch.nn.Module, optimizer: Any = None,
                extra: Mapping[str, Stateful] | None = None,
                manifest_uri: str | None = None) -> CheckpointManifest | None:
        """Load a checkpoint into the live model, optimizer, extra state and RNGs.

        With `manifest_uri` that checkpoint, and nothing else, is restored (it must lie inside
        the job's prefix and verify, else `NoValidCheckpointError`). Without it, the newest
        committed checkpoint that verifies; newer ones that do not are skipped with a logged
        reason. Returns None when the job has no checkpoint at all.
        """
        self._check_open()
        self._finish_inflight(raise_on_error=False)
        if manifest_uri:
            require_job_prefix(manifest_uri, self.job, area=self.area,
                               allowed=(self.init_from,) if self.init_from else ())
        t0 = time.perf_counter()
        candidates = self._candidates(manifest_uri)
        self.last_restore_phases = {"catalog_s": time.perf_counter() - t0}
        if not candidates:
            log.info("no checkpoint under %s; starting from scratch", self.checkpoint_uri)
            return None
        state = self._state_dict(model, optimizer)
        rejected: list[str] = []
        for manifest_json, uri in candidates:
            root_uri, folder, _ = split_manifest_uri(uri)
            record = CheckpointRecord(CheckpointManifest.model_validate_json(manifest_json),
                                      uri, folder)
            # Rank 0 read and checked the manifest; the other ranks only need its store.
            store = self.store if root_uri == self.store.uri else \
                open_store(root_uri, endpoint_url=self.endpoint_url)
            local = self.staging_dir / f"restore-rank{self.rank:05d}" / record.folder
            extra_path = extra_file_for(record.manifest, self.rank)
            t_fetch = time.perf_counter()
            problem, held = self._fetch_verified(store, record, state, local, extra_path)
            self.last_restore_phases["fetch_verify_s"] = time.perf_counter() - t_fetch
            if problem is None:
                if rejected and self.rank == 0:
                    log.warning("restoring step %d after rejecting newer checkpoints: %s",
                                record.step, " | ".join(rejected))
                t_load = time.perf_counter()
                try:
                    self._load(record, state, local / extra_path, model, optimizer, extra, local,
                               held)
                finally:
                    release(held)
                    self.last_restore_phases["load_s"] = time.perf_counter() - t_load
                    shutil.rmtree(local.parent, ignore_errors=True)
                log.info("restored checkpoint step %d from %s", record.step, uri)
                return record.manifest
            shutil.rmtree(local.parent, ignore_errors=True)
            reason = f"step {record.step}: {problem}"
            rejected.append(reason)
            if manifest_uri:
                raise NoValidCheckpointError(f"requested checkpoint {uri} does not verify: {reason}")
            if self.rank == 0:
                log.warning("checkpoint %s rejected, falling back to the previous one: %s",
                            uri, reason)
        raise NoValidCheckpointError(
            f"no checkpoint under {self.checkpoint_uri} verifies: " + " | ".join(rejected))

    def close(self) -> None:
        """Wait for the in-flight save (logging a failure) and release threads and buffers."""
        if self._closed:
            return
        try:
            self._finish_inflight(raise_on_error=False)
        finally:
            self._closed = True
            self._executor.shutdown(wait=True)
            for handles in self._guards.values():
                for handle in handles:
                    handle.remove()
            self._guards.clear()
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def manifest_uri(self, step: int) -> str:
        return self.store.key_uri(f"{step_dir(step)}/{MANIFEST_NAME}")

    # -- saving -------------------------------------------------------------------------------

    def _save(self, step: int, model: torch.nn.Module, optimizer: Any,
              extra: Mapping[str, Any] | None, metrics: Mapping[str, float] | None,
              *, sync: bool) -> SaveResult:
        self._check_open()
        if step < 0:
            raise ValueError(f"step must be ≥ 0, got {step}")
        t0 = time.perf_counter()
        previous = self._finish_inflight(raise_on_error=False)
        if previous is not None:  # report one level only: a chain would grow for the whole run
            previous = replace(previous, previous=None)
        waited = time.perf_counter() - t0
        extra_blob = encode_extra_state(job=self.job, step=step, rank=self.rank,
                                        world_size=self.world_size, extra=extra)
        state = self._state_dict(model, optimizer)
        clean_metrics = {str(k): float(v) for k, v in (metrics or {}).items()}
        if self.staging == "deferred" and not sync and not torch.cuda.is_available():
            self._guard(model, optimizer)
            pending, job = self._deferred(step, state, model, optimizer, extra_blob, clean_metrics,
                                          t0, waited, previous)
            self._inflight = (pending, self._executor.submit(self._run_job, job, step))
            return pending
        t_stage = time.perf_counter()
        staged = self._stage(state)
        staging_s = time.perf_counter() - t_stage
        pending = SaveResult(step, "pending", self.manifest_uri(step),
                             blocking_s=time.perf_counter() - t0, waited_s=waited,
                             staging_s=staging_s, previous=previous)

        def job() -> SaveResult:
            return self._write_and_commit(step, staged, extra_blob, clean_metrics, t0)

        if sync:
            result = _merge(self._run_job(job, step), pending)
            result = replace(result, blocking_s=time.perf_counter() - t0)
            if not result.committed:
                raise CheckpointSaveError(f"emergency save of step {step} failed: {result.error}")
            return result
        self._inflight = (pending, self._executor.submit(self._run_job, job, step))
        return pending

    def _deferred(self, step: int, state: dict[str, Any], model: torch.nn.Module, optimizer: Any,
                  extra_blob: bytes, metrics: dict[str, float], t0: float, waited: float,
                  previous: SaveResult | None) -> tuple[SaveResult, Callable[[], SaveResult]]:
        """A save whose copy runs in the background job, first (module docstring): the guards
        hold whatever would change the state until it is done."""
        from trainyard.plugins.checkpoint.staging import StateVersions

        versions = StateVersions(state)
        staged_event = threading.Event()
        self._staged, self._stage_wait_s = staged_event, 0.0
        pending = SaveResult(step, "pending", self.manifest_uri(step),
                             blocking_s=time.perf_counter() - t0, waited_s=waited, previous=previous)

        def job() -> SaveResult:
            t_stage, error = time.perf_counter(), None
            try:
                staged = self._stage(state)
                changed = versions.changed()
                if changed:
                    error = (f"rank {self.rank}: the state changed while it was being staged "
                             f"({changed}): change it only in optimizer.step() or after "
                             "CheckpointManager.wait_staged(), or set checkpoint.staging: blocking")
            except Exception as e:
                log.exception("rank %d could not stage checkpoint step %d", self.rank, step)
                staged, error = state, f"rank {self.rank}: staging: {type(e).__name__}: {e}"
            finally:
                staged_event.set()  # a failed copy must not hold training either
            staging_s = time.perf_counter() - t_stage
            # With an error the copy still goes through the save's collectives (every rank
            # reaches them) into scratch, and the commit fails: it is never uploaded.
            result = self._write_and_commit(step, staged, extra_blob, metrics, t0, error=error)
            return replace(result, staging_s=staging_s)

        return pending, job

    def _guard(self, model: torch.nn.Module, optimizer: Any) -> None:
        """Hooks that hold a change of the state until the copy is done (module docstring):
        each optimizer's step (one, or the several `get_state_dict` takes), and the forward of
        every module with persistent buffers."""
        key = (id(model), id(optimizer))
        if key in self._guards:
            return

        def hold(*_: Any) -> None:
            self.wait_staged()

        optimizers = [] if optimizer is None else \
            [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
        handles = [o.register_step_pre_hook(hold) for o in optimizers]
        modules = model.modules() if isinstance(model, torch.nn.Module) else \
            (m for part in model for m in part.modules())
        for module in modules:
            if any(name not in module._non_persistent_buffers_set
                   for name, _ in module.named_buffers(recurse=False)):
                handles.append(module.register_forward_pre_hook(hold))
        self._guards[key] = handles

    def _run_job(self, job: Callable[[], SaveResult], step: int) -> SaveResult:
        try:
            return job()
        except Exception as e:  # collectives failed (a rank died, a timeout): report, never hang
            log.exception("checkpoint save of step %d failed", step)
            return SaveResult(step, "failed", self.manifest_uri(step),
                              error=f"{type(e).__name__}: {e}")

    def _finish_inflight(self, *, raise_on_error: bool) -> SaveResult | None:
        if self._inflight is None:
            return None
        pending, future = self._inflight
        self._inflight = None
        result = _merge(future.result(), pending)
        if self._staged is not None:
            result = replace(result, stage_wait_s=self._stage_wait_s)
            self._staged, self._stage_wait_s = None, 0.0
        if not result.committed:
            log.error("checkpoint step %d failed: %s", result.step, result.error)
            if raise_on_error:
                raise CheckpointSaveError(f"checkpoint step {result.step} failed: {result.error}")
        return result

    @property
    def _adopts_staged_files(self) -> bool:
        """The store keeps the staged files themselves (a local store renames them into
        place), so they are written with O_DIRECT (`direct_write`): nothing reads them again
        soon. Files that are uploaded stay in the page cache the upload reads them from."""
        return isinstance(self.store, LocalStore) and self.store.adopts_from(self.staging_dir)

    def _stage(self, state: dict[str, Any]) -> dict[str, Any]:
        if self._stager is None:
            from trainyard.plugins.checkpoint.staging import ReusingStager

            self._stager = ReusingStager()
        return self._stager.stage(state)

    def _write_and_commit(self, step: int, staged: dict[str, Any], extra_blob: bytes,
                          metrics: dict[str, float], t0: float, error: str | None = None) -> SaveResult:
        """Background part of a save. Every rank reaches every collective, whatever fails
        (`error`: this rank's save has failed already)."""
        folder = step_dir(step)
        local = self.staging_dir / f"{folder}-rank{self.rank:05d}"
        files: list[ManifestFile] = []
        phases: dict[str, float] = {"queued_s": time.perf_counter() - t0}
        try:
            shutil.rmtree(local, ignore_errors=True)
            local.mkdir(parents=True)
            if self.rank == 0:  # dcp.save's first collective orders this before any upload
                self.store.delete(f"{folder}/{MANIFEST_NAME}")
        except Exception as e:
            log.exception("rank %d could not prepare checkpoint step %d", self.rank, step)
            error = error or f"rank {self.rank}: preparing: {type(e).__name__}: {e}"
        t_write = time.perf_counter()
        writer = HashingFileSystemWriter(local, single_file_per_rank=True, sync_files=False,
                                         thread_count=self.io_threads,
                                         direct_io=self._adopts_staged_files)
        try:
            dcp.save(staged, storage_writer=writer, process_group=self._ranks.group,
                     no_dist=not self._ranks.distributed)
        except Exception as e:
            log.exception("rank %d: dcp.save of checkpoint step %d failed", self.rank, step)
            error = error or f"rank {self.rank}: dcp.save: {type(e).__name__}: {e}"
        t_upload = time.perf_counter()
        phases["write_s"] = t_upload - t_write
        if error is None:
            try:
                extra_file = local / extra_state_path(self.rank)
                extra_file.parent.mkdir(parents=True, exist_ok=True)
                extra_file.write_bytes(extra_blob)
                for path in sorted(p for p in local.rglob("*") if p.is_file()):
                    rel = path.relative_to(local).as_posix()
                    known = writer.digest_of(path)
                    files.append(upload_file(self.store, folder, rel, path, move=True,
                                             compression=self.compression, rank=self.rank,
                                             digest=known[1] if known else None))
            except Exception as e:
                error = f"rank {self.rank}: upload: {type(e).__name__}: {e}"
                log.exception("rank %d could not upload checkpoint step %d", self.rank, step)
        shutil.rmtree(local, ignore_errors=True)
        phases["upload_s"] = time.perf_counter() - t_upload

        outcomes = self._ranks.gather((files, error, phases))
        summary: dict[str, Any] = {}
        if self.rank == 0:
            summary = self._commit(step, outcomes, metrics, t0)
        summary = self._ranks.broadcast(summary)
        result = SaveResult(step, summary["status"], self.manifest_uri(step),
                            commit_s=summary.get("commit_s"), phases=summary.get("phases", {}),
                            stored_bytes=summary.get("stored_bytes", 0),
                            state_bytes=summary.get("state_bytes", 0), error=summary.get("error"))
        if self.rank == 0 and result.committed and self.on_commit is not None:
            try:
                self.on_commit(result)
            except Exception:  # bookkeeping only: the commit stands
                log.exception("after the commit of checkpoint step %d", step)
        return result

    def _commit(self, step: int,
                outcomes: list[tuple[list[ManifestFile], str | None, dict[str, float]]],
                metrics: dict[str, float], t0: float) -> dict[str, Any]:
        phases = {k: max(p.get(k, 0.0) for _, _, p in outcomes) for k in outcomes[0][2]}
        errors = [e for _, e, _ in outcomes if e]
        if errors:
            return {"status": "failed", "error": " | ".join(errors), "phases": phases}
        all_files = sorted((f for files, _, _ in outcomes for f in files), key=lambda f: f.path)
        try:
            manifest = CheckpointManifest(
                job=self.job, run=self.run, step=step, created_at=utc_now(), world_size=self.world_size,
                plan=self.plan, metrics=metrics, files=all_files,
                extra_state=[extra_state_path(r) for r in range(self.world_size)],
                torch_version=torch.__version__)
            self.store.put_bytes(f"{step_dir(step)}/{MANIFEST_NAME}", manifest.to_json_bytes())
        except Exception as e:
            log.exception("could not write the manifest of step %d", step)
            return {"status": "failed", "error": f"manifest: {type(e).__name__}: {e}",
                    "phases": phases}
        commit_s = time.perf_counter() - t0
        log.info("checkpoint step %d committed: %.1f MB in %.2f s", step,
                 manifest.stored_bytes / 1e6, commit_s)
        return {"status": "committed", "commit_s": commit_s, "phases": phases,
                "stored_bytes": manifest.stored_bytes, "state_bytes": manifest.state_bytes}

    # -- restoring ----------------------------------------------------------------------------

    def _candidates(self, manifest_uri: str | None) -> list[tuple[str, str]]:
        """(manifest JSON, manifest URI), newest first — read by rank 0, the same on all ranks."""
        found: list[tuple[str, str]] | str = []
        if self.rank == 0:
            try:
                if manifest_uri:
                    _, record = open_manifest_uri(manifest_uri, endpoint_url=self.endpoint_url)
                    records = [record]
                else:
                    records = list(reversed(list_checkpoints(self.store)))
                found = [(r.manifest.model_dump_json(), r.manifest_uri) for r in records]
            except Exception as e:  # every rank must raise, not wait in the broadcast below
                log.exception("could not read the checkpoint catalog")
                found = f"{type(e).__name__}: {e}"
        found = self._ranks.broadcast(found)
        if isinstance(found, str):
            if manifest_uri:
                raise NoValidCheckpointError(f"cannot read {manifest_uri}: {found}")
            raise CheckpointCatalogError(f"cannot list checkpoints under {self.checkpoint_uri}: {found}")
        return found

    def _fetch_verified(self, store: ObjectStore, record: CheckpointRecord,
                        state: dict[str, Any], local: Path, extra_path: str
                        ) -> tuple[str | None, dict[str, HeldFile]]:
        """Get the files this rank needs, verified (see `fetch`); the same verdict on every
        rank: (None, the files held in memory) when all is well, else (why not, nothing)."""
        t0 = time.perf_counter()
        plan = plan_fetch(store, record, state, local, extra_path, self.rank)
        self.last_restore_phases["plan_s"] = time.perf_counter() - t0
        plans: list[FetchPlan] = self._ranks.all_gather(plan)
        fatal = [p.problem for p in plans if p.fatal]
        if fatal:
            raise CheckpointMismatchError(f"cannot restore step {record.step}: {' | '.join(map(str, fatal))}")
        problems = [p.problem for p in plans if p.problem]
        if problems:
            return "; ".join(map(str, problems)), {}
        link = all(p.can_link for p in plans)
        sizes = {f.path: f.size for f in record.manifest.files}
        if link:
            verifier = assign_verifiers([p.needed for p in plans], sizes)
            to_hash = {path for path, r in verifier.items() if r == self.rank}
        else:
            to_hash = set(plan.needed)
        t0 = time.perf_counter()
        problem, fatal_here, identities, held = materialize(
            store, record, plan.needed, local, link=link, to_hash=to_hash, rank=self.rank,
            threads=self.io_threads, hold=memory_to_hold())
        self.last_restore_phases["materialize_s"] = time.perf_counter() - t0
        outcomes = self._ranks.all_gather((problem, fatal_here, identities))
        fatal = [p for p, is_fatal, _ in outcomes if is_fatal]
        if fatal:  # a bug, not a bad checkpoint: an older one would not help (as in the plan)
            release(held)
            raise CheckpointMismatchError(f"cannot restore step {record.step}: {' | '.join(map(str, fatal))}")
        problems = [p for p, _, _ in outcomes if p]
        changed = same_bytes_everywhere([ids for _, _, ids in outcomes])
        if changed:
            problems.append(f"changed in the store while restoring: {', '.join(changed)}")
        if problems:
            release(held)
            return "; ".join(problems), {}
        return None, held

    def _load(self, record: CheckpointRecord, state: dict[str, Any], extra_file: Path,
              model: torch.nn.Module, optimizer: Any, extra: Mapping[str, Stateful] | None,
              local: Path, held: Mapping[str, HeldFile]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        t0 = time.perf_counter()
        dcp.load(state, storage_reader=SafeFileSystemReader(local, held=held), planner=SafeLoadPlanner(),
                 process_group=self._ranks.group, no_dist=not self._ranks.distributed)
        self.last_restore_phases["dcp_load_s"] = time.perf_counter() - t0
        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            set_state_dict(model, optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"], options=_state_dict_options())
        apply_extra_state(extra_file.read_bytes(), extra, record.step)

    # -- state and collectives ----------------------------------------------------------------

    @staticmethod
    def _state_dict(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if optimizer is None:
            return {"model": get_model_state_dict(model)}
        model_sd, optim_sd = get_state_dict(model, optimizer, options=_state_dict_options())
        return {"model": model_sd, "optim": optim_sd}

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("CheckpointManager is closed")


def _state_dict_options() -> Any:
    """Optimizer state flattened to one key per parameter (`state.<fqn>.exp_avg`,
    `param_groups.<fqn>.lr`): with pipeline parallelism each rank holds other parameters, and
    unflattened `param_groups` of different ranks would collide under one DCP key (one rank's
    list wins, the others' learning rates are lost). torchtitan saves the same way."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def default_io_threads() -> int:
    """CPU cores per rank on this node (torchrun's LOCAL_WORLD_SIZE), clamped to 1..4."""
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(4, (os.cpu_count() or 1) // local_ranks))


def _merge(final: SaveResult, pending: SaveResult) -> SaveResult:
    """The background result with the foreground timings of the call that started it."""
    return replace(final, blocking_s=pending.blocking_s, waited_s=pending.waited_s,
                   staging_s=pending.staging_s or final.staging_s, previous=pending.previous)
