"""Trainyard added to someone else's Airflow, as the README says: a stock Airflow 3.3.2 in a fresh
venv, `trainyard[airflow]` installed beside it from the built wheel, `TRAINYARD_JOBS_DIR` set and
the three-line DAG file (`python -m trainyard.dags`) dropped into a DAGs folder that already holds
the team's own DAG with its own `operators/` package and `config.py`.

Airflow runs as `airflow standalone` (its own all-in-one command: API server, scheduler, DAG
processor, triggerer) with only the settings any local deployment has — nothing of the embedded
stack's. Then: Airflow lists the provider and its plugin, both teams' DAGs parse, and a job trains
and ends green with its model registered and the task's extra links made."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.airflow_stack import demo_spec
from tests.support.procs import free_port
from tests.support.venvs import Venv, built_wheel
from tests.support.waiting import wait_for
from trainyard.plugins.airflow_api import AirflowClient

pytestmark = pytest.mark.slow

JOB = "stock-tiny"
TEAM_DAG = "team_report"
TEAM_FILES = {
    "config.py": "TEAM = 'vision'\n",
    "operators/__init__.py": "",
    "operators/report.py": (
        "from airflow.sdk import BaseOperator\n\n\n"
        "class ReportOperator(BaseOperator):\n"
        "    def __init__(self, *, team: str, **kwargs):\n"
        "        super().__init__(**kwargs)\n"
        "        self.team = team\n\n"
        "    def execute(self, context):\n"
        "        return f'report of team {self.team}'\n"),
    "team_report.py": (
        '"""The team\'s own Airflow DAG, beside Trainyard\'s."""\n'
        "from datetime import datetime\n\n"
        "import config\n"
        "from airflow.sdk import DAG\n"
        "from operators.report import ReportOperator\n\n"
        f"with DAG('{TEAM_DAG}', schedule=None, start_date=datetime(2026, 1, 1)):\n"
        "    ReportOperator(task_id='report', team=config.TEAM)\n"),
}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Venv, Path, dict[str, str]]]:
    """The venv (stock Airflow, then the wheel with its `airflow` extra), the folder, the env."""
    root = tmp_path_factory.mktemp("stock-airflow")
    venv = Venv(root / "venv")
    venv.install("apache-airflow==3.3.2")
    venv.install(f"trainyard[airflow] @ {built_wheel().as_uri()}")
    port = free_port()
    env = {
        "AIRFLOW_HOME": str(root / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # local only: no login
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "TRAINYARD_JOBS_DIR": str(root / "jobs"),
        "TRAINYARD_HOME": str(root / "home"),
    }
    yield venv, root, env
    shutil.rmtree(venv.path, ignore_errors=True)


def test_trainyard_in_a_stock_airflow_lists_its_provider_and_trains_a_job_to_green(
        airflow: tuple[Venv, Path, dict[str, str]]) -> None:
    venv, root, env = airflow
    listed = venv.run(["airflow", "providers", "list", "--output", "json"], cwd=root, env=env, timeout=300)
    assert listed.returncode == 0, listed.stderr[-3000:]
    providers = {p["package_name"]: p for p in json.loads(listed.stdout)}
    assert "trainyard" in providers and "apache-airflow-providers-cncf-kubernetes" in providers

    dags = root / "dags"
    for name, text in TEAM_FILES.items():
        (dags / name).parent.mkdir(parents=True, exist_ok=True)
        (dags / name).write_text(text)
    written = venv.run(["python", "-m", "trainyard.dags"], cwd=root, env=env)
    assert written.returncode == 0 and len(written.stdout.splitlines()) == 3, written.stderr
    (dags / "trainyard_dags.py").write_text(written.stdout)
    _write_job(Path(env["TRAINYARD_JOBS_DIR"]))
    prepared = venv.run(["trainyard", "data", "prepare-demo", "--shards", "2"], cwd=root, env=env)
    assert prepared.returncode == 0, prepared.stderr[-3000:]

    with _standalone(venv, root, env) as client:
        wait_for(lambda: {JOB, TEAM_DAG} <= set(client.dags()), "both teams' DAGs", 240, poll_s=2,
                 detail=client.import_errors)
        assert client.import_errors() == []
        assert "trainyard" in {p["package_name"] for p in client._call("GET", "providers")["providers"]}
        assert "trainyard" in {p["name"] for p in client._call("GET", "plugins")["plugins"]}

        team_run = client.trigger(TEAM_DAG)["dag_run_id"]
        run = client.trigger(JOB, {})["dag_run_id"]
        for dag_id, run_id in ((TEAM_DAG, team_run), (JOB, run)):
            state = wait_for(lambda d=dag_id, r=run_id: _ended(client, d, r), f"{dag_id} to end", 600, poll_s=2,
                             detail=lambda d=dag_id, r=run_id: _states(client, d, r))
            assert state == "success", (dag_id, _states(client, dag_id, run_id), _logs(root))
        assert client.xcom(TEAM_DAG, team_run, "report") == "report of team vision"
        registered = client.xcom(JOB, run, "register_model")
        assert registered["model"] and registered["version"] == "1", registered
        links = client._call("GET", f"dags/{JOB}/dagRuns/{run}/taskInstances/register_model/links")["extra_links"]
        assert links["Model version"].endswith(f"/#/models/{registered['model']}/versions/1"
                                               "?workflowType=machine_learning"), links
        assert f"/runs/{registered['mlflow_run_id']}" in links["MLflow run"], links
        assert links["Trainyard view"].endswith(f"/dags/{JOB}/runs/{run.replace(':', '%3A').replace('+', '%2B')}"
                                                 "/plugin/trainyard-run"), links

        # another team's typo: its own paused DAG says what is wrong; nothing else changes
        broken = yaml.safe_load((Path(env["TRAINYARD_JOBS_DIR"]) / f"{JOB}.yaml").read_text())
        broken["metadata"].update(name="typo-job", team="nlp")
        broken["spec"]["hardware"]["gpuCuont"] = broken["spec"]["hardware"].pop("gpuCount")
        (Path(env["TRAINYARD_JOBS_DIR"]) / "typo-job.yaml").write_text(yaml.safe_dump(broken))
        client.request_parse()
        details = wait_for(lambda: "typo-job" in client.dags() and client.dag_details("typo-job"), "the typo's DAG",
                           120, poll_s=2)
        assert {"trainyard:invalid-spec", "team:nlp"} <= {t["name"] for t in details["tags"]}, details
        assert details["is_paused"] and "did you mean 'gpuCount'" in details["doc_md"], details
        assert {JOB, TEAM_DAG} <= set(client.dags()) and client.import_errors() == []


def _write_job(jobs: Path) -> None:
    """The demo job, smaller and shorter, without data-quality checks (the `validation` extra is
    not installed: `trainyard[airflow]` alone)."""
    spec = demo_spec(JOB)
    spec["spec"]["training"]["maxSteps"] = 20
    spec["spec"]["checkpoint"] = {"intervalSteps": 10, "maxKeep": 2}
    spec["spec"]["dataset"]["quality"] = {"enabled": False}
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / f"{JOB}.yaml").write_text(yaml.safe_dump(spec))


