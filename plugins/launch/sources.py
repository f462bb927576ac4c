"""A job's training code from git (`spec.source.git`) on the local launcher: the pinned commit,
checked out once into a cache keyed by the commit (`<home>/sources/<commit>/`), and run from
there — as the Kubernetes pods' init container fetches it into their source volume. A branch is
never followed: every attempt of a run, and every rank, runs the same code.

The checkout is made in a temporary folder beside the cache entry and renamed into place when
complete, so a crash mid-clone leaves nothing a later launch would take for the code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.plugins.errors import FatalError

if TYPE_CHECKING:
    from trainyard.config.spec import GitSource, Source

COMMIT = re.compile(r"^[0-9a-f]{7,64}$")
"""A commit as the spec pins it: hexadecimal, abbreviated or whole (SHA-1 or SHA-256)."""


class SourceUnavailable(FatalError, ValueError):
    """The pinned commit cannot be had (an unknown commit, an unreachable repository): the launch
    is refused with git's own words, and the run ends `launch_failed` — retrying the same attempt
    fetches the same nothing."""


def source_root(source: Source, cache: Path, default: Path, *, endpoint_url: str | None = None) -> Path:
    """The folder the job's code runs from: the pinned git commit, the `source.path` folder or
    object-store prefix, else `default` (the launcher's own source folder)."""
    if source.git is not None:
        return checkout(source.git, cache)
    if source.path is None:
        return default
    if source.path.startswith("s3://"):
        return fetch_prefix(source.path, cache, endpoint_url=endpoint_url)
    folder = Path(source.path.removeprefix("file://"))
    if not folder.is_dir():
        raise SourceUnavailable(f"spec.source.path {source.path} is not a folder on this machine")
    return folder


def prefix_digest(uri: str, *, endpoint_url: str | None = None) -> tuple[str, list[tuple[str, int, str]]]:
    """(digest, listing) of the code under an object-store prefix: SHA-256 over its keys, sizes
    and ETags — what names its content without downloading it (the lineage records it)."""
    import hashlib
    import json

    from trainyard.plugins.storage.store import open_store

    listing = sorted((o.key, o.size, o.etag or "") for o in open_store(uri, endpoint_url=endpoint_url).list())
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest(), listing


def fetch_prefix(uri: str, cache: Path, *, endpoint_url: str | None = None) -> Path:
    """The code under an object-store prefix, downloaded once per content into
    `cache/prefix-<digest>/` (a changed file is a new folder: every rank and every attempt of a
    launch runs the same bytes), assembled beside it and renamed into place when complete."""
    from trainyard.plugins.storage.store import open_store

    try:
        digest, listing = prefix_digest(uri, endpoint_url=endpoint_url)
    except Exception as e:
        raise SourceUnavailable(f"spec.source.path {uri} cannot be listed: {e}") from e
    if not listing:
        raise SourceUnavailable(f"spec.source.path {uri} holds no files")
    target = cache / f"prefix-{digest[:20]}"
    if target.is_dir():
        return target
    store = open_store(uri, endpoint_url=endpoint_url)
    scratch = cache / f".prefix-{digest[:20]}.{os.getpid()}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        for key, _, _ in listing:  # keys are checked by the store: no '..', no absolute paths
            dest = scratch / key
            dest.parent.mkdir(parents=True, exist_ok=True)
            store.get_file(key, dest)
        try:
            scratch.rename(target)
        except OSError:  # another launch fetched the same content first
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def checkout(git: GitSource, cache: Path) -> Path:
    """The repository at `git.commit`, under `cache`; cloned the first time only."""
    commit = (git.commit or "").lower()
    if not COMMIT.match(commit):
        raise SourceUnavailable(f"spec.source.git.commit {git.commit!r} is not a commit: pin one (a branch moves "
                                "between attempts and ranks)")
    target = cache / commit
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    scratch = cache / f".{commit}.{os.getpid()}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        _git("clone", "--quiet", "--no-checkout", git.repo, str(scratch))
        _git("-C", str(scratch), "checkout", "--quiet", "--detach", commit)
        head = _git("-C", str(scratch), "rev-parse", "HEAD")
        if not head.startswith(commit):
            raise SourceUnavailable(f"{git.repo} at {commit} checked out {head}")
        try:
            scratch.rename(target)
        except OSError:  # another launch finished the same commit first: theirs is as good
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _git(*args: str) -> str:
    command = args[2] if args[0] == "-C" else args[0]  # what failed, without the scratch folder
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=600, check=True,
                             env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except subprocess.CalledProcessError as e:
        raise SourceUnavailable(f"git {command}: {(e.stderr or e.stdout).strip()[-500:]}") from e
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SourceUnavailable(f"git {command}: {e}") from e
    return out.stdout.strip()
