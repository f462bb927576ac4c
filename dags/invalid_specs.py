"""Specs in the jobs folder that do not validate, shown as the DAG file's import error.

Airflow shows an import error per DAG file ("Broken DAG" in the UI, `importErrors` in the REST
API). An exception raised while the file runs would drop every DAG of it; a DAG that fails
Airflow's own validation is rejected alone, its error recorded as the file's import error
(`DagBag.process_file`: "Error bagging DAG"). So the invalid specs travel as one stand-in DAG
whose `validate()` raises their full reports in the `trainyard validate` format, and every valid
job's DAG built beside it stays. Nothing to report: no stand-in, no error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import DAG

if TYPE_CHECKING:
    from pathlib import Path

    from trainyard.config.problems import Problem

DAG_ID = "trainyard_invalid_specs"


class InvalidSpecs(ValueError):
    """Every invalid spec's report: the message Airflow shows as the DAG file's import error."""

    def __init__(self, broken: list[tuple[Path, list[Problem]]]) -> None:
        lines = []
        for path, problems in broken:
            errors = [p for p in problems if p.severity == "error"]
            lines.append(f"✗ {path}: {len(errors)} error(s)")
            lines += [f"  {p.code.value} {p.render()}" for p in errors]
        super().__init__(f"{len(broken)} TrainingJob spec(s) do not validate; their DAGs are not "
                         "built until they do:\n" + "\n".join(lines))


class InvalidSpecsDag(DAG):
    """Never scheduled: Airflow validates every DAG before taking it, and this one's validation
    is the invalid specs' report."""

    @classmethod
    def of(cls, broken: list[tuple[Path, list[Problem]]]) -> InvalidSpecsDag:
        dag = cls(dag_id=DAG_ID, schedule=None, tags=["trainyard"])
        dag.broken = broken
        return dag

    def validate(self) -> None:
        raise InvalidSpecs(self.broken)
