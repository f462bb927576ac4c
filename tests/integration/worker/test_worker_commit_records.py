"""The worker's commit records itself: the real train.py under torchrun (2 processes), a real
MLflow SQLite store, and no control plane at all — no checkpoint watcher, no triggerer. Every
commit is recorded in the MLflow run by rank 0, and the spec's retention (`maxKeep: 2`) is
applied as the run goes, never to the newest checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.worker.conftest import RUN, committed_steps, fsdp_plan, launch, tiny_job
from trainyard.config.spec import TrainingJob
from trainyard.plugins.tracking import runs

pytestmark = pytest.mark.slow


def test_commits_are_recorded_and_retention_applied_with_no_watcher(object_store: str, tmp_path: Path) -> None:
    doc = tiny_job("self-recording", max_steps=10, interval_steps=2).to_yaml_dict()
    doc["spec"]["checkpoint"]["maxKeep"] = 2
    job = TrainingJob.model_validate(doc)
    plan = fsdp_plan()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rid = runs.start_or_resume_run(job, plan, tracking_uri=uri, attempt=0, trigger_id=RUN)

    run = launch(job, plan, object_store=object_store, run_dir=tmp_path / "run", mlflow=(uri, rid))

    assert run.exit_codes() == [0, 0], run.logs()
    assert committed_steps(object_store, job.name) == [8, 10], run.logs()  # 2, 4, 6 deleted; 10 the newest
    recorded = runs.checkpoints(rid, tracking_uri=uri)
    assert [r.step for r in recorded] == [2, 4, 6, 8, 10], run.logs()  # every commit, before any deletion
    assert all(r.sha256 and r.manifest_uri.endswith(f"step-{r.step:08d}/MANIFEST.json") for r in recorded)
