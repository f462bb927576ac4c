"""CheckpointManager in one process (no torch.distributed): the save/commit/restore cycle,
fallback, failure reporting, the job-prefix rule and export. Multi-rank FSDP2 runs live in
tests/integration/checkpoint/."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from blake3 import blake3
from torch import nn

from tests.support.s3_server import S3Server
from trainyard.plugins.checkpoint.catalog import list_checkpoints, verify
from trainyard.plugins.checkpoint.errors import (
    CheckpointMismatchError,
    CheckpointSaveError,
    ManagerClosedError,
    NoValidCheckpointError,
    OutsideJobPrefixError,
)
from trainyard.plugins.checkpoint.export import export_safetensors
from trainyard.plugins.checkpoint.manager import CheckpointManager
from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME, step_dir

JOB = "unit-job"

# Single-process DCP warns on every call; the manager silences it outside pytest too.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Sampler:
    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]


class Trainer:
    """A tiny model + AdamW + scheduler + sampler, trained on random batches."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.Linear(16, 4))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2)
        self.sampler = Sampler()

    def step(self) -> None:
        self.sampler.position += 4
        self.model(torch.randn(4, 8)).pow(2).sum().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.scheduler.step()

    @property
    def extra(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "sampler": self.sampler}

    def snapshot(self) -> dict[str, Any]:
        return {"model": {k: v.clone() for k, v in self.model.state_dict().items()},
                "optim": {k: {n: t.clone() for n, t in s.items()}
                          for k, s in self.optimizer.state_dict()["state"].items()},
                "sched": self.scheduler.state_dict(), "sampler": self.sampler.position}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            if not _same(x, y):
                return False
        elif isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


@pytest.fixture
def root(tmp_path: Path) -> str:
    return (tmp_path / "objects" / "jobs" / JOB / "checkpoints").as_uri()


def _manager(root: str, tmp_path: Path, **kwargs: Any) -> CheckpointManager:
    return CheckpointManager(checkpoint_uri=root, job=JOB, rank=0, world_size=1,
                             staging_dir=tmp_path / "staging", **kwargs)


def _flip(root: str, step: int, name: str = "__0_0.distcp") -> None:
    path = Path(root.removeprefix("file://")) / step_dir(step) / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_save_commit_restore_round_trip(root: str, tmp_path: Path) -> None:
    t = Trainer()
    with _manager(root, tmp_path, plan_json='{"dp": 1, "tp": 1}') as mgr:
        for step in (1, 2, 3):
            t.step()
            pending = mgr.save(step, model=t.model, optimizer=t.optimizer, extra=t.extra,
                               metrics={"loss": 1.0 / step})
            assert pending.status == "pending" and pending.blocking_s >= pending.staging_s
        saved = t.snapshot()
        next_draws = (random.random(), np.random.rand(), torch.rand(3))
        final = mgr.wait()
        assert final is not None and final.committed and final.step == 3
        assert final.commit_s is not None and final.stored_bytes > 0
        assert mgr.wait() is None  # nothing in flight any more

        records = list_checkpoints(root)
        assert [r.step for r in records] == [1, 2, 3]
        manifest = records[-1].manifest
        assert (manifest.plan, manifest.metrics, manifest.world_size) == (
            {"dp": 1, "tp": 1}, {"loss": 1 / 3}, 1)
        assert manifest.extra_state == ["extra/rank-00000.json"]
        assert manifest.torch_version == torch.__version__
        assert manifest.format_version == 2
        folder = Path(root.removeprefix("file://")) / step_dir(3)
        for entry in manifest.files:  # each stored file's BLAKE3, as the package computes it
            assert (entry.algorithm, entry.sha256) == ("blake3", None)
            assert entry.blake3 == blake3((folder / entry.path).read_bytes()).hexdigest()

        fresh = Trainer(seed=99)
        restored = mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
        assert restored is not None and restored.step == 3
        assert _same(fresh.snapshot(), saved)
        draws = (random.random(), np.random.rand(), torch.rand(3))
        assert draws[:2] == next_draws[:2] and torch.equal(draws[2], next_draws[2])
    assert not any((tmp_path / "staging").rglob("*.distcp"))


def test_resumed_training_matches_uninterrupted_training(root: str, tmp_path: Path) -> None:
    a = Trainer()
    with _manager(root, tmp_path) as mgr:
        for step in range(1, 7):
            a.step()
            if step == 3:
                mgr.save_sync(step, model=a.model, optimizer=a.optimizer, extra=a.extra)
        b = Trainer(seed=5)
        manifest = mgr.restore(model=b.model, optimizer=b.optimizer, extra=b.extra)
        assert manifest is not None
        for _ in range(manifest.step + 1, 7):
            b.step()
    assert _same(a.snapshot(), b.snapshot())


