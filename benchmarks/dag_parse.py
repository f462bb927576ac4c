"""DAG parse benchmark: how long Airflow takes to parse the DAG folder with many specs.

    .venv/bin/python benchmarks/dag_parse.py [--specs 100] [--repeat 3]

`--specs` copies of the demo spec (distinct job names) in a temporary jobs folder, then, each
in a fresh interpreter with Airflow already imported (as in the dag-processor) so only the parse
is timed, median of `--repeat`:

- `full_parse_s`: `DagBag` of a DAGs folder holding the one Trainyard DAG file
  (`trainyard.config.airflow.DAG_FILE`: every spec read, validated offline and built; the
  platform's maintenance and data DAGs too — `dags` counts them all);
- `single_dag_parse_s`: the same file with Airflow's parsing context naming one DAG (what a
  task's process parses);
- `bare_factory_parse_s`: the baseline, in the same run — a factory that reads the same YAML
  files with `yaml.safe_load` and builds the same task graph from `EmptyOperator`s, with no
  validation.

Targets: full parse ≤ 5× the bare factory and under 3 s; one DAG under 1 s. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "config" / "jobs" / "demo-tiny-lm.yaml"

_TIMED = r"""
import os, sys, time
from airflow.dag_processing.dagbag import DagBag  # imported before timing, as in the dag-processor
import airflow.sdk, airflow.providers.standard.operators.empty, airflow.providers.standard.operators.trigger_dagrun
start = time.perf_counter()
bag = DagBag({folder!r})
elapsed = time.perf_counter() - start
assert not bag.import_errors, bag.import_errors
print(elapsed, len(bag.dags))
"""

_BARE = '''
from pathlib import Path
import yaml
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

TASKS = ["validate_spec", "validate_data", "plan_parallelism", "place_gang", "launch_training"]
WATCH = ["watch_training", "watch_checkpoints", "watch_health"]
ACTIONS = ["restart", "replace_node", "rollback", "fall_back", "replan", "requeue"]
for path in sorted(Path({jobs!r}).glob("*.yaml")):
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    with DAG(dag_id=name, schedule=None) as dag:
        chain = [EmptyOperator(task_id=t) for t in TASKS]
        for a, b in zip(chain, chain[1:]):
            a >> b
        classify = EmptyOperator(task_id="classify_outcome")
        chain[-1] >> [EmptyOperator(task_id=w) for w in WATCH] >> classify
        release, choose = EmptyOperator(task_id="release_gang"), EmptyOperator(task_id="choose_action")
        classify >> release >> choose
        resume = EmptyOperator(task_id="resume_next_attempt")
        for action in ACTIONS:
            choose >> EmptyOperator(task_id=action) >> resume
        choose >> [EmptyOperator(task_id=t) for t in ("register_model", "give_up", "cancelled")]
    globals()[name] = dag
'''


def _time(folder: Path, env: dict[str, str]) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", _TIMED.format(repo=str(REPO), folder=str(folder))],
                         env=env, capture_output=True, text=True, check=True, cwd=REPO)
    elapsed, dags = out.stdout.strip().splitlines()[-1].split()
    return float(elapsed), int(dags)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--specs", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        jobs, bare = Path(tmp) / "jobs", Path(tmp) / "bare"
        jobs.mkdir()
        bare.mkdir()
        text = DEMO.read_text()
        for i in range(args.specs):
            (jobs / f"job-{i:03d}.yaml").write_text(text.replace("name: demo-tiny-lm", f"name: job-{i:03d}"))
        (bare / "bare_factory.py").write_text(_BARE.format(jobs=str(jobs)))
        from trainyard.config.airflow import write_dag_file

        dag_folder = write_dag_file(Path(tmp) / "airflow").parent
        env = {**os.environ, "TRAINYARD_JOBS_DIR": str(jobs), "AIRFLOW_HOME": str(Path(tmp) / "airflow"),
               "TRAINYARD_HOME": str(Path(tmp) / "home"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "TRAINYARD_DEMO_DAGS": "true"}
        env.pop("_AIRFLOW_PARSING_CONTEXT_DAG_ID", None)
        one = {**env, "_AIRFLOW_PARSING_CONTEXT_DAG_ID": "job-042"}
        full, single, base = [], [], []
        dags_total = 0
        for _ in range(args.repeat):
            seconds, dags = _time(dag_folder, env)
            assert dags >= args.specs, f"{dags} DAGs from {args.specs} specs"  # + the platform's own DAGs
            full.append(seconds)
            dags_total = dags
            seconds, dags = _time(dag_folder, one)
            assert dags == 1
            single.append(seconds)
            seconds, dags = _time(bare, env)
            assert dags == args.specs
            base.append(seconds)
    result = {"specs": args.specs, "dags": dags_total, "full_parse_s": round(statistics.median(full), 3),
              "single_dag_parse_s": round(statistics.median(single), 3),
              "bare_factory_parse_s": round(statistics.median(base), 3)}
    result["full_over_bare"] = round(result["full_parse_s"] / result["bare_factory_parse_s"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
