"""`make demo` end to end, as a newcomer runs it: the embedded stack comes up, the demo job is
triggered through Airflow with an injected worker crash, recovers, and is registered.

Checked: exit 0; both UIs answered while it ran; the job state holds one training run with a
recovered worker crash; a model version is registered from it; and the pages a person opens —
the Airflow DAG's runs and the MLflow run — rendered by headless Chromium, name the run and its
attempts (screenshots kept beside the test's home for a look).

The run is shortened as a user would shorten it (`--max-steps`, the DAG's `max_steps` Param): 80
steps with the crash at 60 instead of 200 with it at 120, ~90 steps of training instead of ~220
(its cost per step: `tests.e2e.airflow_stack.SMALLER_MODEL`). Every part of the path is the
same; the default's numbers are `trainyard.cli.demo`'s arguments.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support import procs
from tests.support.browser import chromium_page, screenshots

pytestmark = pytest.mark.slow

SHORTER = ("--max-steps", "80", "--crash-at-step", "60")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status == 200
    except OSError:
        return False


def test_make_demo_recovers_registers_and_shows_it_in_both_uis(tmp_path: Path) -> None:
    home = tmp_path / ".trainyard"
    ports = {"TRAINYARD_AIRFLOW_PORT": procs.free_port(), "TRAINYARD_MLFLOW_PORT": procs.free_port(),
             "TRAINYARD_AGENT_PORT": procs.free_ports(2)}  # the two local nodes' agents: port, port + 1
    env = procs.test_env({"TRAINYARD_HOME": str(home), "COLUMNS": "120", **{k: str(v) for k, v in ports.items()}})
    airflow = f"http://127.0.0.1:{ports['TRAINYARD_AIRFLOW_PORT']}"
    mlflow = f"http://127.0.0.1:{ports['TRAINYARD_MLFLOW_PORT']}"
    log = tmp_path / "demo.log"
    from trainyard.cli.stack import default_stack

    try:
        with log.open("w") as out:
            demo = subprocess.Popen([sys.executable, "-m", "trainyard.cli.demo", *SHORTER], cwd=procs.REPO_ROOT, env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
        answered = {"airflow": False, "mlflow": False}
        deadline = time.monotonic() + 1200
        while demo.poll() is None and time.monotonic() < deadline:
            answered["airflow"] |= _answers(f"{airflow}/api/v2/monitor/health")
            answered["mlflow"] |= _answers(f"{mlflow}/health")
            time.sleep(2)
        if demo.poll() is None:
            demo.kill()
        output = log.read_text(errors="replace")
        assert demo.returncode == 0, output[-8000:]
        assert answered == {"airflow": True, "mlflow": True}, answered

        from trainyard.config.settings import Settings
        from trainyard.plugins.state.jobs import JobStateStore
        from trainyard.plugins.tracking.runs import client_for

        settings = Settings(home=home)
        (run,) = JobStateStore(settings.state_db).list_runs("demo-tiny-lm")
        attempts = JobStateStore(settings.state_db).attempts("demo-tiny-lm", run.run)
        assert run.state == "completed" and [(a.outcome, a.action) for a in attempts] == [
            ("worker_crash", "restart"), ("completed", "register")]
        client = client_for(settings.mlflow_tracking_uri)
        (version,) = client.search_model_versions(f"name='demo-tiny-lm' and run_id='{run.mlflow_run_id}'")
        assert version.tags["trainyard.checkpoint.step"]
        # 80 of the spec's 200 steps: registered, and `candidate` left where the spec's rule keeps it
        assert "candidate not moved" in version.tags["trainyard.candidate"], version.tags
        assert "candidate" not in (version.aliases or [])
        assert (home / "demo" / f"demo-tiny-lm-{run.run}.png").stat().st_size > 10_000
        assert f"{airflow}/dags/demo-tiny-lm" in output and run.run in output

        from trainyard.plugins.tracking.ui_links import mlflow_run_url

        experiment = client.get_run(run.mlflow_run_id).info.experiment_id
        shots = {"airflow": screenshots() / "demo-airflow-runs.png", "mlflow": screenshots() / "demo-mlflow-run.png"}
        with chromium_page(width=1600, height=1000) as page:
            page.goto(f"{airflow}/dags/demo-tiny-lm/runs")
            # the hand-over to attempt 1 is a DAG run in the UI
            page.get_by_text(f"{run.run}__attempt-1").first.wait_for()
            page.screenshot(path=str(shots["airflow"]))
            assert "register_model" in page.content()  # the grid beside it: attempt 1's tasks
            page.goto(mlflow_run_url(mlflow, experiment, run.mlflow_run_id))  # as the demo prints it
            page.get_by_text("worker_crash").first.wait_for()  # the recovery, among the run's tags
            page.screenshot(path=str(shots["mlflow"]))
            run_page = page.content()
        assert run.run in run_page and "demo-tiny-lm" in run_page, run_page[-4000:]
        for shot in shots.values():
            assert shot.stat().st_size > 20_000, shot
    finally:
        # the demo leaves it up for browsing; components are found by pid file; the rank
        # templates stay for the other worker's attempts (the session's end stops them)
        default_stack(home).down(templates=False)
