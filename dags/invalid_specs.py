"""A spec in the jobs folder that does not validate: a DAG of its own that says so and runs nothing.

Why not Airflow's import error ("Broken DAG")? Airflow keeps one import error per DAG *file*, and
when a file has one it marks every DAG of that file stale (`_update_import_errors`): with the one
Trainyard DAG file, a single team's typo would hide every team's jobs. So each invalid spec
becomes its own DAG instead, under the job's name when the file gives one (its runs stay in the
history of the DAG it was):

- created paused, never scheduled; its description and documentation carry the full report in
  the `trainyard validate` format, its tags the team and `trainyard:invalid-spec`;
- its one task, `spec_is_invalid`, fails with that report if anyone triggers it;
- `trainyard submit` sees the tag and prints the report instead of waiting for a DAG.
Every valid spec's DAG is built beside it as usual.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING

from airflow.sdk import DAG

from trainyard.config.airflow import INVALID_SPEC_TAG
from trainyard.operators.validate import SpecIsInvalidOperator

if TYPE_CHECKING:
    from pathlib import Path

    from trainyard.config.problems import Problem

START = datetime(2026, 1, 1)


def report(path: Path, problems: list[Problem]) -> str:
    """`✗ <file>: N error(s)` and one line per error, as `trainyard validate` prints them."""
    errors = [p for p in problems if p.severity == "error"]
    return "\n".join([f"✗ {path}: {len(errors)} error(s)", *(f"  {p.code.value} {p.render()}" for p in errors)])


def invalid_spec_dag(path: Path, problems: list[Problem], taken: set[str]) -> DAG:
    """Named after the job (`metadata.name`) when the file gives a name no valid spec has; else
    `invalid-spec-<file name>`."""
    declared = _metadata(path)
    name, team = declared.get("name"), declared.get("team")
    dag_id = name if name and name not in taken else \
        "invalid-spec-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem).strip("-") or "unnamed")
    text = report(path, problems)
    errors = sum(p.severity == "error" for p in problems)
    with DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False, is_paused_upon_creation=True,
             max_active_runs=1, tags=["trainyard", INVALID_SPEC_TAG, *([f"team:{team}"] if team else [])],
             description=f"INVALID SPEC ({errors} error(s)): not runnable until {path.name} validates",
             doc_md=f"**The TrainingJob spec `{path}` does not validate**; this DAG runs nothing until it "
                    f"does. Fix the spec (`trainyard validate {path.name}`):\n\n```\n{text}\n```\n") as dag:
        SpecIsInvalidOperator(task_id="spec_is_invalid", report=text)
    return dag


def _metadata(path: Path) -> dict[str, str]:
    """`metadata`'s fields that read as short names, as the file writes them (best effort: the
    file did not validate; nothing when it is unreadable, not YAML or has no such mapping)."""
    from trainyard.config.safe_yaml import load_documents

    try:
        (doc,) = load_documents(path.read_text())
        items = doc["metadata"].items()
    except Exception:  # noqa: BLE001 - unreadable, not YAML, several documents, no mapping
        return {}
    return {k: v for k, v in items
            if isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", v)}
