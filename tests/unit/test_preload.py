"""The preload of the processes that fork (a rank template, an attempt's starter, Airflow's
scheduler): what it imported is kept out of the forked children's garbage collections."""

from __future__ import annotations

import subprocess
import sys

from tests.support import procs

CHECK = """
import gc, json
from trainyard.plugins.preload import preload
before = gc.get_freeze_count()
took = preload(["json", "no_such_module_here"], who="test")
print(json.dumps({"took": sorted(took), "before": before, "after": gc.get_freeze_count()}))
"""


def test_what_the_preload_imported_is_frozen_and_a_missing_module_is_reported_and_skipped() -> None:
    import json

    done = subprocess.run([sys.executable, "-c", CHECK], cwd=procs.REPO_ROOT, capture_output=True, text=True,
                          timeout=60, check=True)
    result = json.loads(done.stdout)
    assert result["took"] == ["json"]
    assert result["before"] == 0 < result["after"], result  # fails when the preload does not freeze
    assert "test: no_such_module_here failed to import (ModuleNotFoundError" in done.stderr, done.stderr
