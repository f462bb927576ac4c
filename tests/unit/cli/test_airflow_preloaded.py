"""The parts of the stack that fork tasks or DAG-file parses start with their imports done
(`trainyard.cli.airflow_preloaded`), and then are Airflow's own command line, unchanged."""

from __future__ import annotations

import gc
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.cli import airflow_preloaded
from trainyard.cli.stack import Stack


def test_preload_imports_each_module_and_reports_one_that_fails(capsys: pytest.CaptureFixture[str]) -> None:
    sys.modules.pop("colorsys", None)
    try:
        took = airflow_preloaded.preload(("colorsys", "trainyard_no_such_module"))
    finally:
        gc.unfreeze()  # the preload froze this test process's objects, as it does a forking part's
    assert list(took) == ["colorsys"] and "colorsys" in sys.modules
    assert "trainyard_no_such_module failed to import (ModuleNotFoundError" in capsys.readouterr().err


def test_every_preloaded_module_exists(tmp_path: Path) -> None:
    """A misspelt name would cost nothing visible but the seconds it was meant to save. Its top
    package is looked up as the scheduler does, from outside the checkout (its working folder is
    the home): here the checkout is on `sys.path`, where a bare `plugins.…` (a name from before
    the one import root) was found, while every task of the stack imported that module again."""
    names = airflow_preloaded.PRELOAD + airflow_preloaded.PARSE_PRELOAD
    tops = sorted({name.split(".", 1)[0] for name in names})
    probe = "import importlib.util, sys; print([n for n in sys.argv[1:] if importlib.util.find_spec(n) is None])"
    found = subprocess.run([sys.executable, "-I", "-c", probe, *tops], cwd=tmp_path, capture_output=True,
                           text=True, check=True)
    assert found.stdout.strip() == "[]", found.stdout
    assert [name for name in names if importlib.util.find_spec(name) is None] == []


def test_the_dag_processor_preloads_what_the_dag_files_import_and_nothing_heavy() -> None:
    assert airflow_preloaded.modules_for("dag-processor") == airflow_preloaded.PARSE_PRELOAD
    assert airflow_preloaded.modules_for("scheduler") == airflow_preloaded.PRELOAD
    assert airflow_preloaded.modules_for("celery") == airflow_preloaded.PRELOAD
    from tests.support.imports import DAG_PARSE_HEAVY, assert_none_loaded

    assert_none_loaded("dag_processor_preload", DAG_PARSE_HEAVY)


def test_only_the_parts_that_fork_start_preloaded(tmp_path: Path) -> None:
    """The LocalExecutor's scheduler forks the tasks; with Celery its workers do, and the
    scheduler starts bare (the preload would cost it ~7.5 CPU-s and ~600 MB for nothing)."""
    local = Stack(home=tmp_path / "home")
    launchers = {part: local._command(part)[2] for part in local.components}
    assert launchers == {"api-server": "airflow", "scheduler": "trainyard.cli.airflow_preloaded",
                         "dag-processor": "trainyard.cli.airflow_preloaded", "triggerer": "airflow"}
    assert local._command("scheduler")[3:] == ["scheduler", "--skip-serve-logs"]
    celery = Stack(home=tmp_path / "home", overrides={"AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"})
    launchers = {part: celery._command(part)[2] for part in celery.components}
    assert launchers == {"api-server": "airflow", "scheduler": "airflow", "dag-processor": "trainyard.cli.airflow_preloaded",
                         "triggerer": "airflow", "celery-worker": "trainyard.cli.airflow_preloaded"}


def test_after_the_preload_the_command_line_is_airflows(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    monkeypatch.setattr(airflow_preloaded, "PRELOAD", ("colorsys",))
    monkeypatch.setattr(sys, "argv", ["trainyard.cli.airflow_preloaded", "version"])
    airflow_preloaded.main()
    out = capsys.readouterr()
    assert version("apache-airflow") in out.out and "trainyard preload:" in out.err


def test_the_api_clients_tls_context_is_made_once_before_the_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A supervisor opening its client after the warm-up (in a forked task) builds no context of
    its own: with this Airflow, the one made before the fork is reused."""
    import ssl

    from airflow.sdk.api.client import Client

    Client._get_ssl_context_cached.cache_clear()  # as in a fresh scheduler
    airflow_preloaded.warm_api_client()

    def built_again(*args: object, **kwargs: object) -> ssl.SSLContext:
        raise AssertionError("a second TLS context was built")

    monkeypatch.setattr(ssl, "create_default_context", built_again)
    Client(base_url="http://127.0.0.1:1/execution/", token="t").close()


def test_mlflows_requirement_map_is_made_once_before_the_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking a registered model's requirements in a forked task reads the installed
    distributions no more: the map made before the fork is reused."""
    import importlib.metadata

    from mlflow.utils import requirements_utils

    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)  # as in a fresh scheduler
    airflow_preloaded.warm_mlflow_requirements()
    assert requirements_utils._MODULES_TO_PACKAGES

    reads: list[str] = []  # (MLflow's check turns any error into a warning: count, not raise)

    def read_again() -> dict[str, list[str]]:
        reads.append("packages_distributions")
        return {}

    monkeypatch.setattr(importlib.metadata, "packages_distributions", read_again)
    monkeypatch.setattr(requirements_utils.importlib_metadata, "packages_distributions", read_again)
    requirements_utils.warn_dependency_requirement_mismatches(["torch==2.13.0", "numpy"])
    assert reads == []
