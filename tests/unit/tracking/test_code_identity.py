"""Lineage names the training code that ran — the user's, never Trainyard's by default: a pinned
`source.git` commit, the commit of the git work tree holding the entrypoint, or else a digest of
the entrypoint folder's Python files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from trainyard.config.spec import TrainingJob
from trainyard.plugins.tracking.runs import _code_identity, source_digest

DEMO = Path(__file__).resolve().parents[3] / "config" / "jobs" / "demo-tiny-lm.yaml"


def job(**source: object) -> TrainingJob:
    doc = yaml.safe_load(DEMO.read_text())
    doc["spec"]["source"] = source
    return TrainingJob.model_validate(doc)


def test_a_pinned_git_source_is_its_commit() -> None:
    pinned = job(entrypoint="train.py", git={"repo": "https://example.invalid/t.git", "commit": "a" * 40})
    assert _code_identity(pinned) == ("a" * 40, None)


def test_a_folder_in_a_git_work_tree_is_that_commit_and_one_outside_git_is_its_digest(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "train.py").write_text("print('hi')\n")
    commit, digest = _code_identity(job(entrypoint=str(plain / "train.py")))
    assert commit is None and digest == source_digest(plain) and len(digest) == 64
    (plain / "utils.py").write_text("X = 1\n")
    assert source_digest(plain) != digest  # any code change is another digest

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print('hi')\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "code"], check=True)
    head = subprocess.run([*git[:3], "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert _code_identity(job(entrypoint=str(repo / "train.py"))) == (head, None)
