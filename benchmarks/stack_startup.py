"""Embedded stack benchmark: how long the stack takes to come up, and what it costs idle, on the
embedded PostgreSQL (the default) against SQLite files, in the same run.

    .venv/bin/python benchmarks/stack_startup.py [--settle-s 20] [--idle-s 30]

Each database choice in a fresh temporary Trainyard home, as the end-to-end tests start it
(`tests/e2e/airflow_stack.running_stack`: the embedded PostgreSQL first, `airflow db migrate`,
the four Airflow parts, MLflow; the demo dataset written):

- `startup_s`: from the call to a healthy stack (every part answering);
- `idle_cpu_pct`: after `--settle-s` (the first DAG parse), the CPU time the home's processes
  (`trainyard.plugins.run.processes.of_home`) use over `--idle-s`, as % of one core; `idle_cpu_pct_by_part`
  splits it by command (the top ones).

SQLite is the same stack with `AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`, `TRAINYARD_STATE_DB` and
`TRAINYARD_MLFLOW_TRACKING_URI` set to files (`trainyard.cli.stack.Stack.postgres` is then None). Prints
one JSON line, with `cpu_count` and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settle-s", type=float, default=20.0, help="wait after start-up before measuring idle CPU")
    p.add_argument("--idle-s", type=float, default=30.0, help="how long idle CPU is measured")
    args = p.parse_args()
    out: dict[str, Any] = {"cpu_count": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="bench-stack-") as tmp:
        sqlite = Path(tmp, "sqlite")
        sqlite.mkdir()
        for name, overrides in (("postgres", {}), ("sqlite", {
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{sqlite}/airflow.db",
                "TRAINYARD_STATE_DB": f"sqlite:///{sqlite}/state.db",
                "TRAINYARD_MLFLOW_TRACKING_URI": f"sqlite:///{sqlite}/mlflow.db"})):
            out[name] = measure(Path(tmp, name), overrides, args)
    out["startup_postgres_vs_sqlite"] = round(out["postgres"]["startup_s"] / out["sqlite"]["startup_s"], 2)
    print(json.dumps(out))
    return 0


def measure(home: Path, overrides: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    from tests.e2e.airflow_stack import running_stack
    from trainyard.plugins.run import processes

    began = time.perf_counter()
    with running_stack(home, overrides=overrides or None):
        startup = time.perf_counter() - began
        time.sleep(args.settle_s)
        pids = processes.of_home(home)
        before = {pid: processes.cpu_seconds(pid) for pid in pids}
        time.sleep(args.idle_s)
        by_part: collections.Counter[str] = collections.Counter()
        for pid, start in before.items():
            now = processes.cpu_seconds(pid)
            if start is not None and now is not None:
                by_part[_part(pid)] += (now - start) / args.idle_s * 100
    return {"startup_s": round(startup, 1), "idle_cpu_pct": round(sum(by_part.values()), 1),
            "idle_cpu_pct_by_part": {k: round(v, 1) for k, v in by_part.most_common(6)}}


def _part(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    if "airflow" in words:  # `python -m airflow scheduler …`
        return "airflow " + words[words.index("airflow") + 1]
    return " ".join(words[:2])[-40:] or "?"


if __name__ == "__main__":
    sys.exit(main())
