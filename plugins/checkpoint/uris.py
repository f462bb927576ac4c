"""Where a job's checkpoints live, and the rule that a job stays inside its own prefix.

A worker writes and reads only under a URI that has its job name as a path segment (the
default root is `<object store>/jobs/<job>/checkpoints`). That keeps one job from restoring,
overwriting or deleting another's checkpoints, and — since DCP's `.metadata` is a pickle —
from reading a pickle that some other job could have written. No torch import here.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from config.runs import check_run_id
from plugins.checkpoint.errors import OutsideJobPrefixError
from plugins.checkpoint.manifest import MANIFEST_NAME, parse_step_dir
from plugins.storage.errors import UnsafeKeyError
from plugins.storage.store import split_uri


def uri_segments(uri: str) -> list[str]:
    """The path segments of a `file://`, `s3://` URI or plain path (bucket excluded)."""
    parts = urlsplit(uri)
    path = unquote(parts.path) if parts.scheme in ("file", "s3") else uri
    return [s for s in path.split("/") if s]


def check_job_name(job: str) -> str:
    if not job or "/" in job or job in (".", "..") or job != job.strip():
        raise ValueError(f"job name {job!r} cannot be a path segment")
    return job


def require_job_prefix(uri: str, job: str) -> str:
    """Return `uri` if it lies inside `job`'s own prefix, else raise `OutsideJobPrefixError`."""
    check_job_name(job)
    segments = uri_segments(uri)
    if ".." in segments or "." in segments:
        raise UnsafeKeyError(f"URI {uri!r} contains '.' or '..' segments")
    if job not in segments:
        raise OutsideJobPrefixError(
            f"URI {uri!r} is outside job {job!r}'s own prefix: none of its path segments is "
            f"{job!r} (expected something like <store>/jobs/{job}/checkpoints)")
    return uri


def job_area_uri(object_store_uri: str, job: str) -> str:
    """`<object store>/jobs/<job>`: everything of one job, all its training runs."""
    return f"{object_store_uri.rstrip('/')}/jobs/{check_job_name(job)}"


def checkpoint_root(object_store_uri: str, job: str, run: str, *, storage: str = "") -> str:
    """Where one training run of `job` keeps its checkpoints — the one definition (DESIGN §4, §6).

    `<object store>/jobs/<job>/runs/<run>/checkpoints`; when the spec names its own
    `checkpoint.storage` (the job's folder elsewhere), `<storage>/runs/<run>`. Keyed by run so a
    second trigger of the same job starts fresh instead of resuming the first run's final step.
    """
    check_run_id(run)
    if storage:
        return f"{storage.rstrip('/')}/runs/{run}"
    return f"{job_area_uri(object_store_uri, job)}/runs/{run}/checkpoints"


def runs_uri(object_store_uri: str, job: str, *, storage: str = "") -> str:
    """The folder that holds one sub-folder per training run of `job`."""
    return f"{storage.rstrip('/')}/runs" if storage else f"{job_area_uri(object_store_uri, job)}/runs"


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