class _standalone:
    """`airflow standalone` of the venv, in its own process group, stopped with it."""

    def __init__(self, venv: Venv, root: Path, env: dict[str, str]) -> None:
        self.venv, self.root, self.env = venv, root, env
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> AirflowClient:
        log = (self.root / "standalone.log").open("wb")
        self.proc = subprocess.Popen([str(self.venv.bin("airflow")), "standalone"], cwd=self.root,
                                     env=self.venv.env(self.env), stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        client = AirflowClient(url=self.env["AIRFLOW__API__BASE_URL"], patience_s=30)

        def healthy() -> bool:
            assert self.proc is not None and self.proc.poll() is None, _logs(self.root)
            try:
                health = client._call("GET", "monitor/health")
            except Exception:  # noqa: BLE001 - not up yet
                return False
            return all(part.get("status") == "healthy" for name, part in health.items()
                       if name in ("metadatabase", "scheduler", "dag_processor", "triggerer"))

        try:
            wait_for(healthy, "airflow standalone to be healthy", 300, poll_s=2, detail=lambda: _logs(self.root))
        except BaseException:
            self.__exit__()  # `with` calls it only once __enter__ has returned: a start that never
            raise            # became healthy left standalone's API server running after the test
        return client

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue


def _ended(client: AirflowClient, dag_id: str, run_id: str) -> str | None:
    state = client.dag_run(dag_id, run_id)["state"]
    return state if state in ("success", "failed") else None


def _states(client: AirflowClient, dag_id: str, run_id: str) -> dict[str, Any]:
    return {t: ti.get("state") for t, ti in client.task_instances(dag_id, run_id).items()}


def _logs(root: Path) -> str:
    log = root / "standalone.log"
    return log.read_text(errors="replace")[-4000:] if log.exists() else ""
