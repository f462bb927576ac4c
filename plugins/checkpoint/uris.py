"""Where a job's checkpoints live, and the rule that a job stays inside its own area.

A job's area is exactly `<object store>/jobs/<job>/` (or the spec's own `checkpoint.storage`
folder); a run's checkpoints are `<area>/runs/<run>/checkpoints` (`<storage>/runs/<run>`).
`resolve_in_area` is the one check every read, write, resume point, export and
`--resume-from` goes through, before anything starts: it compares path *structure*
(`config/prefix.py`), so `jobs/other/checkpoints/<job>/…` is the other job's, whatever its
segments spell. That keeps one job from restoring, overwriting or deleting another's
checkpoints, and — since DCP's `.metadata` is a pickle — from reading a pickle some other job
could have written. The only way to read another job's checkpoint is the spec's explicit,
read-only `checkpoint.initFrom` (`allowed=`). No torch import here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainyard.config.prefix import (
    Location,
    UnsafePath,
    check_job_name,
    claimed_area,
    default_area,
    identity_of,
    locate,
    storage_problem,
)
from trainyard.config.runs import check_run_id
from trainyard.plugins.checkpoint.errors import OutsideJobPrefixError
from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME, parse_step_dir
from trainyard.plugins.storage.errors import UnsafeKeyError
from trainyard.plugins.storage.store import split_uri

if TYPE_CHECKING:
    from trainyard.config.spec import TrainingJob

__all__ = ["area_for", "check_job_name", "checkpoint_root", "identity_of", "job_area_uri",
           "require_job_prefix", "resolve_for_job", "resolve_in_area", "runs_uri", "split_manifest_uri"]


def job_area_uri(object_store_uri: str, job: str, *, storage: str = "") -> str:
    """The job's area: `<object store>/jobs/<job>`, or its own `checkpoint.storage` folder."""
    check_job_name(job)
    if storage:
        problem = storage_problem(storage, job)
        if problem:
            raise OutsideJobPrefixError(f"checkpoint.storage {problem}")
        return storage.rstrip("/")
    return default_area(object_store_uri, job)


def area_for(job: TrainingJob, object_store_uri: str) -> str:
    """The area of a spec's job: its `checkpoint.storage` folder, else `<store>/jobs/<job>`."""
    return job_area_uri(object_store_uri, job.name, storage=job.spec.checkpoint.storage or "")


def resolve_for_job(uri: str, job: TrainingJob, object_store_uri: str) -> str:
    """`resolve_in_area` for a spec: its area, plus its read-only `checkpoint.initFrom`."""
    init = job.spec.checkpoint.init_from or ""
    return resolve_in_area(uri, area_for(job, object_store_uri), allowed=(init,) if init else ())


def resolve_in_area(uri: str, area: str, *, allowed: tuple[str, ...] = ()) -> str:
    """Return `uri` (trailing '/' dropped) when it lies inside `area` by path structure — or is
    one of `allowed` (the spec's read-only `initFrom`) — else raise `OutsideJobPrefixError`
    (`UnsafeKeyError` for `.`/`..` segments). The one prefix check of the checkpoint engine."""
    try:
        where, home = locate(uri), locate(area)
    except UnsafePath as e:
        raise UnsafeKeyError(str(e)) from e
    if where.startswith(home):
        return uri.rstrip("/")
    for extra in allowed:
        if extra and _same_place(extra, where):
            return uri.rstrip("/")
    raise OutsideJobPrefixError(
        f"{uri!r} is outside the job's area {area!r} (a job reads and writes only "
        f"<store>/jobs/<job>/…; to start from another job's checkpoint, name it in the spec's "
        f"checkpoint.initFrom)")


def _same_place(uri: str, where: Location) -> bool:
    try:
        return locate(uri) == where
    except UnsafePath:
        return False


def require_job_prefix(uri: str, job: str, *, area: str | None = None,
                       allowed: tuple[str, ...] = ()) -> str:
    """`resolve_in_area` against `area`; without one (a reader handed only a URI), against the
    area `uri` claims by its own structure, which must be `job`'s (`trainyard.config.prefix.claimed_area`:
    `<…>/jobs/<job>/…` at the last `jobs/` segment and inside no other job's area, or
    `<…>/<job>/runs/…`). Callers that know the store pass `area` (`area_for`)."""
    check_job_name(job)
    if area is None:
        try:
            claimed = claimed_area(uri, job)
        except UnsafePath as e:
            raise UnsafeKeyError(str(e)) from e
        if claimed is None:
            raise OutsideJobPrefixError(
                f"URI {uri!r} is outside job {job!r}'s own area (expected <store>/jobs/{job}/…)")
        area = claimed
    return resolve_in_area(uri, area, allowed=allowed)


def checkpoint_root(object_store_uri: str, job: str, run: str, *, storage: str = "") -> str:
    """Where one training run of `job` keeps its checkpoints — the one definition (DESIGN §4, §6).

    `<object store>/jobs/<job>/runs/<run>/checkpoints`; when the spec names its own
    `checkpoint.storage` (the job's folder elsewhere), `<storage>/runs/<run>`. Keyed by run so a
    second trigger of the same job starts fresh instead of resuming the first run's final step.
    """
    check_run_id(run)
    area = job_area_uri(object_store_uri, job, storage=storage)
    return f"{area}/runs/{run}" if storage else f"{area}/runs/{run}/checkpoints"


def runs_uri(object_store_uri: str, job: str, *, storage: str = "") -> str:
    """The folder that holds one sub-folder per training run of `job`."""
    return f"{job_area_uri(object_store_uri, job, storage=storage)}/runs"


def split_manifest_uri(manifest_uri: str) -> tuple[str, str, int]:
    """`(checkpoint root URI, step folder name, step)` of `…/step-NNNNNNNN/MANIFEST.json`."""
    folder_uri, name = split_uri(manifest_uri)
    if name != MANIFEST_NAME:
        raise ValueError(f"{manifest_uri!r} does not name a {MANIFEST_NAME}")
    root_uri, folder = split_uri(folder_uri)
    step = parse_step_dir(folder)
    if step is None:
        raise ValueError(f"{manifest_uri!r}: the manifest's folder {folder!r} is not step-NNNNNNNN")
    return root_uri, folder, step
