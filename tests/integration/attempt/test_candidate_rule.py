"""`candidate` moves under the spec's rule only (issue 57): real checkpoints (the real
`CheckpointManager`), a real MLflow SQLite store. A 20-step smoke run registers a version but
leaves `candidate` on the 200-step model, saying why; a full run with a loss no worse takes it;
a retried registration reads its first decision back."""

from __future__ import annotations

from pathlib import Path

from tests.integration.attempt.test_register_once import commit
from tests.unit.tracking.factories import make_job, make_plan
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.plugins.attempt.closing import register_model
from trainyard.plugins.launch.environment import checkpoint_uri
from trainyard.plugins.tracking import runs


def trained(job: TrainingJob, settings: Settings, tmp_path: Path, run: str, *, steps: int, loss: float) -> str:
    """An MLflow run of `job` that trained `steps` steps to `loss`, with a committed checkpoint."""
    from mlflow import MlflowClient

    uri = settings.mlflow_tracking_uri
    rid = runs.start_or_resume_run(job, make_plan(), tracking_uri=uri, attempt=0, trigger_id=run)
    client = MlflowClient(uri)
    client.log_metric(rid, "loss", loss + 1.0, step=1)
    client.log_metric(rid, "loss", loss, step=steps)
    root = checkpoint_uri(job, settings.object_store, run)
    commit(job.name, root, tmp_path / f"staging-{run}", [steps])
    runs.log_committed_checkpoint(rid, f"{root}/step-{steps:08d}/MANIFEST.json", tracking_uri=uri)
    return rid


def test_a_smoke_run_registers_but_leaves_candidate_on_the_full_model(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=uri)
    job = make_job("candidate-rule")
    client = MlflowClient(uri)

    full = register_model(job, settings, max_steps=200,
                          mlflow_run_id=trained(job, settings, tmp_path, "20260101t000000-aaaaaa", steps=200, loss=1.85))
    assert (full.version, full.aliases) == ("1", ["candidate"])
    assert full.candidate_note == "candidate moved: no version held it"

    smoke_run = trained(job, settings, tmp_path, "20260101t000100-bbbbbb", steps=20, loss=3.14)
    smoke = register_model(job, settings, max_steps=200, mlflow_run_id=smoke_run)
    assert (smoke.version, smoke.aliases) == ("2", [])
    assert smoke.candidate_note == (
        "candidate not moved (it stays on version 1): the run reached step 20 of the spec's maxSteps 200; "
        "its final loss 3.14 is worse than version 1's 1.85")
    assert str(client.get_model_version_by_alias(job.name, "candidate").version) == "1"
    assert register_model(job, settings, max_steps=200, mlflow_run_id=smoke_run) == smoke  # a retried task

    better = register_model(job, settings, max_steps=200,
                            mlflow_run_id=trained(job, settings, tmp_path, "20260101t000200-cccccc", steps=200,
                                                  loss=1.5))
    assert (better.version, better.aliases) == ("3", ["candidate"])
    assert better.candidate_note == "candidate moved from version 1 (step 200 ≥ maxSteps 200, loss 1.5 ≤ 1.85)"
