"""Data-triggered retraining with its promotion gate, in a real Airflow: `trainyard data publish`
emits the dataset's asset event → the job scheduled on it (`retrain.onAsset`) trains the tiny
2-rank CPU job → `register_model` → `evaluate` scores the new version against `production` →
`approve_promotion` waits for a person (Airflow's HITL `awaiting_input`) → the test answers
Approve through the REST API, as the UI's Required actions does → `production` moves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.airflow_stack import RunningStack, demo_spec

pytestmark = pytest.mark.slow

JOB = "demo-retrain"


def _spec() -> dict[str, Any]:
    doc = demo_spec(JOB, smaller=False)
    doc["spec"]["training"]["maxSteps"] = 20
    doc["spec"]["checkpoint"]["intervalSteps"] = 10
    doc["spec"]["retrain"] = {"onAsset": "datasets/pydoc-topics/", "promote": "manual", "evalSamples": 8}
    return doc


def test_publish_trains_evaluates_waits_for_approval_and_promotes(shared: RunningStack, tmp_path: Path) -> None:
    from tests.unit.tracking.factories import make_job, register_llama_version
    from trainyard.cli.main import main
    from trainyard.plugins.tracking.registry import move_alias, version_at

    s = shared
    uri = s.settings.mlflow_tracking_uri
    # production already holds an untrained version, so the approval shows both versions
    seeded = register_llama_version(uri, tmp_path, make_job(JOB), s.settings.object_store, train_steps=0, alias="")
    move_alias(JOB, "production", seeded, tracking_uri=uri, by="seed")
    s.add_jobs({JOB: _spec()})
    assert s.client.dag_runs(JOB) == []  # nothing runs until data lands
    assert main(["data", "publish", "datasets/pydoc-topics/", "--version", "v2",
                 "--airflow-url", s.stack.url]) == 0
    runs = s.until("an asset-triggered run", lambda: s.client.dag_runs(JOB), timeout_s=120, poll_s=2)
    (run,) = runs
    assert run["run_type"] == "asset_triggered"
    run_id = run["dag_run_id"]

    def awaiting() -> dict[str, Any] | None:
        tasks = s.client.task_instances(JOB, run_id)
        failed = {t: v["state"] for t, v in tasks.items() if v["state"] in ("failed", "upstream_failed")}
        assert not failed, f"{failed}\n{s.logs()}"
        return tasks if tasks.get("approve_promotion", {}).get("state") == "awaiting_input" else None

    tasks = s.until("the approval to wait", awaiting, timeout_s=900, poll_s=2)
    assert tasks["register_model"]["state"] == tasks["evaluate"]["state"] == "success"
    assert tasks["promote_model"]["state"] in (None, "none", "scheduled", "queued")
    new = str(s.client.xcom(JOB, run_id, "register_model")["version"])
    detail = s.client.hitl_detail(JOB, run_id, "approve_promotion")
    assert detail["options"] == ["Approve", "Reject"]
    assert f"version **{new}**" in detail["body"] and f"production (v{seeded})" in detail["body"]
    evaluated = s.client.xcom(JOB, run_id, "evaluate")
    assert f"{evaluated['candidate']['loss']:.4f}" in detail["body"]
    assert f"{evaluated['production']['loss']:.4f}" in detail["body"]
    assert version_at(JOB, "production", tracking_uri=uri).version == seeded  # nothing moved yet

    # Answer only once the scheduler has taken the pausing worker's exit: Airflow 3.3 marks an
    # approval answered before that "changed externally" and fails it (seen in CI, where the
    # answer came 0.5 s after the pause). A person reading the page never answers that fast.
    exited = ("Received executor event with state success for task instance TaskInstanceKey("
              f"dag_id='{JOB}', task_id='approve_promotion'")
    s.until("the scheduler to see the approval's worker exit",
            lambda: exited in s.stack.log_file("scheduler").read_text(errors="replace"),
            timeout_s=120, poll_s=2)
    answer = s.client.respond_hitl(JOB, run_id, "approve_promotion", ["Approve"])
    assert answer["chosen_options"] == ["Approve"]
    s.until("the run to succeed", lambda: s.client.dag_run(JOB, run_id)["state"] == "success",
            timeout_s=180, poll_s=2)
    assert s.client.task_instances(JOB, run_id)["promote_model"]["state"] == "success"
    assert version_at(JOB, "production", tracking_uri=uri).version == new
