"""Manifests are untrusted JSON: paths stay inside their folder, nothing else parses."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from tests.unit.checkpoint.fabricate import make_checkpoint
from trainyard.plugins.checkpoint.catalog import list_checkpoints, scan, verify
from trainyard.plugins.checkpoint.manifest import (
    MANIFEST_NAME,
    CheckpointManifest,
    ManifestFile,
    parse_step_dir,
    step_dir,
)
from trainyard.plugins.checkpoint.uris import (
    checkpoint_root,
    require_job_prefix,
    split_manifest_uri,
)
from trainyard.plugins.storage.store import ObjectStore

SHA = "0" * 64


def _manifest(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "job": "demo", "step": 7, "created_at": "2026-01-01T00:00:00Z", "world_size": 2,
        "files": [{"path": "__0_0.distcp", "size": 3, "sha256": SHA}],
    }
    base.update(changes)
    return base


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "a/../../b", "a\\..\\b",
                                  "", "./x", MANIFEST_NAME])
def test_unsafe_file_paths_reject_the_whole_manifest(path: str) -> None:
    with pytest.raises(ValidationError):
        CheckpointManifest.model_validate(_manifest(files=[{"path": path, "size": 1, "sha256": SHA}]))


def test_unsafe_extra_state_paths_are_rejected() -> None:
    with pytest.raises(ValidationError, match="unsafe path"):
        CheckpointManifest.model_validate(_manifest(extra_state=["../../etc/passwd"]))
    with pytest.raises(ValidationError, match="does not list"):
        CheckpointManifest.model_validate(_manifest(extra_state=["extra/rank-00000.json"]))


def test_duplicates_unknown_fields_and_bad_hashes_are_rejected() -> None:
    f = {"path": "a", "size": 1, "sha256": SHA}
    with pytest.raises(ValidationError, match="more than once"):
        CheckpointManifest.model_validate(_manifest(files=[f, f]))
    with pytest.raises(ValidationError):
        CheckpointManifest.model_validate(_manifest(surprise=1))
    with pytest.raises(ValidationError):
        CheckpointManifest.model_validate(_manifest(files=[{**f, "sha256": "abc"}]))
    with pytest.raises(ValidationError):
        CheckpointManifest.model_validate(_manifest(files=[{**f, "compression": "lz4"}]))
    with pytest.raises(ValidationError):
        CheckpointManifest.model_validate(_manifest(created_at="2026-01-01T00:00:00"))  # naive


def test_each_file_names_its_algorithm_by_exactly_one_digest() -> None:
    """New manifests (format 2) record BLAKE3; format-1 manifests, written before, SHA-256 only
    — they still parse, and each entry says which algorithm verifies it."""
    new = CheckpointManifest.model_validate(_manifest(
        format_version=2, files=[{"path": "a", "size": 1, "blake3": "1" * 64},
                                 {"path": "b", "size": 1, "sha256": SHA}]))
    assert [(f.algorithm, f.digest) for f in new.files] == [("blake3", "1" * 64), ("sha256", SHA)]
    old = CheckpointManifest.model_validate(_manifest(format_version=1))
    assert old.files[0].algorithm == "sha256"
    assert CheckpointManifest(job="demo", step=1, created_at=datetime(2026, 1, 1, tzinfo=UTC),
                              world_size=1, files=[]).format_version == 2
    for files in ([{"path": "a", "size": 1}],  # neither
                  [{"path": "a", "size": 1, "sha256": SHA, "blake3": "1" * 64}],  # both
                  [{"path": "a", "size": 1, "blake3": "xyz"}]):  # not 64 hex digits
        with pytest.raises(ValidationError):
            CheckpointManifest.model_validate(_manifest(files=files))
    with pytest.raises(ValidationError, match="format-1 manifest lists SHA-256"):
        CheckpointManifest.model_validate(_manifest(
            format_version=1, files=[{"path": "a", "size": 1, "blake3": "1" * 64}]))
    entry = ManifestFile.hashed("blake3", "2" * 64, path="a", size=5)
    assert entry.mismatch(5, "2" * 64) is None
    assert entry.mismatch(4, "2" * 64) == "size 4 != manifest 5"
    assert entry.mismatch(5, "3" * 64) == "BLAKE3 333333333333… != manifest 222222222222… (corrupt)"


def test_an_unknown_digest_algorithm_is_a_clear_error(store: ObjectStore) -> None:
    """A file entry whose digest is under a name this version does not verify (a newer
    writer's algorithm) is refused by that name, and the catalog reports the checkpoint invalid
    with that reason and restores the one before: nothing is loaded unverified."""
    entry = {"path": "__0_0.distcp", "size": 3, "xxh3": "1" * 64}
    with pytest.raises(ValidationError, match=r"unknown digest algorithm 'xxh3'; this version "
                                              r"verifies sha256 or blake3"):
        CheckpointManifest.model_validate(_manifest(format_version=2, files=[entry]))
    with pytest.raises(ValidationError, match="exactly one digest"):  # no digest at all: not "unknown"
        CheckpointManifest.model_validate(_manifest(files=[{"path": "a", "size": 1}]))
    make_checkpoint(store, 1)
    store.put_bytes(f"{step_dir(2)}/{MANIFEST_NAME}",
                    json.dumps(_manifest(step=2, format_version=2, files=[entry])).encode())
    found = scan(store)
    assert "unknown digest algorithm 'xxh3'" in found.invalid["step-00000002"]
    assert [r.step for r in list_checkpoints(store)] == [1]


def test_json_round_trip_keeps_non_finite_metrics() -> None:
    m = CheckpointManifest(job="demo", step=3, created_at=datetime(2026, 1, 1, tzinfo=UTC),
                           world_size=1, metrics={"loss": math.inf, "eval": 0.5},
                           files=[ManifestFile(path="x", size=1, sha256=SHA)],
                           plan={"tp": 2, "dp": 4})
    data = m.to_json_bytes()
    json.loads(data)  # plain JSON (Python's json accepts Infinity)
    back = CheckpointManifest.from_json_bytes(data)
    assert back == m
    assert back.state_bytes == 1


def test_manifest_size_is_capped() -> None:
    with pytest.raises(ValueError, match="limit"):
        CheckpointManifest.from_json_bytes(b" " * (64 << 20) + b"{}")


def test_catalog_refuses_a_manifest_with_a_traversal_path(store: ObjectStore) -> None:
    """A hand-written manifest pointing at ../../etc/passwd: the catalog reports it invalid,
    never lists it, never opens the path."""
    make_checkpoint(store, 1)
    evil = _manifest(step=2, files=[{"path": "../../etc/passwd", "size": 10, "sha256": SHA}])
    store.put_bytes(f"{step_dir(2)}/{MANIFEST_NAME}", json.dumps(evil).encode())
    absolute = _manifest(step=3, files=[{"path": "/etc/passwd", "size": 10, "sha256": SHA}])
    store.put_bytes(f"{step_dir(3)}/{MANIFEST_NAME}", json.dumps(absolute).encode())
    found = scan(store)
    assert [r.step for r in found.committed] == [1]
    assert set(found.invalid) == {"step-00000002", "step-00000003"}
    assert "unsafe path" in found.invalid["step-00000002"]
    assert [r.step for r in list_checkpoints(store)] == [1]
    assert not verify(store, 2).ok


def test_a_manifest_must_match_its_folder(store: ObjectStore) -> None:
    m = make_checkpoint(store, 5, commit=False)
    store.put_bytes(f"{step_dir(6)}/{MANIFEST_NAME}", m.to_json_bytes())  # says step 5
    assert "step-00000006" in scan(store).invalid


def test_step_dirs_sort_lexically_as_numbers_up_to_eight_digits(store: ObjectStore) -> None:
    names = [step_dir(s) for s in (1, 20, 300, 99_999_999)]
    assert sorted(names) == names
    assert [parse_step_dir(n) for n in [*names, "step-123456789"]] == [1, 20, 300, 99_999_999,
                                                                      123_456_789]
    for step in (123_456_789, 99_999_999, 5):  # past 8 digits the catalog still sorts by number
        make_checkpoint(store, step)
    assert [r.step for r in list_checkpoints(store)] == [5, 99_999_999, 123_456_789]
    assert parse_step_dir("step-12") is None
    assert parse_step_dir("step-00000001.tmp") is None
    with pytest.raises(ValueError):
        step_dir(-1)


def test_job_prefix_rule() -> None:
    root = checkpoint_root("s3://bucket/trainyard", "llama", "20261130t120000-abc123")
    assert root == "s3://bucket/trainyard/jobs/llama/runs/20261130t120000-abc123/checkpoints"
    assert checkpoint_root("s3://b/t", "llama", "r-1", storage="s3://own/llama/") == "s3://own/llama/runs/r-1"
    for bad in ("", "..", "a/b", "UPPER"):
        with pytest.raises(ValueError, match="run id"):
            checkpoint_root("s3://b/t", "llama", bad)
    assert require_job_prefix(root, "llama") == root
    assert require_job_prefix("file:///data/jobs/llama/checkpoints", "llama")
    for uri in ["s3://bucket/trainyard/jobs/other/checkpoints", "s3://llama/checkpoints",
                "file:///data/jobs/llamas/checkpoints", "/data/jobs/llama-2/ckpt"]:
        with pytest.raises(ValueError, match="outside job 'llama'"):
            require_job_prefix(uri, "llama")
    with pytest.raises(ValueError, match=r"'\.\.'"):
        require_job_prefix("file:///data/jobs/llama/../other/checkpoints", "llama")
    with pytest.raises(ValueError):
        require_job_prefix("file:///x/a/b", "a/b")


def test_split_manifest_uri() -> None:
    assert split_manifest_uri("s3://b/jobs/j/checkpoints/step-00000010/MANIFEST.json") == (
        "s3://b/jobs/j/checkpoints", "step-00000010", 10)
    with pytest.raises(ValueError):
        split_manifest_uri("s3://b/jobs/j/checkpoints/step-00000010/other.json")
    with pytest.raises(ValueError):
        split_manifest_uri("s3://b/jobs/j/checkpoints/latest/MANIFEST.json")
