"""The MLflow app's browser defaults: where they go in MLflow's page, and that MLflow's UI still
reads them under those names (an MLflow upgrade that renames a key fails here, not silently)."""

from __future__ import annotations

import re
from pathlib import Path

from trainyard.plugins.tracking.mlflow_app import BROWSER_DEFAULTS, DEFAULTS_SCRIPT, with_defaults


def test_the_defaults_run_first_in_the_head_before_the_ui_scripts() -> None:
    page = '<!doctype html><html><head><meta charset="utf-8"/><script src="/static-files/main.js"></script></head></html>'
    out = with_defaults(page)
    assert out.startswith("<!doctype html><html><head>" + DEFAULTS_SCRIPT + '<meta charset="utf-8"/>')
    assert out.index(DEFAULTS_SCRIPT) < out.index("main.js")


def test_every_default_is_a_key_mlflows_ui_reads() -> None:
    import mlflow.server

    bundle = "".join(p.read_text(errors="replace") for p in
                     (Path(mlflow.server.__file__).parent / "js" / "build" / "static" / "js").glob("main.*.js"))
    read = {f"{key}_v{version}" for key, version in re.findall(r'key:"(mlflow\.[\w.]+)",version:(\d+)', bundle)}
    assert set(BROWSER_DEFAULTS) <= read, sorted(read)
    assert '"genai"' in bundle and '"machine_learning"' in bundle  # the switch's two values
