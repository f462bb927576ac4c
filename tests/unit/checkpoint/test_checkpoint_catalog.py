"""The catalog: only committed checkpoints exist; the newest one that verifies wins."""

from __future__ import annotations

import logging

import pytest

from tests.unit.checkpoint.fabricate import make_checkpoint
from trainyard.plugins.checkpoint.catalog import (
    delete_checkpoint,
    latest_valid,
    list_checkpoints,
    scan,
    select_latest_valid,
    verify,
)
from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME, step_dir
from trainyard.plugins.storage.store import ObjectStore


def _flip_byte(store: ObjectStore, key: str) -> None:
    data = bytearray(store.get_bytes(key))
    data[len(data) // 2] ^= 0x40
    store.put_bytes(key, bytes(data))


def test_only_committed_checkpoints_are_listed(store: ObjectStore) -> None:
    for step in (10, 20, 30):
        make_checkpoint(store, step)
    make_checkpoint(store, 40, commit=False)  # crashed before its manifest
    store.put_bytes("unrelated/file", b"x")
    assert [r.step for r in list_checkpoints(store)] == [10, 20, 30]
    found = scan(store)
    assert list(found.uncommitted) == ["step-00000040"]
    record = list_checkpoints(store)[-1]
    assert record.manifest_uri == store.key_uri(f"{step_dir(30)}/{MANIFEST_NAME}")
    assert record.folder == "step-00000030"


@pytest.mark.parametrize(("algorithm", "name"), [("blake3", "BLAKE3"), ("sha256", "SHA-256")])
def test_verify_finds_missing_resized_and_corrupt_files(store: ObjectStore, algorithm: str,
                                                        name: str) -> None:
    """Manifests as written now (BLAKE3) and before (format 1, SHA-256) alike."""
    make_checkpoint(store, 1, {"a": b"a" * 1000, "b": b"b" * 1000, "c": b"c" * 1000},
                    algorithm=algorithm)  # type: ignore[arg-type]
    assert verify(store, 1).ok
    assert verify(store, 1).hashed_bytes == 3000
    folder = step_dir(1)
    store.delete(f"{folder}/a")
    store.put_bytes(f"{folder}/b", b"short")
    _flip_byte(store, f"{folder}/c")
    report = verify(store, 1)
    assert not report.ok
    assert report.problems == ("a: missing", "b: size 5 != manifest 1000",
                               report.problems[2])
    assert report.problems[2].startswith(f"c: {name} ") and "(corrupt)" in report.problems[2]
    quick = verify(store, 1, hashes=False)  # sizes only: the flipped byte goes unnoticed
    assert quick.problems == ("a: missing", "b: size 5 != manifest 1000")
    assert "manifest" in verify(store, 99).reason


def test_latest_valid_falls_back_and_logs_why(store: ObjectStore,
                                              caplog: pytest.LogCaptureFixture) -> None:
    for step in (1, 2, 3):
        make_checkpoint(store, step)
    _flip_byte(store, f"{step_dir(3)}/__0_0.distcp")
    store.delete(f"{step_dir(2)}/.metadata")
    with caplog.at_level(logging.WARNING, logger="trainyard.plugins.checkpoint.catalog"):
        selection = select_latest_valid(store)
    assert selection.chosen is not None and selection.chosen.step == 1
    assert [(r.step, rep.reason) for r, rep in selection.rejected] == [
        (3, selection.rejected[0][1].reason), (2, ".metadata: missing")]
    assert "corrupt" in selection.rejected[0][1].reason
    assert "checkpoint step 3 rejected" in caplog.text and "fell back to step 1" in caplog.text
    assert "checkpoint step 2 rejected (.metadata: missing)" in caplog.text


def test_latest_valid_is_none_when_nothing_verifies(store: ObjectStore) -> None:
    assert latest_valid(store) is None
    make_checkpoint(store, 1)
    store.delete(f"{step_dir(1)}/.metadata")
    assert latest_valid(store) is None
    assert latest_valid(store, hashes=False) is None


def test_delete_removes_the_manifest_first(store: ObjectStore) -> None:
    """An interrupted delete must leave nothing that looks like a checkpoint."""
    make_checkpoint(store, 5)
    make_checkpoint(store, 6)
    deleted: list[str] = []
    real_delete = store.delete

    def delete_then_crash(key: str) -> None:
        deleted.append(key)
        real_delete(key)
        if len(deleted) == 2:
            raise KeyboardInterrupt("power cut")

    store.delete = delete_then_crash  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        delete_checkpoint(store, step_dir(5))
    store.delete = real_delete  # type: ignore[method-assign]
    assert deleted[0] == f"{step_dir(5)}/{MANIFEST_NAME}"
    assert [r.step for r in list_checkpoints(store)] == [6]
    assert "step-00000005" in scan(store).uncommitted
    assert delete_checkpoint(store, step_dir(6)) == 3  # manifest + shard + .metadata
    assert list(store.list(step_dir(6))) == []
    with pytest.raises(ValueError, match="not a step folder"):
        delete_checkpoint(store, "jobs")


def test_a_quarantined_checkpoint_is_kept_but_never_chosen(store: ObjectStore) -> None:
    from trainyard.plugins.checkpoint.catalog import QUARANTINE_NAME, quarantine

    for step in (10, 20, 30):
        make_checkpoint(store, step)
    newest = list_checkpoints(store)[-1]
    endpoint = getattr(store, "endpoint_url", None)
    marker = quarantine(newest.manifest_uri, "restore failed: SHA-256 mismatch", by="test",
                        endpoint_url=endpoint)
    assert marker.endswith(f"step-00000030/{QUARANTINE_NAME}")
    assert [r.step for r in list_checkpoints(store)] == [10, 20]
    assert latest_valid(store).step == 20
    assert select_latest_valid(store, before_step=40).chosen.step == 20
    found = scan(store)
    assert found.quarantined == {"step-00000030": "restore failed: SHA-256 mismatch"}
    assert "step-00000030" not in found.uncommitted  # retention sweeps never see it
    # Nothing deleted: the manifest and the shards are still there, and it still verifies.
    assert store.exists(f"{step_dir(30)}/{MANIFEST_NAME}")
    assert verify(store, 30).ok
    quarantine(newest.manifest_uri, "again", endpoint_url=endpoint)  # idempotent
    assert scan(store).quarantined == {"step-00000030": "restore failed: SHA-256 mismatch"}


def test_a_step_committed_again_after_its_quarantine_counts_again(store: ObjectStore) -> None:
    from trainyard.plugins.checkpoint.catalog import quarantine

    for step in (10, 20):
        make_checkpoint(store, step)
    quarantine(list_checkpoints(store)[-1].manifest_uri, "after the divergence onset",
               endpoint_url=getattr(store, "endpoint_url", None))
    assert latest_valid(store).step == 10
    make_checkpoint(store, 20, files={"__0_0.distcp": b"the rolled-back run's step 20"})
    assert latest_valid(store).step == 20 and scan(store).quarantined == {}
