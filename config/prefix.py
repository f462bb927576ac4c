"""A job's area, by path structure: the pure rules behind "a job reads and writes only its own
prefix" (DESIGN §6).

A job's area is exactly `<object store>/jobs/<job>/` — or, when the spec names one, its own
`checkpoint.storage` folder (whose last segment is the job's name). A URI is inside the area
when it has the same scheme and bucket and its path segments *start with* the area's segments;
whether the job's name appears somewhere in the path says nothing (`jobs/other/checkpoints/<job>`
is the other job's area). `.` and `..` segments (also percent-encoded) are refused outright.

Lives in `config/` because the spec's rules (`config/rules.py`, which may not import engines)
and the checkpoint engine (`plugins/checkpoint/uris.py`, which resolves every read, write,
resume point and export through it) need the same rule. Pure string work: no store, no I/O
beyond reading the working directory for a relative path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from trainyard.plugins.errors import FatalError  # a leaf module with no imports, not an engine

SCHEMES = ("file", "s3")
AREA_FOLDERS = ("jobs", "runs")
"""Segments with a meaning in the layout: `checkpoint.storage` may not nest under them (except
`…/jobs/<job>`, the default area itself), so no storage folder lies inside another job's area
or inside a run folder."""
MAX_URI_CHARS = 4096


@dataclass(frozen=True)
class Location:
    """A URI split for comparison: scheme (`file` for plain paths), bucket, path segments."""

    scheme: str
    bucket: str
    segments: tuple[str, ...]

    def uri(self, depth: int | None = None) -> str:
        """The URI of this location's first `depth` segments (all by default)."""
        path = "/".join(self.segments[:depth])
        return f"s3://{self.bucket}/{path}" if self.scheme == "s3" else f"file:///{path}"

    def startswith(self, other: Location) -> bool:
        return (self.scheme, self.bucket) == (other.scheme, other.bucket) and \
            self.segments[:len(other.segments)] == other.segments


class UnsafePath(FatalError, ValueError):
    """A URI that cannot be compared structurally (`..`, NUL, unknown scheme, too long)."""


def check_job_name(job: str) -> str:
    """A job name is one path segment of the area; refuse anything that could escape it."""
    if not isinstance(job, str) or not job or "/" in job or "\\" in job or "\x00" in job \
            or job in (".", "..") or job != job.strip():
        raise ValueError(f"job name {str(job)[:80]!r} cannot be a path segment")
    return job


def locate(uri: str) -> Location:
    """Split `file://`, `s3://` or a plain path; raise `UnsafePath` for what cannot be trusted."""
    if not isinstance(uri, str) or not uri.strip():
        raise UnsafePath(f"expected a URI or path, got {str(uri)[:80]!r}")
    if len(uri) > MAX_URI_CHARS:
        raise UnsafePath(f"URI of {len(uri)} characters (limit {MAX_URI_CHARS}): {uri[:80]!r}…")
    if "\x00" in uri:
        raise UnsafePath(f"URI {uri[:200]!r} contains a NUL character")
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        if not parts.netloc:
            raise UnsafePath(f"S3 URI {uri!r} has no bucket; expected s3://bucket/prefix")
        bucket, path = parts.netloc, parts.path
    elif scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise UnsafePath(f"file URI {uri!r} names host {parts.netloc!r}; only local paths work")
        bucket, path = "", unquote(parts.path)
    elif scheme and len(scheme) > 1:
        raise UnsafePath(f"URI {uri!r} uses scheme {scheme!r}; only s3:// and file:// (or a path)")
    else:
        scheme, bucket, path = "file", "", os.path.abspath(uri) if not uri.startswith("/") else uri
    segments = tuple(s for s in path.split("/") if s)
    for s in segments:
        if unquote(s) in (".", "..") or s in (".", ".."):
            raise UnsafePath(f"URI {uri!r} contains a '.' or '..' segment")
    return Location(scheme, bucket, segments)


