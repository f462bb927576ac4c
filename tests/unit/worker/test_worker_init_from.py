"""`checkpoint.initFrom`: a fresh run of a fine-tuning job starts from another job's weights —
read-only (nothing of the other job is written), weights only (its own optimizer, step 1) —
while any other foreign resume point stays refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.support.procs import REPO_ROOT
from tests.unit.security.audit import snapshot
from trainyard.config.loader import load_spec_file
from trainyard.plugins.checkpoint.errors import OutsideJobPrefixError
from trainyard.worker.session import SessionConfig, TrainingSession

BASE = load_spec_file(REPO_ROOT / "config/jobs/demo-tiny-lm.yaml")
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _session(spec, tmp_path: Path, **changes: object) -> tuple[TrainingSession, torch.nn.Linear]:
    config = dataclasses.replace(SessionConfig.from_env({}, spec=spec, world_size=1),
                                 checkpoint_interval_steps=None, checkpoint_interval_s=None, **changes)
    session = TrainingSession(config)
    model = torch.nn.Linear(4, 4)
    session.attach(model=model, optimizer=torch.optim.AdamW(model.parameters()), extra={})
    return session, model


def test_a_fine_tune_starts_from_the_base_jobs_weights_without_writing_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    for name in ("RANK", "WORLD_SIZE", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    torch.manual_seed(1)
    base, base_model = _session(BASE, tmp_path)
    base.restore()
    base.step_end(1, loss=2.0)
    base.finish(2)
    base.close()
    manifest = f"{base.config.checkpoint_uri}/step-00000002/MANIFEST.json"
    base_area = tmp_path / "objects" / "jobs" / BASE.name
    before = snapshot(base_area)

    doc = BASE.to_yaml_dict()
    doc["metadata"]["name"] = "demo-tiny-lm-ft"
    doc["spec"].setdefault("checkpoint", {})["initFrom"] = manifest
    fine_tune = type(BASE).model_validate(doc)
    torch.manual_seed(2)
    ft, ft_model = _session(fine_tune, tmp_path)
    try:
        assert ft.restore() == 1  # a fresh run of its own: step 1, the base job's weights
        assert torch.equal(ft_model.weight, base_model.weight)
        ft.step_end(1, loss=1.0)
        ft.finish(2)
    finally:
        ft.close()
    assert snapshot(base_area) == before  # read, never written
    assert (tmp_path / "objects" / "jobs" / fine_tune.name / "runs").is_dir()

    torch.manual_seed(3)  # without initFrom, the same manifest is another job's: refused
    other = BASE.model_copy(update={"metadata": BASE.metadata.model_copy(update={"name": "x-job"})})
    stranger, _ = _session(other, tmp_path)
    try:
        with pytest.raises(OutsideJobPrefixError):
            stranger.checkpoints.restore(model=torch.nn.Linear(4, 4), manifest_uri=manifest)
    finally:
        stranger.close()
