"""Third-party training code through the DAG, unchanged: pytorch/examples' DDP tutorial
(`tests/fixtures/ddp_tutorial/`, CPU-ported in its 3 device lines), in a team's folder beside
the team's own `config.py` and `utils.py`, as the spec's `source.path` and entrypoint, in a spec
of only metadata, source and hardware. It writes no checkpoint of
Trainyard's (a plain script), so the run ends completed and *not registered* — by design, said the
same way by the DAG run (green, its note), the job state and MLflow (the run FINISHED, no model
version) — never an attempted and failed registration. It runs in its own folder: the snapshot
it writes relative to the working directory lands there, not in Trainyard's checkout; its rank
logs are on the MLflow run. A plain script that goes still is stopped as hung (by its ranks'
activity)."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from tests.e2e.airflow_stack import RunningStack, demo_spec
from tests.fixtures.ddp_tutorial import adapt
from tests.support.procs import REPO_ROOT
from trainyard.plugins.airflow_api import follow_training_run
from trainyard.plugins.recovery.model import NOT_REGISTERED

pytestmark = pytest.mark.slow

JOB = "ddp-tutorial-plain"


def minimal_spec(name: str, script: Path, args: list[str], *, in_folder: bool = False,
                 **spec: object) -> dict[str, object]:
    """A spec with only metadata, source and hardware (and what `spec` adds): no dataset, no
    model hints, no checkpoint section, no maxSteps — what a team's own script needs. The script
    by its path, or (`in_folder`) as `source.path` (its folder) and the entrypoint's name in it."""
    demo = demo_spec(name)
    source = {"path": str(script.parent), "entrypoint": script.name} if in_folder else {"entrypoint": str(script)}
    return {"apiVersion": demo["apiVersion"], "kind": demo["kind"], "metadata": demo["metadata"],
            "spec": {"source": {**source, "args": args}, "hardware": demo["spec"]["hardware"], **spec}}


def test_a_stock_torchrun_script_runs_unchanged_to_an_honest_green_not_registered(
        shared: RunningStack, tmp_path: Path) -> None:
    team = tmp_path / "team-code"
    script = adapt.write(team, adapt.cpu_port())
    (team / "config.py").write_text("raise RuntimeError('the team config is not imported by Trainyard')\n")
    (team / "utils.py").write_text("raise RuntimeError('the team utils are not imported by Trainyard')\n")
    # reaches it as TRAINYARD_LEARNING_RATE, not as a --lr its parser would refuse
    spec = minimal_spec(JOB, script, ["2", "1", "--batch_size", "32"], in_folder=True,
                        training={"learningRate": 0.01})
    shared.add_jobs({JOB: spec})

    first = shared.client.trigger(JOB, {})["dag_run_id"]
    attempts = follow_training_run(shared.client, JOB, first, timeout_s=600)
    assert [(a.state, a.outcome, a.action) for a in attempts] == [("success", "completed", "finish")], \
        f"{attempts}\n{shared.logs()}"
    (attempt,) = attempts
    assert attempt.tasks["finish_run"] == "success" and attempt.tasks["register_model"] == "skipped"
    assert attempt.tasks["validate_data"] == "success"  # no dataset: nothing to check, and it says so
    note = shared.client.dag_run(JOB, attempt.dag_run_id).get("note") or ""
    assert note == f"attempt 0: completed → {NOT_REGISTERED}", note

    from trainyard.plugins.state.jobs import JobStateStore
    from trainyard.plugins.tracking.runs import client_for

    info = JobStateStore(shared.settings.state_db).get_run(JOB, attempt.run)
    assert info.state == "completed" and NOT_REGISTERED in info.final_reason, info
    mlflow = client_for(shared.settings.mlflow_tracking_uri)
    experiment = mlflow.get_experiment_by_name("demo/tiny-lm")
    (run,) = mlflow.search_runs([experiment.experiment_id], filter_string=f"tags.`trainyard.run` = '{attempt.run}'")
    assert run.info.status == "FINISHED", run.info
    assert mlflow.search_model_versions(f"run_id = '{run.info.run_id}'") == []
    artifacts = {f.path for f in mlflow.list_artifacts(run.info.run_id, "logs/attempt-0")}
    assert artifacts == {"logs/attempt-0/rank-00000.log", "logs/attempt-0/rank-00001.log"}, artifacts
    from trainyard.plugins.tracking.runs import source_digest

    # lineage names the team's code (outside git: its digest), not Trainyard's commit
    assert "mlflow.source.git.commit" not in run.data.tags, run.data.tags
    assert run.data.tags["trainyard.source.digest"] == source_digest(team)

    import urllib.request

    from trainyard.plugins.recovery.outcome import outcome_line

    said = outcome_line(info.state, info.final_reason)  # "completed, not registered — the script wrote no …"
    assert said.startswith("completed, not registered — the script wrote no Trainyard checkpoint"), said
    view = f"{shared.client.url}/trainyard/dags/{JOB}/runs/{urllib.parse.quote(attempt.dag_run_id, safe='')}"
    with urllib.request.urlopen(view, timeout=30) as page:  # the Trainyard view says the same
        assert html.escape(said, quote=False) in page.read().decode(), view
    from tests.support.browser import chromium_page, screenshots

    with chromium_page() as browser:  # as a person sees it: the DAG run's Trainyard tab in Airflow
        browser.goto(f"{shared.stack.url}/dags/{JOB}/runs/{urllib.parse.quote(attempt.dag_run_id, safe='')}"
                     "/plugin/trainyard-run", wait_until="networkidle")
        tab = browser.frame_locator('iframe[title="Trainyard"]')
        tab.get_by_text(said).first.wait_for()
        browser.screenshot(path=str(screenshots() / "plain-script-run-tab.png"), full_page=True)

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

    from trainyard.plugins.state.jobs import JobStateStore

    state = JobStateStore(shared.settings.state_db)
    info = state.get_run("typo-import", attempts[0].run)
    assert info.state == "failed" and "not retried" in info.final_reason, info
    (attempt,) = state.attempts("typo-import", attempts[0].run)
    assert attempt.outcome == "user_error"



