"""Processes that open a fresh SQLite MLflow store at the same moment all get a working store.

MLflow creates a store's tables on first open with no guard; before `client_for` took a lock,
three processes released together failed 2 of 3 ("table … already exists", "duplicate column",
a half-applied migration) — the launch tasks of two triggers on a new stack did the same.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.support.procs import REPO_ROOT

OPENER = """
import sys, time
from pathlib import Path
from trainyard.plugins.tracking.runs import client_for, ensure_experiment
import mlflow  # imported before the start signal, so the opens overlap
go = Path(sys.argv[2])
Path(sys.argv[3]).touch()  # ready
while not go.exists():
    time.sleep(0.01)
client = client_for(sys.argv[1])
ensure_experiment(client, "team/project")
print("opened")
"""


def test_processes_opening_a_fresh_store_together_all_succeed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, uri, str(go), str(r)], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in ready]
    deadline = time.monotonic() + 300
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    go.touch()  # all three open the store now
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0 and "opened" in out, err[-2000:]
    from trainyard.plugins.tracking.runs import client_for

    assert client_for(uri).get_experiment_by_name("team/project") is not None
