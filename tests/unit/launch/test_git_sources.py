"""`spec.source.git` on the local launcher: the pinned commit of a real (local, bare) repository,
checked out once per commit into the cache, and what cannot be had refused with git's words."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trainyard.config.spec import GitSource
from trainyard.plugins.launch.sources import SourceUnavailable, checkout


def bare_repo(tmp_path: Path) -> tuple[Path, list[str]]:
    """A bare repository with two commits of `train.py`; (its path, [first, second] commits)."""
    work, bare = tmp_path / "work", tmp_path / "code.git"
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    commits = []
    for version in ("v1", "v2"):
        (work / "train.py").write_text(f"print('{version}')\n")
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", version], check=True)
        commits.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                                      check=True).stdout.strip())
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return bare, commits


def test_the_pinned_commit_is_checked_out_once_per_commit(tmp_path: Path) -> None:
    bare, (first, second) = bare_repo(tmp_path)
    cache = tmp_path / "sources"
    old = checkout(GitSource(repo=str(bare), commit=first), cache)
    assert old == cache / first and (old / "train.py").read_text() == "print('v1')\n"  # not the branch's head
    (old / "marker").write_text("kept")
    assert checkout(GitSource(repo=str(bare), commit=first[:10]), cache / "short").name == first[:10]
    assert checkout(GitSource(repo=str(bare), commit=first), cache) == old and (old / "marker").exists()  # cached
    assert (checkout(GitSource(repo=str(bare), commit=second), cache) / "train.py").read_text() == "print('v2')\n"
    assert sorted(p.name for p in cache.iterdir()) == sorted([first, second, "short"])  # no scratch left


@pytest.mark.parametrize(("commit", "message"), [
    (None, "is not a commit: pin one"),
    ("main", "is not a commit: pin one"),
    ("0" * 40, "git checkout: fatal: reference is not a tree"),
])
def test_what_cannot_be_had_is_refused_saying_why(tmp_path: Path, commit: str | None, message: str) -> None:
    bare, _ = bare_repo(tmp_path)
    with pytest.raises(SourceUnavailable, match=message):
        checkout(GitSource(repo=str(bare), commit=commit), tmp_path / "sources")
    assert not list((tmp_path / "sources").glob(".*"))  # no half-made checkout left
