"""One name, one thing: no two public classes or `Literal` aliases share a name across the
engines, the worker, the node agent and config (DESIGN §1 "One source per concept").

Two classes called `RunStatus` (a launcher model and a tracking Literal) or `NodeHealth` (a
cluster-file section and the node agent's report) read the same and mean different things; an
import of the wrong one type-checks by accident. Private names (`_Model`) are exempt.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "plugins", "worker", "node_agent", "cli")


def public_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Subscript)
              and isinstance(node.value.value, ast.Name) and node.value.value.id == "Literal"):
            names.add(node.targets[0].id)
    return {n for n in names if not n.startswith("_")}


def definitions() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in public_names(path):
                where[name].append(str(path.relative_to(ROOT)))
    return where


def test_the_scan_sees_classes_and_literal_aliases() -> None:
    where = definitions()
    assert where["RankLayout"] == ["plugins/advisor/rank_layout.py"]
    assert where["Recompute"] == ["config/spec.py"] and where["Precision"] == ["config/spec.py"]


def test_no_public_name_is_defined_twice() -> None:
    twice = {name: paths for name, paths in definitions().items() if len(paths) > 1}
    assert twice == {}, "one name, two things: " + "; ".join(f"{n} in {', '.join(p)}" for n, p in twice.items())