def default_area(object_store: str, job: str) -> str:
    """`<object store>/jobs/<job>`: everything of one job, all its training runs."""
    return f"{object_store.rstrip('/')}/jobs/{check_job_name(job)}"


def area_problem(uri: str, area: str) -> str | None:
    """Why `uri` is not inside `area` (by path structure), or None when it is."""
    try:
        where, home = locate(uri), locate(area)
    except UnsafePath as e:
        return str(e)
    if where.startswith(home):
        return None
    if (where.scheme, where.bucket) != (home.scheme, home.bucket):
        return f"{uri!r} is in another store than the job's area {area!r}"
    return f"{uri!r} is outside the job's area {area!r}"


def storage_problem(storage: str, job: str) -> str | None:
    """Why a spec's `checkpoint.storage` is not the job's own folder, or None.

    It must be a folder named after the job (`s3://checkpoints/<job>`, or the default area
    `<store>/jobs/<job>` spelled out) that does not nest under a `jobs/` or `runs/` segment —
    so it can be neither inside another job's area nor inside some run's folder.
    """
    try:
        loc = locate(storage)
    except UnsafePath as e:
        return str(e)
    if not loc.segments or loc.segments[-1] != job:
        return f"'{storage}' is not a folder named after the job (its last segment must be '{job}')"
    parents = loc.segments[:-1]
    nested = [i for i, s in enumerate(parents) if s in AREA_FOLDERS]
    if not nested or (nested == [len(parents) - 1] and parents[-1] == "jobs"):
        return None
    at = nested[0]
    inside = "/".join(parents[at:at + 2])
    whose = "a job's area" if parents[at] == "jobs" else "a run's folder"
    return f"'{storage}' lies inside '{inside}/', i.e. inside {whose}"


def identity_of(root_uri: str) -> tuple[str, str | None] | None:
    """`(job, run)` a checkpoint root belongs to by its structure, or None when it has none.

    `…/jobs/<job>/runs/<run>/checkpoints` (the default layout), `…/<job>/runs/<run>` (a spec's
    own storage) and `…/jobs/<job>/checkpoints` (a root without runs: run None).
    """
    try:
        s = locate(root_uri).segments
    except UnsafePath:
        return None
    if len(s) >= 5 and s[-5] == "jobs" and s[-3] == "runs" and s[-1] == "checkpoints":
        return s[-4], s[-2]
    if len(s) >= 3 and s[-2] == "runs" and s[-1] != "checkpoints":
        return s[-3], s[-1]
    if len(s) >= 3 and s[-3] == "jobs" and s[-1] == "checkpoints":
        return s[-2], None
    return None


def claimed_area(uri: str, job: str) -> str | None:
    """The area of `job` that `uri` lies in by its own structure, for a reader handed only a
    URI (no object store). With `jobs/` segments: the *last* one must be followed by `job`
    (`…/jobs/<job>/…`; a store may itself sit under a folder called `jobs`), and no earlier
    one may be shaped like an area (`jobs/<x>/runs`, `jobs/<x>/checkpoints`), which would put
    the URI inside `x`'s area. Without: a storage folder `…/<job>/runs/<run>…` with no `runs/`
    above it. None when the URI claims no area of `job` (`jobs/other/checkpoints/<job>` is
    other's). Raises `UnsafePath` for what cannot be compared."""
    check_job_name(job)
    loc = locate(uri)
    s = loc.segments
    marks = [i for i, segment in enumerate(s) if segment == "jobs"]
    if marks:
        last = marks[-1]
        if last + 1 >= len(s) or s[last + 1] != job:
            return None
        if any(i + 2 < len(s) and s[i + 2] in ("runs", "checkpoints") for i in marks[:-1]):
            return None
        return loc.uri(last + 2)
    if "runs" in s:
        i = s.index("runs")
        return loc.uri(i) if i >= 1 and s[i - 1] == job else None
    return None
