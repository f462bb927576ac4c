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
    from trainyard.config.spec import GitSource

COMMIT = re.compile(r"^[0-9a-f]{7,64}$")
"""A commit as the spec pins it: hexadecimal, abbreviated or whole (SHA-1 or SHA-256)."""


class SourceUnavailable(FatalError, ValueError):
    """The pinned commit cannot be had (an unknown commit, an unreachable repository): the launch
    is refused with git's own words, and the run ends `launch_failed` — retrying the same attempt
    fetches the same nothing."""


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
