"""Third-party training code through the DAG, unchanged: pytorch/examples' DDP tutorial
(`tests/fixtures/ddp_tutorial/`, CPU-ported in its 3 device lines), in a team's folder beside
the team's own `config.py` and `utils.py`, as the spec's entrypoint. It writes no checkpoint of
Trainyard's (a plain script), so the run ends completed and *not registered* — by design, said the
same way by the DAG run (green, its note), the job state and MLflow (the run FINISHED, no model
version) — never an attempted and failed registration. It runs in its own folder: the snapshot
it writes relative to the working directory lands there, not in Trainyard's checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.airflow_stack import RunningStack, demo_spec
from tests.fixtures.ddp_tutorial import adapt
from tests.support.procs import REPO_ROOT
from trainyard.cli.airflow_api import follow_training_run
from trainyard.plugins.recovery.model import NOT_REGISTERED

pytestmark = pytest.mark.slow

JOB = "ddp-tutorial-plain"


def test_a_stock_torchrun_script_runs_unchanged_to_an_honest_green_not_registered(
        shared: RunningStack, tmp_path: Path) -> None:
    team = tmp_path / "team-code"
    script = adapt.write(team, adapt.cpu_port())
    (team / "config.py").write_text("raise RuntimeError('the team config is not imported by Trainyard')\n")
    (team / "utils.py").write_text("raise RuntimeError('the team utils are not imported by Trainyard')\n")
    spec = demo_spec(JOB)
    spec["spec"]["source"] = {"entrypoint": str(script), "args": ["2", "1", "--batch_size", "32"]}
    assert spec["spec"]["training"]["learningRate"]  # reaches it as TRAINYARD_LEARNING_RATE, not as a --lr
    shared.add_jobs({JOB: spec})

    first = shared.client.trigger(JOB, {})["dag_run_id"]
    attempts = follow_training_run(shared.client, JOB, first, timeout_s=600)
    assert [(a.state, a.outcome, a.action) for a in attempts] == [("success", "completed", "finish")], \
        f"{attempts}\n{shared.logs()}"
    (attempt,) = attempts
    assert attempt.tasks["finish_run"] == "success" and attempt.tasks["register_model"] == "skipped"
    note = shared.client.dag_run(JOB, attempt.dag_run_id).get("note") or ""
    assert note == f"attempt 0: completed → {NOT_REGISTERED}", note

    from trainyard.plugins.recovery.state import JobStateStore
    from trainyard.plugins.tracking.runs import client_for

    info = JobStateStore(shared.settings.state_db).get_run(JOB, attempt.run)
    assert info.state == "completed" and NOT_REGISTERED in info.final_reason, info
    mlflow = client_for(shared.settings.mlflow_tracking_uri)
    experiment = mlflow.get_experiment_by_name("demo/tiny-lm")
    (run,) = mlflow.search_runs([experiment.experiment_id], filter_string=f"tags.`trainyard.run` = '{attempt.run}'")
    assert run.info.status == "FINISHED", run.info
    assert mlflow.search_model_versions(f"run_id = '{run.info.run_id}'") == []
    from trainyard.plugins.tracking.runs import source_digest

    # lineage names the team's code (outside git: its digest), not Trainyard's commit
    assert "mlflow.source.git.commit" not in run.data.tags, run.data.tags
    assert run.data.tags["trainyard.source.digest"] == source_digest(team)

    import urllib.request

    view = f"{shared.client.url}/trainyard/dags/{JOB}/runs/{urllib.parse.quote(attempt.dag_run_id, safe='')}"
    with urllib.request.urlopen(view, timeout=30) as page:  # the Trainyard view says the same
        assert NOT_REGISTERED in page.read().decode(), view

    assert (team / "snapshot.pt").is_file()  # its working directory is its own folder
    assert not (REPO_ROOT / "snapshot.pt").exists()


def test_a_start_up_error_ends_the_run_as_the_users_after_one_attempt(shared: RunningStack, tmp_path: Path) -> None:
    """The same ModuleNotFoundError on every rank before a step: `user_error`, given up at once —
    one attempt, no restart of the budget spent — the error line in the note and the job state."""
    team = tmp_path / "team-code"
    script = adapt.write(team, "import transformerz  # not installed\n" + adapt.cpu_port())
    spec = demo_spec("typo-import")
    spec["spec"]["source"] = {"entrypoint": str(script), "args": ["1", "1"]}
    shared.add_jobs({"typo-import": spec})
    first = shared.client.trigger("typo-import", {})["dag_run_id"]
    attempts = follow_training_run(shared.client, "typo-import", first, timeout_s=600)
    assert [(a.state, a.outcome, a.action) for a in attempts] == [("failed", "user_error", "give_up")], \
        f"{attempts}\n{shared.logs()}"
    note = shared.client.dag_run("typo-import", attempts[0].dag_run_id).get("note") or ""
    assert "user_error" in note and "ModuleNotFoundError: No module named 'transformerz'" in note, note

    from trainyard.plugins.recovery.state import JobStateStore

    state = JobStateStore(shared.settings.state_db)
    info = state.get_run("typo-import", attempts[0].run)
    assert info.state == "failed" and "not retried" in info.final_reason, info
    (attempt,) = state.attempts("typo-import", attempts[0].run)
    assert attempt.outcome == "user_error"

