"""plugins/recovery/ decides over values it is handed and does no I/O of its own (DESIGN §1:
"`plugins/recovery/` only decides … no I/O"): no files, no network, no database, no object
store, no launcher. The attempt engine (`plugins/attempt/`) gathers the evidence, looks up the
checkpoints and carries out the quarantines.

Two checks: every module's source, parsed (every import at any depth — a lazy import inside a
function or under TYPE_CHECKING counts — and every file-reading call); and what importing the
package actually loads, so an I/O stack pulled in through a helper module shows too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RECOVERY = ROOT / "plugins" / "recovery"

BANNED_MODULES = (
    # network
    "urllib", "http", "requests", "httpx", "urllib3", "socket", "aiohttp", "kubernetes",
    # processes, files
    "subprocess", "os", "pathlib", "shutil", "tempfile", "io", "glob",
    # databases, stores, tracking
    "sqlalchemy", "boto3", "botocore", "mlflow",
    # the engines that do the I/O
    "trainyard.plugins.storage", "trainyard.plugins.checkpoint.catalog", "trainyard.plugins.launch",
    "trainyard.plugins.state", "trainyard.plugins.attempt", "trainyard.plugins.tracking",
    "trainyard.node_agent.client", "trainyard.node_agent.server",
)
"""A module under plugins/recovery imports none of these (nor anything under them)."""

BANNED_NAMES = frozenset({
    "read_model", "read_exits", "read_rank_records", "read_heartbeats", "write_heartbeat", "write_atomic",
    "fetch_health", "open_store", "select_latest_valid", "list_checkpoints", "quarantine",
})
"""I/O functions of allowed modules (`plugins/run/records.py` holds both the record models and
their readers): recovery may import the models, never the readers."""

BANNED_CALLS = frozenset({"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink",
                          "iterdir", "glob", "rglob", "touch", "exists", "urlopen"})
"""Calls that touch the file system (`open(…)`, `Path(…).read_text()`, …) or the network."""


def banned(module: str) -> bool:
    return any(module == b or module.startswith(f"{b}.") for b in BANNED_MODULES)


def impurities(source: str, filename: str = "<source>") -> list[str]:
    """Every I/O import or call in `source`, as `line N: what`."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if banned(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if banned(node.module):
                found.append(f"line {node.lineno}: from {node.module} import …")
            else:
                found += [f"line {node.lineno}: from {node.module} import {a.name}" for a in node.names
                          if a.name in BANNED_NAMES or banned(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name in BANNED_CALLS:
                found.append(f"line {node.lineno}: {name}(…)")
    return sorted(found, key=lambda hit: int(hit.split(":")[0].removeprefix("line ")))


def test_the_checker_finds_io_wherever_it_hides() -> None:
    source = '''
import json, urllib.request
from pathlib import Path
from trainyard.plugins.run.records import DivergenceRecord, read_model
from trainyard.plugins import state
def late(p):
    from trainyard.plugins.checkpoint.catalog import CheckpointRecord
    import sqlalchemy.orm
    return open(p).read() + Path(p).read_text()
'''
    assert impurities(source) == [
        "line 2: import urllib.request", "line 3: from pathlib import …",
        "line 4: from trainyard.plugins.run.records import read_model",
        "line 5: from trainyard.plugins import state",
        "line 7: from trainyard.plugins.checkpoint.catalog import …", "line 8: import sqlalchemy.orm",
        "line 9: read_text(…)", "line 9: open(…)"]
    assert impurities("import json\nfrom trainyard.plugins.run.records import DivergenceRecord\n") == []


def test_no_module_under_plugins_recovery_does_io() -> None:
    modules = sorted(RECOVERY.rglob("*.py"))
    assert {p.name for p in modules} >= {"classify.py", "decide.py", "evidence.py", "model.py"}
    found = {str(p.relative_to(ROOT)): hits for p in modules
             if (hits := impurities(p.read_text(), str(p)))}
    assert found == {}, f"recovery must stay pure (the attempt engine does the I/O): {found}"


def test_importing_recovery_loads_no_io_stack() -> None:
    """What `import` really loads: an engine or a client pulled in through a helper module."""
    code = ("import sys\n"
            "import trainyard.plugins.recovery.classify, trainyard.plugins.recovery.decide\n"
            "print('\\n'.join(sys.modules))\n")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=ROOT).stdout.split()
    third_party_and_engines = [b for b in BANNED_MODULES if "." in b or b in (
        "requests", "httpx", "urllib3", "aiohttp", "kubernetes", "sqlalchemy", "boto3", "botocore", "mlflow")]
    heavy = sorted(m for m in loaded if any(m == b or m.startswith(f"{b}.") for b in third_party_and_engines))
    assert heavy == [], f"importing recovery loads {heavy}"
