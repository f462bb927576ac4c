"""`spec.source.path`: a folder on this machine, or an object-store prefix fetched once per
content — the ranks' working folder, named in the lineage by its content, refused on Kubernetes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from trainyard.config.cluster import load_cluster
from trainyard.config.spec import Source, TrainingJob
from trainyard.plugins.attempt.launchers import entrypoint_problems
from trainyard.plugins.launch.sources import (
    SourceUnavailable,
    fetch_prefix,
    prefix_digest,
    source_root,
)
from trainyard.plugins.storage.store import open_store


def job(source: dict[str, object]) -> TrainingJob:
    return TrainingJob.model_validate({
        "apiVersion": "training.platform/v1", "kind": "TrainingJob", "metadata": {"name": "own", "team": "demo"},
        "spec": {"source": source, "hardware": {"gpuType": "cpu", "gpuCount": 1}}})


def test_a_path_is_absolute_or_a_uri_and_never_beside_git() -> None:
    with pytest.raises(ValidationError, match="not an absolute folder"):
        Source(path="code/", entrypoint="train.py")
    with pytest.raises(ValidationError, match="not both"):
        Source.model_validate({"path": "/code", "git": {"repo": "x", "commit": "abc1234"}, "entrypoint": "t.py"})


def test_a_local_folder_is_the_root_and_its_entrypoint_is_checked(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    src = Source(path=f"file://{tmp_path}", entrypoint="train.py")
    assert source_root(src, tmp_path / "cache", Path("/nowhere")) == tmp_path
    local = load_cluster("local")
    assert entrypoint_problems(job({"path": str(tmp_path), "entrypoint": "train.py"}), local) == []
    (problem,) = entrypoint_problems(job({"path": str(tmp_path), "entrypoint": "trian.py"}), local)
    assert problem.path == "spec.source.entrypoint" and "trian.py" in problem.message
    with pytest.raises(SourceUnavailable, match="not a folder"):
        source_root(Source(path=str(tmp_path / "gone"), entrypoint="t.py"), tmp_path / "cache", Path("/"))


def test_a_prefix_is_fetched_once_per_content(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    store.put_bytes("code/train.py", b"import helpers\n")
    store.put_bytes("code/helpers/__init__.py", b"")
    uri = (tmp_path / "store" / "code").as_uri()
    first = fetch_prefix(uri, tmp_path / "cache")
    assert (first / "train.py").read_bytes() == b"import helpers\n" and (first / "helpers" / "__init__.py").is_file()
    assert fetch_prefix(uri, tmp_path / "cache") == first
    before = prefix_digest(uri)[0]
    store.put_bytes("code/train.py", b"import helpers  # edited\n")
    second = fetch_prefix(uri, tmp_path / "cache")
    assert second != first and prefix_digest(uri)[0] != before
    assert (second / "train.py").read_bytes().endswith(b"# edited\n")
    with pytest.raises(SourceUnavailable, match="holds no files"):
        fetch_prefix((tmp_path / "store" / "empty").as_uri(), tmp_path / "cache")


def test_a_path_is_refused_on_a_cluster_of_pods() -> None:
    from trainyard.config.cluster import CLUSTERS_DIR

    kube = next((load_cluster(p.stem) for p in sorted(CLUSTERS_DIR.glob("*.yaml"))
                 if load_cluster(p.stem).spec.mode != "local"), None)
    if kube is None:
        pytest.fail("no Kubernetes cluster file under config/clusters")
    (problem,) = entrypoint_problems(job({"path": "/code", "entrypoint": "train.py"}), kube)
    assert problem.path == "spec.source.path" and "local launcher only" in problem.message
