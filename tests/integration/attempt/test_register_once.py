"""`register_model` is exactly-once: checkpoints committed by the real `CheckpointManager`, a
real MLflow SQLite store; a second call for the same run, checkpoint step and manifest SHA-256
(a retried `register_model` task) returns the version the first one made, and the export is
written under the run's own folder, never the machine's temporary folder."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.unit.tracking.factories import make_job, make_plan
from trainyard.config.settings import Settings
from trainyard.plugins.attempt.closing import export_folder, register_model
from trainyard.plugins.launch.environment import checkpoint_uri
from trainyard.plugins.tracking import runs
from trainyard.plugins.tracking.runs import CHECKPOINT_MODEL_TYPE

RUN = "20260101t000000-ab12cd"


def commit(job_name: str, root: str, staging: Path, steps: list[int]) -> None:
    import torch
    from torch import nn

    from trainyard.plugins.checkpoint.manager import CheckpointManager

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with CheckpointManager(checkpoint_uri=root, job=job_name, rank=0, world_size=1, staging_dir=staging) as mgr:
        for step in steps:
            assert mgr.save_sync(step, model=model, optimizer=optimizer, metrics={"loss": 1.0 / step}).committed


def test_a_second_register_returns_the_first_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where a /tmp export would land
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=uri)
    job = make_job("register-once")
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0, trigger_id=RUN)
    root = checkpoint_uri(job, settings.object_store, RUN)
    commit(job.name, root, tmp_path / "staging", [1, 2])
    for step in (1, 2):
        runs.log_committed_checkpoint(rid, f"{root}/step-{step:08d}/MANIFEST.json", tracking_uri=uri)

    first = register_model(job, settings, mlflow_run_id=rid)
    again = register_model(job, settings, mlflow_run_id=rid)  # the retried task

    assert (first.version, first.checkpoint_step, first.aliases) == ("1", 2, ["candidate"])
    assert again == first
    client = MlflowClient(uri)
    assert [str(mv.version) for mv in client.search_model_versions(f"name = '{job.name}'")] == ["1"]
    experiment = client.get_run(rid).info.experiment_id
    models = client.search_logged_models(experiment_ids=[experiment])
    assert [m.model_id for m in models if m.model_type != CHECKPOINT_MODEL_TYPE] == [first.model_id]  # one export
    assert export_folder(job, settings, rid) == settings.runs_dir / job.name / RUN / "export"
    assert not export_folder(job, settings, rid).exists()  # removed after the upload
    assert not list(scratch.glob("trainyard-export-*"))

    # A newer checkpoint of the same run is a new registration, not the old one again.
    commit(job.name, root, tmp_path / "staging", [3])
    runs.log_committed_checkpoint(rid, f"{root}/step-00000003/MANIFEST.json", tracking_uri=uri)
    newer = register_model(job, settings, mlflow_run_id=rid)
    assert (newer.version, newer.checkpoint_step, newer.aliases) == ("2", 3, ["candidate"])
    assert register_model(job, settings, mlflow_run_id=rid).version == "2"
