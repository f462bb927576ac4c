"""The core distribution (`pip install trainyard`, no extra) is a training image's whole install:
the built wheel in a fresh venv, where Airflow, Great Expectations and the MLflow server cannot
be imported, runs a rank of the tiny job that checkpoints — Trainyard's own reference script,
and a user's copy of it beside their own `config.py`, `utils.py` and `worker.py` (bare names a
training folder commonly has, which Trainyard's modules must never shadow nor be shadowed by)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.worker.conftest import fsdp_plan, tiny_job
from tests.support.procs import free_port
from tests.support.venvs import Venv, built_wheel
from trainyard.config.worker_env import WorkerEnv
from trainyard.plugins.checkpoint import list_checkpoints
from trainyard.plugins.checkpoint.uris import checkpoint_root

pytestmark = pytest.mark.slow

RUN = "r-core"
USER_MODULES = {
    "config.py": "LEARNING_RATE = 0.003\nNAME = 'the user config'\n",
    "utils.py": "def shout(text):\n    return text.upper()\n",
    "worker.py": "ROLE = 'the user worker'\n",
}


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    venv = Venv(tmp_path_factory.mktemp("core") / "venv")
    venv.install(str(built_wheel()))
    yield venv
    shutil.rmtree(venv.path, ignore_errors=True)


@pytest.fixture(scope="module")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    from trainyard.cli.main import main

    uri = tmp_path_factory.mktemp("objects").as_uri()
    assert main(["data", "prepare-demo", "--object-store", uri, "--shards", "2"]) == 0
    return uri


def test_the_core_install_holds_the_runtime_and_nothing_of_the_control_plane(core: Venv, tmp_path: Path) -> None:
    for absent in ("airflow", "great_expectations", "flask", "sqlalchemy", "kubernetes"):
        assert not core.can_import(absent, cwd=tmp_path), f"{absent} is installed with the core"
    for present in ("trainyard.worker.session", "trainyard.plugins.checkpoint.manager", "trainyard.node_agent.server",
                    "trainyard.plugins.tracking.metrics", "mlflow", "torch", "boto3"):
        assert core.can_import(present, cwd=tmp_path), f"{present} cannot be imported with the core"
    for bare in ("config", "plugins", "worker", "node_agent", "operators", "sensors", "dags", "cli"):
        assert not core.can_import(bare, cwd=tmp_path), f"the wheel installs a bare {bare!r}"


def test_a_rank_of_the_tiny_job_runs_and_checkpoints_on_the_core_alone(core: Venv, object_store: str,
                                                                       tmp_path: Path) -> None:
    script = Path(core.run(["python", "-c", "import trainyard.worker.train as t; print(t.__file__)"],
                           cwd=tmp_path).stdout.strip())
    assert script.is_relative_to(core.path), script  # the installed copy, not the checkout's
    result = _rank(core, script, "core-tiny", object_store, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [c.step for c in list_checkpoints(checkpoint_root(object_store, "core-tiny", RUN))]
    assert steps == [2, 4], steps


def test_a_script_beside_its_own_config_utils_and_worker_modules_runs(core: Venv, object_store: str,
                                                                     tmp_path: Path) -> None:
    """The reference script copied into a team's folder, importing the team's own modules by
    their bare names first: "'config' is not a package" was the worker runtime importing its
    settings as `config.settings` and finding the user's `config.py`."""
    folder = tmp_path / "team-code"
    folder.mkdir()
    for name, text in USER_MODULES.items():
        (folder / name).write_text(text)
    reference = (Path(__file__).resolve().parents[3] / "worker" / "train.py").read_text()
    (folder / "train.py").write_text(reference.replace(
        "from __future__ import annotations\n",
        "from __future__ import annotations\n\nimport config, utils, worker\n"
        "print(utils.shout(config.NAME), '|', worker.ROLE, flush=True)\n", 1))
    result = _rank(core, folder / "train.py", "core-own-modules", object_store, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "THE USER CONFIG | the user worker" in result.stdout
    assert [c.step for c in list_checkpoints(checkpoint_root(object_store, "core-own-modules", RUN))] == [2, 4]


def _rank(core: Venv, script: Path, name: str, object_store: str, tmp_path: Path) -> object:
    """torchrun of the core venv, one process, the launcher's `TRAINYARD_*` contract; run from the
    script's own folder (as a user runs it), outside the checkout."""
    job = tiny_job(name, max_steps=4, interval_steps=2)
    plan = fsdp_plan(world_size=1)
    run_dir = tmp_path / "run"
    env = WorkerEnv(job=name, run=RUN, attempt=0, plan=plan.model_dump_json(),
                    spec=job.model_dump_json(by_alias=True), resume_from="", object_store=object_store,
                    checkpoint_uri=checkpoint_root(object_store, name, RUN),
                    heartbeat_dir=str(run_dir / "heartbeats"), hang_timeout_s=120, run_dir=str(run_dir),
                    mlflow_tracking_uri="", mlflow_run_id="").to_env()
    env["TRAINYARD_DATA_CACHE_DIR"] = str(tmp_path / "data-cache")
    return core.run(["torchrun", "--standalone", "--nproc-per-node=1", "--rdzv-endpoint",
                     f"127.0.0.1:{free_port()}", script], cwd=script.parent, env=env, timeout=600)
