"""DESIGN §1: one import root. Airflow's plugin loader must not import the engines under
`plugins/` a second time under bare names; `plugins/.airflowignore` keeps them out."""

from __future__ import annotations

from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[3] / "plugins"


def test_airflows_plugin_loader_sees_no_engine_module() -> None:
    from airflow._shared.module_loading.file_discovery import find_path_from_directory

    def engines(ignore_file: str) -> list[Path]:
        seen = [Path(p).relative_to(PLUGINS) for p in find_path_from_directory(PLUGINS, ignore_file, "glob")]
        return [p for p in seen if p.suffix == ".py" and p.name != "trainyard_plugin.py"]

    assert engines(".airflowignore") == [], "Airflow would import these through a second path"
    assert len(engines(".no-such-ignore-file")) > 20  # what the ignore file keeps out
