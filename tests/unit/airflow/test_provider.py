"""Trainyard is an Airflow provider (DESIGN §1): what `get_provider_info` says is what Airflow's
schema accepts and what the package holds, and the installed distribution declares it."""

from __future__ import annotations

import importlib
import json
from importlib import metadata
from pathlib import Path

import pytest

from trainyard.provider import get_provider_info


def test_the_provider_info_is_valid_for_airflows_own_schema() -> None:
    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "trainyard" and info["versions"] == [metadata.version("trainyard")]


@pytest.mark.parametrize("kind", ["operators", "sensors", "triggers"])
def test_every_listed_module_imports_and_holds_what_it_is_listed_for(kind: str) -> None:
    from airflow.sdk import BaseOperator
    from airflow.triggers.base import BaseTrigger

    base = BaseTrigger if kind == "triggers" else BaseOperator
    for entry in get_provider_info()[kind]:
        for name in entry["python-modules"]:
            module = importlib.import_module(name)
            found = [v for v in vars(module).values()
                     if isinstance(v, type) and issubclass(v, base) and v.__module__ == name]
            assert found, name


def test_the_extra_links_and_the_plugin_resolve() -> None:
    from airflow.plugins_manager import AirflowPlugin
    from airflow.sdk import BaseOperatorLink

    info = get_provider_info()
    links = [_load(path) for path in info["extra-links"]]
    assert all(issubclass(link, BaseOperatorLink) for link in links)
    assert {link.name for link in links} == {"MLflow run", "Trainyard view", "Model version"}
    plugins = [_load(p["plugin-class"]) for p in info["plugins"]]
    assert all(issubclass(plugin, AirflowPlugin) for plugin in plugins)
    assert [plugin.name for plugin in plugins] == [p["name"] for p in info["plugins"]] == ["trainyard", "trainyard-marked-failed"]
    assert [m.__name__ for m in plugins[1].listeners] == ["trainyard.sensors.marked_failed"]


def test_the_installed_distribution_declares_the_provider_and_its_plugin() -> None:
    """Airflow finds providers by the `apache_airflow_provider` entry point, and — under its
    default lazy provider discovery — plugins only by the `airflow.plugins` one."""
    points = metadata.distribution("trainyard").entry_points
    provider = {p.name: p.value for p in points if p.group == "apache_airflow_provider"}
    plugins = {p.name: p.value for p in points if p.group == "airflow.plugins"}
    assert provider == {"provider_info": "trainyard.provider:get_provider_info"}
    assert plugins == {"trainyard": "trainyard.plugins.trainyard_plugin:TrainyardPlugin",
                       "trainyard-marked-failed": "trainyard.sensors.marked_failed:MarkedFailedPlugin"}
    assert {v.replace(":", ".") for v in plugins.values()} == {p["plugin-class"] for p in get_provider_info()["plugins"]}


def test_the_embedded_airflow_reads_the_one_dag_file_and_an_empty_plugins_folder(tmp_path: Path) -> None:
    from trainyard.config.airflow import DAG_FILE, airflow_env

    env = airflow_env(tmp_path, base={})
    dags, plugins = Path(env["AIRFLOW__CORE__DAGS_FOLDER"]), Path(env["AIRFLOW__CORE__PLUGINS_FOLDER"])
    assert [p.name for p in dags.iterdir()] == ["trainyard_dags.py"]
    assert (dags / "trainyard_dags.py").read_text() == DAG_FILE and len(DAG_FILE.splitlines()) == 3
    assert list(plugins.iterdir()) == []
    assert "PYTHONPATH" not in env  # Trainyard comes from the installed distribution, not a folder


def _load(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)
