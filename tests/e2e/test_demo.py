"""`make demo` end to end: every real part on the embedded default, with a worker crash.

The demo is the product's main path (dataset → dry run → plan → MLflow run → torchrun →
SIGKILL a rank → resume from a verified checkpoint → register the model). This test runs it
as a user would and then checks what it left behind, not what it printed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import procs

pytestmark = pytest.mark.slow


def _demo(home: Path, *args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "cli.demo", *args], cwd=procs.REPO_ROOT, capture_output=True,
                            text=True, env=procs.test_env({"TRAINYARD_HOME": str(home), "COLUMNS": "120"}),
                            timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]


def test_demo_recovers_from_a_worker_crash_and_registers_the_model(tmp_path: Path) -> None:
    home = tmp_path / ".trainyard"
    _demo(home)

    from mlflow import MlflowClient

    from plugins.checkpoint.catalog import list_checkpoints, verify

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("demo/tiny-lm").experiment_id])
    tags = run.data.tags
    assert tags["trainyard.attempts"] == "0,1"  # one MLflow run across both attempts
    assert tags["trainyard.failure_causes"] == "worker_crash"
    assert tags["trainyard.status"] == "completed"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert max(steps) == 200 and len(set(steps)) == 200

    job, training_run = tags["trainyard.job"], tags["trainyard.run"]
    assert job == "demo-tiny-lm"  # each demo is a training run of the same job
    root = (home / "objects" / "jobs" / job / "runs" / training_run / "checkpoints").as_uri()
    checkpoints = list_checkpoints(root)
    assert checkpoints[-1].step == 200 and verify(root, checkpoints[-1]).ok

    version = client.get_model_version_by_alias("demo-tiny-lm", "candidate")
    assert version.run_id == run.info.run_id
    assert version.tags["trainyard.dataset.version"] == "v1"
    assert version.tags["trainyard.checkpoint.step"] == "200"
    assert (home / "demo" / f"{job}-{training_run}.png").stat().st_size > 10_000

    # A second demo trains again (it does not find the first run's final checkpoint) and
    # registers the next version of the same model.
    _demo(home, "--no-crash")
    assert str(client.get_model_version_by_alias("demo-tiny-lm", "candidate").version) == "2"
    runs = client.search_runs([run.info.experiment_id])
    assert len(runs) == 2 and all(r.data.tags["trainyard.status"] == "completed" for r in runs)
    assert len({r.data.tags["trainyard.run"] for r in runs}) == 2
