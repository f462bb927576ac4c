"""The whole chain with real parts: CheckpointManager commits → the run records manifest URI +
SHA-256 → the best checkpoint is exported (DCP → safetensors) and registered with lineage."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.tracking.factories import make_job, make_plan, registry_dataset
from trainyard.plugins.tracking import registry, runs


def test_best_committed_checkpoint_is_exported_and_registered(sqlite_tracking_uri: str, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from torch import nn

    from trainyard.plugins.checkpoint.manager import CheckpointManager

    job = make_job("ckpt-to-registry")
    root = (tmp_path / "objects" / "jobs" / job.name / "checkpoints").as_uri()
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=sqlite_tracking_uri, attempt=0,
                                   dataset=registry_dataset("v3", "9" * 64))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    snapshots = {}
    with CheckpointManager(checkpoint_uri=root, job=job.name, rank=0, world_size=1,
                           staging_dir=tmp_path / "staging") as mgr:
        for step, loss in [(1, 2.0), (2, 1.2), (3, 1.5)]:
            model(torch.randn(4, 8)).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            result = mgr.save_sync(step, model=model, optimizer=optimizer, metrics={"loss": loss})
            assert result.committed
            snapshots[step] = {k: v.clone() for k, v in model.state_dict().items()}
            record = runs.log_committed_checkpoint(rid, result.manifest_uri, tracking_uri=sqlite_tracking_uri)
            assert (record.step, record.metrics) == (step, {"loss": loss})
    runs.set_run_status(rid, "completed", tracking_uri=sqlite_tracking_uri)

    info = registry.register_checkpoint(rid, tracking_uri=sqlite_tracking_uri, metric="loss")
    assert (info.checkpoint_step, info.aliases, info.dataset_version) == (2, ["candidate"], "v3")
    assert info.checkpoint_uri is not None and info.checkpoint_uri.endswith("step-00000002/MANIFEST.json")

    import mlflow.artifacts
    from mlflow import MlflowClient

    location = MlflowClient(sqlite_tracking_uri).get_logged_model(info.model_id).artifact_location
    path = Path(mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=str(tmp_path / "dl")))
    (weights,) = list(path.rglob("*.safetensors"))
    exported = load_file(str(weights))
    assert set(exported) == set(snapshots[2])
    for name, tensor in snapshots[2].items():  # the best step's weights, not the last step's
        assert torch.equal(exported[name], tensor)
    assert not torch.equal(exported["0.weight"], snapshots[3]["0.weight"])


def test_a_checkpoint_of_another_job_is_not_exported(sqlite_tracking_uri: str, tmp_path: Path) -> None:
    from trainyard.plugins.checkpoint.errors import OutsideJobPrefixError

    rid = runs.start_or_resume_run(make_job("prefix-owner"), make_plan(), tracking_uri=sqlite_tracking_uri, attempt=0)
    runs.log_checkpoint(rid, (tmp_path / "jobs/someone-else/checkpoints/step-00000001/MANIFEST.json").as_uri(),
                        "ab" * 32, 1, tracking_uri=sqlite_tracking_uri)
    with pytest.raises(OutsideJobPrefixError):
        registry.register_checkpoint(rid, tracking_uri=sqlite_tracking_uri)
