"""What importing our cheap modules drags in, measured once per test session in one fresh
interpreter (not one interpreter per check: each costs seconds of start-up on two cores).

The steps import in order, from the strictest rule to the loosest (the node agent's models may
not even load `http.server`; the DAG file loads Airflow), and record every module loaded so far
after each step. A check reads the modules loaded up to its step: a heavy module there was
brought in by its step or an earlier one — `first_step_with` names which.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support import procs

STEPS: dict[str, str] = {
    "node_agent": "import trainyard.node_agent.models, trainyard.node_agent.client",
    "kubernetes_adapter": "import trainyard.operators.kubernetes_clients",
    "metrics_streamer": "import trainyard.plugins.tracking.metrics",
    "tracking_and_validation": "\n".join(f"import {m}" for m in (
        "trainyard.plugins.tracking.runs", "trainyard.plugins.tracking.registry", "trainyard.plugins.tracking.cost",
        "trainyard.plugins.data.datasets", "trainyard.plugins.data.rows", "trainyard.plugins.data.shards", "trainyard.plugins.storage.store",
        "trainyard.plugins.tracking.system_metrics", "trainyard.plugins.validation.data_quality", "trainyard.cli.models", "trainyard.cli.cost")),
    "dag_files": "from trainyard.dags import dags; dags()",
    "dag_processor_preload": "from trainyard.cli.airflow_preloaded import PARSE_PRELOAD, preload; preload(PARSE_PRELOAD)",
}

DAG_PARSE_HEAVY = frozenset({"torch", "mlflow", "boto3", "great_expectations"})
"""What neither a parse of the DAG files nor the DAG processor's preload may load: each parse would
pay for it (tasks import their heavy modules when they run)."""

_PROBE = """
import json, sys
steps = json.loads(sys.argv[1])
seen = {}
for name, code in steps.items():
    exec(compile(code, name, "exec"), {})
    seen[name] = sorted(sys.modules)
print("@@MODULES " + json.dumps(seen))
"""


@functools.cache
def loaded_after() -> dict[str, list[str]]:
    """Step → every module loaded once it (and the steps before it) ran."""
    with tempfile.TemporaryDirectory(prefix="trainyard-imports-") as tmp:
        env = procs.test_env({"AIRFLOW_HOME": str(Path(tmp) / "airflow"), "TRAINYARD_HOME": str(Path(tmp) / "home"),
                              "TRAINYARD_JOBS_DIR": str(procs.REPO_ROOT / "config" / "jobs")})
        env.pop("_AIRFLOW_PARSING_CONTEXT_DAG_ID", None)
        out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(STEPS)], cwd=procs.REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=300, check=False)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("@@MODULES ")), None)
    assert out.returncode == 0 and line, f"the import probe failed ({out.returncode}):\n{out.stderr[-4000:]}"
    return json.loads(line.removeprefix("@@MODULES "))


def _matches(module: str, heavy: str) -> bool:
    return module == heavy or module.startswith(heavy + ".")


def heavy_loaded(step: str, heavy: set[str]) -> list[str]:
    """The `heavy` top-level modules (or their submodules) loaded up to `step`."""
    return sorted({h for h in heavy for m in loaded_after()[step] if _matches(m, h)})


def first_step_with(module: str) -> str | None:
    """The step whose imports first loaded `module` (for the failure message)."""
    return next((s for s in STEPS if any(_matches(m, module) for m in loaded_after()[s])), None)


def assert_none_loaded(step: str, heavy: set[str]) -> None:
    found = heavy_loaded(step, heavy)
    assert found == [], {m: f"first loaded by step {first_step_with(m)!r}: {STEPS[first_step_with(m)]}"
                         for m in found}