def test_a_plain_script_that_stops_making_progress_is_stopped_as_hung(shared: RunningStack, tmp_path: Path) -> None:
    """(e): a plain script writes no heartbeat; its ranks' activity (CPU time and I/O, written by
    their wrappers) stands in, so a gang that goes still is stopped as `hang` within its
    `hangTimeout`, plus one pulse of the watch and one poll of the training trigger (with 2 s
    for a loaded machine) — and with no budget left the run ends there, `hang` on every surface."""
    from tests.integration.launch.test_launch_hang import PLAIN_STUCK
    from trainyard.plugins.launch.activity import pulse_s
    from trainyard.plugins.run.records import STOP_REASON_FILE, StopReason

    script, still = tmp_path / "team-code" / "stuck.py", tmp_path / "still-at"
    script.parent.mkdir()
    script.write_text(PLAIN_STUCK)
    hang_timeout = 6.0
    spec = minimal_spec("plain-hang", script, [str(still)],
                        faultTolerance={"hangTimeout": f"{hang_timeout:g}s", "maxRestarts": 0, "inPlaceRestarts": 0})
    shared.add_jobs({"plain-hang": spec})
    first = shared.client.trigger("plain-hang", {})["dag_run_id"]
    attempts = follow_training_run(shared.client, "plain-hang", first, timeout_s=600)
    assert [(a.state, a.outcome) for a in attempts] == [("failed", "hang")], f"{attempts}\n{shared.logs()}"
    note = shared.client.dag_run("plain-hang", attempts[0].dag_run_id).get("note") or ""
    assert "hang" in note and "used no CPU and did no I/O" in note, note

    from trainyard.plugins.state.jobs import JobStateStore

    (attempt,) = JobStateStore(shared.settings.state_db).attempts("plain-hang", attempts[0].run)
    assert attempt.outcome == "hang", attempt
    reason = StopReason.model_validate_json((Path(attempt.run_handle.run_dir) / STOP_REASON_FILE).read_text())
    went_still = float(still.read_text())
    assert hang_timeout < reason.at - went_still <= hang_timeout + pulse_s(hang_timeout) + 2.0 + 2.0, \
        (reason.at - went_still, reason)


def test_a_managed_script_from_a_pinned_commit_recovers_from_a_killed_rank_and_registers(
        shared: RunningStack, tmp_path: Path) -> None:
    """(b) and (c): the tutorial's managed adaptation (9 added lines, nothing changed or
    re-indented: `tests/fixtures/ddp_tutorial/adapt.py`'s `MANAGED` is the diff) committed to a
    local bare repository whose branch then moved on; the spec pins the commit. Rank 1 is killed
    before step 25: the run recovers from the session's checkpoint, the loss has a point for
    every step on one MLflow run, the model is registered, and the lineage names the pinned
    commit — not Trainyard's."""
    import subprocess

    from trainyard.plugins.tracking.runs import client_for

    work, bare = tmp_path / "work", tmp_path / "tutorial.git"
    adapt.write(work, adapt.managed())
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "the tutorial, managed"], check=True)
    pinned = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (work / "multigpu_torchrun.py").write_text("raise SystemExit('the branch moved on: not this code')\n")
    subprocess.run([*git, "commit", "-qam", "moved on"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)

    spec = minimal_spec("managed-from-git", Path("multigpu_torchrun.py"), ["50", "100", "--batch_size", "32"],
                        training={"maxSteps": 40}, checkpoint={"intervalSteps": 10})
    spec["spec"]["source"] = {"git": {"repo": str(bare), "commit": pinned}, "entrypoint": "multigpu_torchrun.py",
                              "args": ["50", "100", "--batch_size", "32"]}
    shared.add_jobs({"managed-from-git": spec})
    first = shared.client.trigger("managed-from-git", {"fault_kill_rank": 1, "fault_kill_at_step": 25})["dag_run_id"]
    attempts = follow_training_run(shared.client, "managed-from-git", first, timeout_s=600)
    assert attempts[-1].state == "success" and attempts[-1].tasks["register_model"] == "success", \
        f"{attempts}\n{shared.logs()}"
    assert (shared.settings.home / "sources" / pinned / "multigpu_torchrun.py").read_text() == adapt.managed()

    logs = "".join(p.read_text(errors="replace")
                   for p in (shared.settings.runs_dir / "managed-from-git" / attempts[0].run).glob("*/ranks/rank-*.log"))
    assert "killed" in logs.lower() or len(attempts) > 1 or "restart 1" in logs, logs[-3000:]
    assert "trainyard [rank 0]: resumed from step" in logs, logs[-3000:]

    mlflow = client_for(shared.settings.mlflow_tracking_uri)
    (run,) = mlflow.search_runs([mlflow.get_experiment_by_name("demo/tiny-lm").experiment_id],
                                filter_string=f"tags.`trainyard.run` = '{attempts[0].run}'")
    assert {m.step for m in mlflow.get_metric_history(run.info.run_id, "loss")} == set(range(1, 41))
    assert [v.version for v in mlflow.search_model_versions(f"run_id = '{run.info.run_id}'")], run.info
    assert run.data.tags["mlflow.source.git.commit"] == pinned
    assert run.data.tags["mlflow.source.git.repoURL"] == str(bare)
