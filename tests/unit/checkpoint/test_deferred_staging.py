"""Deferred staging (`CheckpointManager(staging="deferred")`): the copy of the state runs in the
background while training goes on, and nothing that changes the state gets ahead of it — the
optimizer's step and a forward that changes buffers wait for it, anything else fails the save.

Each test slows the copy down (`_slow_copy`), so that without the guards the change would land
before the copy: the checkpoint would hold the changed state, or the version check would fail
it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.unit.checkpoint.test_checkpoint_manager import JOB, Trainer, _same
from trainyard.plugins.checkpoint.catalog import list_checkpoints
from trainyard.plugins.checkpoint.errors import CheckpointSaveError
from trainyard.plugins.checkpoint.manager import CheckpointManager

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

COPY_DELAY_S = 0.3


@pytest.fixture
def root(tmp_path: Path) -> str:
    return (tmp_path / "objects" / "jobs" / JOB / "checkpoints").as_uri()


def _deferred(root: str, tmp_path: Path) -> CheckpointManager:
    return CheckpointManager(checkpoint_uri=root, job=JOB, rank=0, world_size=1,
                             staging_dir=tmp_path / "staging", staging="deferred")


def _slow_copy(mgr: CheckpointManager, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = mgr._stage

    def slow(state: dict[str, Any]) -> dict[str, Any]:
        time.sleep(COPY_DELAY_S)
        return copy(state)

    monkeypatch.setattr(mgr, "_stage", slow)


def test_the_next_optimizer_step_waits_for_the_copy(root: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    t = Trainer()
    with _deferred(root, tmp_path) as mgr:
        _slow_copy(mgr, monkeypatch)
        t.step()
        saved = t.snapshot()
        pending = mgr.save(1, model=t.model, optimizer=t.optimizer, extra=t.extra)
        assert pending.status == "pending" and pending.blocking_s < COPY_DELAY_S  # the copy is not in it
        t.step()  # forward and backward run; the step waits for the copy
        after_step = t.snapshot()
        final = mgr.wait()
        assert final is not None and final.committed
        assert final.stage_wait_s > 0 and final.staging_s >= COPY_DELAY_S

        fresh = Trainer(seed=5)
        mgr.restore(model=fresh.model, optimizer=fresh.optimizer, extra=fresh.extra)
    assert _same(fresh.snapshot(), saved)
    assert not _same(after_step, saved)  # the step did change the state, after the copy


def test_a_forward_that_changes_buffers_waits_for_the_copy(root: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4))
    before = model[1].running_mean.clone()
    with _deferred(root, tmp_path) as mgr:
        _slow_copy(mgr, monkeypatch)
        mgr.save(1, model=model, optimizer=optimizer)
        model(torch.randn(8, 4) + 3)  # batch norm's running statistics move in forward
        final = mgr.wait()
        assert final is not None and final.committed and final.stage_wait_s > 0
        assert not torch.equal(model[1].running_mean, before)
        mgr.restore(model=model, optimizer=optimizer)
    assert torch.equal(model[1].running_mean, before)


def test_a_change_outside_the_guards_fails_the_save_and_says_how_to_avoid_it(
        root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = Trainer()
    with _deferred(root, tmp_path) as mgr:
        _slow_copy(mgr, monkeypatch)
        t.step()
        mgr.save(1, model=t.model, optimizer=t.optimizer, extra=t.extra)
        with torch.no_grad():
            t.model[0].weight.mul_(0.5)  # e.g. a script's own weight averaging
        with pytest.raises(CheckpointSaveError, match=r"changed while it was being staged \(model\.0\.weight\)"
                           r".*checkpoint\.staging: blocking"):
            mgr.wait()
        assert list_checkpoints(root) == []  # the torn copy was never committed
        # After wait_staged() the same change is safe.
        mgr.save(2, model=t.model, optimizer=t.optimizer, extra=t.extra)
        mgr.wait_staged()
        with torch.no_grad():
            t.model[0].weight.mul_(0.5)
        final = mgr.wait()
        assert final is not None and final.committed
    assert [r.step for r in list_checkpoints(root)] == [2]


def test_closing_removes_the_guards(root: str, tmp_path: Path) -> None:
    t = Trainer()
    with _deferred(root, tmp_path) as mgr:
        t.step()
        mgr.save(1, model=t.model, optimizer=t.optimizer, extra=t.extra)
        assert len(t.optimizer._optimizer_step_pre_hooks) == 1
        mgr.save(2, model=t.model, optimizer=t.optimizer, extra=t.extra)  # guarded once
        assert len(t.optimizer._optimizer_step_pre_hooks) == 1
    assert len(t.optimizer._optimizer_step_pre_hooks) == 0
    assert [r.step for r in list_checkpoints(root)] == [1, 2]


def test_unknown_staging_is_refused(root: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="staging must be 'blocking' or 'deferred', got 'lazy'"):
        CheckpointManager(checkpoint_uri=root, job=JOB, rank=0, world_size=1,
                          staging_dir=tmp_path / "staging", staging="lazy")  # type: ignore[arg-type]



def test_every_optimizer_of_several_waits_for_the_copy(root: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    optimizers = [torch.optim.AdamW(model[0].parameters()), torch.optim.AdamW(model[1].parameters())]

    def train() -> None:
        model(torch.randn(3, 4)).sum().backward()
        optimizers[1].step()  # the second first: its hook must hold it too
        optimizers[0].step()

    train()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with _deferred(root, tmp_path) as mgr:
        _slow_copy(mgr, monkeypatch)
        mgr.save(1, model=model, optimizer=optimizers)
        train()
        final = mgr.wait()
        assert final is not None and final.committed and final.stage_wait_s > 0
        mgr.restore(model=model, optimizer=optimizers)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