def test_restore_falls_back_past_a_corrupt_checkpoint(root: str, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    t = Trainer()
    with _manager(root, tmp_path) as mgr:
        t.step()
        mgr.save_sync(1, model=t.model, optimizer=t.optimizer, extra=t.extra)
        at_one = t.snapshot()
        t.step()
        mgr.save_sync(2, model=t.model, optimizer=t.optimizer, extra=t.extra)
        _flip(root, 2)
        fresh = Trainer(seed=3)
        before = fresh.snapshot()
        with caplog.at_level(logging.WARNING, logger="trainyard.plugins.checkpoint.manager"):
            with pytest.raises(NoValidCheckpointError, match="does not verify"):
                mgr.restore(model=fresh.model, optimizer=fresh.optimizer,
                            manifest_uri=mgr.manifest_uri(2))  # explicit choice: no fallback
            after = fresh.snapshot()  # (optimizer state only got get_state_dict's zero init)
            assert all(_same(after[k], before[k]) if isinstance(before[k], dict)
                       else after[k] == before[k] for k in ("model", "sched", "sampler")), \
                "a rejected checkpoint must not touch the model"
            manifest = mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
        assert manifest is not None and manifest.step == 1
        assert _same(fresh.snapshot(), at_one)
        assert "step-00000002/MANIFEST.json rejected" in caplog.text
        assert "__0_0.distcp: BLAKE3" in caplog.text and "(corrupt)" in caplog.text

        _flip(root, 1, ".metadata")
        with pytest.raises(NoValidCheckpointError, match=r"no checkpoint .* verifies"):
            mgr.restore(model=fresh.model, optimizer=fresh.optimizer)


def _as_sha256_manifest(root: str, step: int) -> None:
    """Rewrite a committed manifest as the writer before issue 58 committed it: format 1, every
    file's SHA-256 (the files themselves were written the same way)."""
    folder = Path(root.removeprefix("file://")) / step_dir(step)
    document = json.loads((folder / MANIFEST_NAME).read_bytes())
    document["format_version"] = 1
    for entry in document["files"]:
        del entry["blake3"]
        entry["sha256"] = hashlib.sha256((folder / entry["path"]).read_bytes()).hexdigest()
    (folder / MANIFEST_NAME).write_text(json.dumps(document))


def test_a_sha256_manifest_written_before_restores_and_a_corrupt_one_is_refused(
        root: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    t = Trainer()
    with _manager(root, tmp_path) as mgr:
        t.step()
        mgr.save_sync(1, model=t.model, optimizer=t.optimizer, extra=t.extra)
        at_one = t.snapshot()
        t.step()
        mgr.save_sync(2, model=t.model, optimizer=t.optimizer, extra=t.extra)
        at_two = t.snapshot()
        for step in (1, 2):
            _as_sha256_manifest(root, step)
        records = list_checkpoints(root)
        assert [r.manifest.format_version for r in records] == [1, 1]
        assert all(f.algorithm == "sha256" for r in records for f in r.manifest.files)
        assert verify(root, 2).ok  # the catalog verifies it with SHA-256

        fresh = Trainer(seed=3)
        restored = mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
        assert restored is not None and restored.step == 2
        assert _same(fresh.snapshot(), at_two)

        _flip(root, 2)
        assert "__0_0.distcp: SHA-256" in verify(root, 2).reason
        fresh = Trainer(seed=4)
        with caplog.at_level(logging.WARNING, logger="trainyard.plugins.checkpoint.manager"):
            restored = mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
        assert restored is not None and restored.step == 1
        assert _same(fresh.snapshot(), at_one)
        assert "__0_0.distcp: SHA-256" in caplog.text and "(corrupt)" in caplog.text


def test_a_restore_loads_the_bytes_it_hashed_not_a_second_read(
        root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The data file is read into memory as it is hashed and DCP loads those bytes: a change
    to the file on disk after its hash (here, right after) cannot reach the model."""
    from trainyard.plugins.checkpoint import fetch

    real = fetch.read_verified
    held: list[str] = []

    def read_then_corrupt(entry: Any, path: Path, **kwargs: Any) -> Any:
        file = real(entry, path, **kwargs)
        held.append(entry.path)
        if entry.path == "__0_0.distcp":  # the link and the stored file are one inode
            path.write_bytes(bytes(path.stat().st_size))
        return file

    monkeypatch.setattr(fetch, "read_verified", read_then_corrupt)
    t = Trainer()
    with _manager(root, tmp_path) as mgr:
        t.step()
        mgr.save_sync(1, model=t.model, optimizer=t.optimizer, extra=t.extra)
        saved = t.snapshot()
        fresh = Trainer(seed=5)
        assert mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
        assert "__0_0.distcp" in held
        assert _same(fresh.snapshot(), saved)
        monkeypatch.setattr(fetch, "read_verified", real)
        with pytest.raises(NoValidCheckpointError, match=r"no checkpoint .* verifies"):
            mgr.restore(model=fresh.model, optimizer=fresh.optimizer)  # the zeroing was real


def test_an_error_that_is_not_the_checkpoints_fault_while_verifying_is_raised_not_a_fallback(
        root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug while files are read and verified (here a TypeError) says so: it neither rejects
    the checkpoint as corrupt nor falls back to older ones, which would fail the same way and
    end in "no checkpoint verifies"."""
    from trainyard.plugins.checkpoint import fetch

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("read_verified() got an unexpected keyword argument")

    t = Trainer()
    with _manager(root, tmp_path) as mgr:
        for step in (1, 2):
            t.step()
            mgr.save_sync(step, model=t.model, optimizer=t.optimizer, extra=t.extra)
        real = fetch.read_verified, fetch.verify_local_file
        monkeypatch.setattr(fetch, "read_verified", broken)
        monkeypatch.setattr(fetch, "verify_local_file", broken)
        fresh = Trainer(seed=5)
        with pytest.raises(CheckpointMismatchError, match=r"cannot restore step 2: rank 0: TypeError"):
            mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
        monkeypatch.setattr(fetch, "read_verified", real[0])
        monkeypatch.setattr(fetch, "verify_local_file", real[1])
        assert verify(root, 2).ok  # nothing was wrong with it
        restored = mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
        assert restored is not None and restored.step == 2


def test_without_memory_to_spare_a_restore_reads_the_verified_files_again(
        root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.plugins.checkpoint import fetch, manager

    monkeypatch.setattr(manager, "memory_to_hold", lambda: 0)
    monkeypatch.setattr(fetch, "read_verified", lambda *a, **k: pytest.fail("held with no memory"))
    t = Trainer()
    with _manager(root, tmp_path) as mgr:
        t.step()
        mgr.save_sync(1, model=t.model, optimizer=t.optimizer, extra=t.extra)
        fresh = Trainer(seed=5)
        assert mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
        assert _same(fresh.snapshot(), t.snapshot())


def test_nothing_to_restore_returns_none(root: str, tmp_path: Path) -> None:
    t = Trainer()
    with _manager(root, tmp_path) as mgr:
        assert mgr.restore(model=t.model, optimizer=t.optimizer) is None


def test_a_failed_save_is_reported_not_hidden(root: str, tmp_path: Path) -> None:
    t = Trainer()
    with _manager(root, tmp_path) as mgr:
        real_put = mgr.store.put_file

        def broken_put(key: str, path: Any, **kwargs: Any) -> Any:
            raise OSError("bucket is read-only")

        mgr.store.put_file = broken_put  # type: ignore[method-assign]
        mgr.save(1, model=t.model, optimizer=t.optimizer)
        second = mgr.save(2, model=t.model, optimizer=t.optimizer)
        assert second.previous is not None and second.previous.status == "failed"
        assert "bucket is read-only" in (second.previous.error or "")
        with pytest.raises(CheckpointSaveError, match="checkpoint step 2 failed"):
            mgr.wait()
        with pytest.raises(CheckpointSaveError, match="emergency save of step 3 failed"):
            mgr.save_sync(3, model=t.model, optimizer=t.optimizer)
        mgr.store.put_file = real_put  # type: ignore[method-assign]
        assert mgr.save_sync(4, model=t.model, optimizer=t.optimizer).committed
    assert [r.step for r in list_checkpoints(root)] == [4]


def test_at_most_one_save_in_flight_and_the_wait_is_reported(root: str, tmp_path: Path) -> None:
    t = Trainer()
    release = threading.Event()
    with _manager(root, tmp_path) as mgr:
        real_put = mgr.store.put_file
        calls = []

        def gated_put(key: str, path: Any, **kwargs: Any) -> Any:
            calls.append(key)
            release.wait(timeout=60)
            return real_put(key, path, **kwargs)

        mgr.store.put_file = gated_put  # type: ignore[method-assign]
        mgr.save(1, model=t.model, optimizer=t.optimizer)
        threading.Timer(0.3, release.set).start()
        second = mgr.save(2, model=t.model, optimizer=t.optimizer)
        assert release.is_set(), "the second save must wait for the first"
        assert second.previous is not None and second.previous.committed
        assert second.previous.step == 1 and second.waited_s > 0
        assert second.blocking_s >= second.waited_s
        assert mgr.wait().committed  # type: ignore[union-attr]


def test_saving_a_step_again_replaces_it(root: str, tmp_path: Path) -> None:
    """After a rollback the same step is saved again: the old manifest goes first."""
    t = Trainer()
    with _manager(root, tmp_path) as mgr:
        t.step()
        mgr.save_sync(5, model=t.model, optimizer=t.optimizer, metrics={"loss": 2.0})
        t.step()
        mgr.save_sync(5, model=t.model, optimizer=t.optimizer, metrics={"loss": 1.0})
        latest = t.snapshot()
        fresh = Trainer(seed=8)
        assert mgr.restore(model=fresh.model, optimizer=fresh.optimizer) is not None
    assert [(r.step, r.metrics) for r in list_checkpoints(root)] == [(5, {"loss": 1.0})]
    assert _same(fresh.snapshot()["model"], latest["model"])


def test_uris_outside_the_job_prefix_are_refused(root: str, tmp_path: Path) -> None:
    other = (tmp_path / "objects" / "jobs" / "someone-else" / "checkpoints").as_uri()
    with pytest.raises(OutsideJobPrefixError):
        CheckpointManager(checkpoint_uri=other, job=JOB, rank=0, world_size=1,
                          staging_dir=tmp_path)
    t = Trainer()
    with _manager(root, tmp_path) as mgr, pytest.raises(OutsideJobPrefixError):
        mgr.restore(model=t.model, optimizer=t.optimizer,
                    manifest_uri=other + "/step-00000001/MANIFEST.json")


def test_bad_arguments_fail_fast(root: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"needs torch\.distributed"):
        CheckpointManager(checkpoint_uri=root, job=JOB, rank=1, world_size=2,
                          staging_dir=tmp_path)
    with pytest.raises(ValueError, match="compression"):
        _manager(root, tmp_path, compression="lz4")
    t = Trainer()
    with _manager(root, tmp_path) as mgr, pytest.raises(TypeError, match="no state_dict"):
        mgr.save(1, model=t.model, optimizer=t.optimizer, extra={"x": object()})
    mgr.close()
    with pytest.raises(ManagerClosedError, match="closed"):
        mgr.save(1, model=t.model, optimizer=t.optimizer)


def test_s3_store_with_zstd_and_export(s3_server: S3Server, tmp_path: Path) -> None:
    """The same cycle against a real S3 endpoint, compressed; then export to safetensors."""
    from safetensors import safe_open

    bucket = s3_server.new_bucket()
    root = f"s3://{bucket}/trainyard/jobs/{JOB}/checkpoints"
    t = Trainer()
    with _manager(root, tmp_path, compression="zstd", endpoint_url=s3_server.endpoint_url) as mgr:
        t.step()
        result = mgr.save_sync(1, model=t.model, optimizer=t.optimizer, extra=t.extra)
        assert result.committed and result.stored_bytes < result.state_bytes
        fresh = Trainer(seed=4)
        assert mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
        assert _same(fresh.snapshot(), t.snapshot())

        out = export_safetensors(result.manifest_uri, tmp_path / "model.safetensors",
                                 endpoint_url=s3_server.endpoint_url, job=JOB)
    assert out.step == 1 and out.tensors == len(t.model.state_dict())
    with safe_open(str(out.path), framework="pt") as f:
        assert f.metadata()["trainyard.job"] == JOB and f.metadata()["trainyard.step"] == "1"
        for name, tensor in t.model.state_dict().items():
            assert torch.equal(f.get_tensor(name), tensor)
    with pytest.raises(OutsideJobPrefixError):
        export_safetensors(result.manifest_uri, tmp_path / "x.safetensors",
                           endpoint_url=s3_server.endpoint_url, job="other-job")


def test_several_io_threads_write_and_verify_several_files(root: str, tmp_path: Path) -> None:
    t = Trainer()
    t.step()
    with _manager(root, tmp_path, io_threads=3) as mgr:
        mgr.save_sync(1, model=t.model, optimizer=t.optimizer, extra=t.extra)
        shards = sorted(f.path for f in list_checkpoints(root)[0].manifest.files
                        if f.path.endswith(".distcp"))
        assert shards == ["__0_0.distcp", "__0_1.distcp", "__0_2.distcp"]
        fresh = Trainer(seed=2)
        assert mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
    assert _same(fresh.snapshot(), t.snapshot())
