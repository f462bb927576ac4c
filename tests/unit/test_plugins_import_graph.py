"""The engines under plugins/ import each other without package cycles (DESIGN §1, "Engines may
import config/ and each other without cycles").

Every import counts, including the ones inside functions: a lazy import hides a cycle from
Python's import machinery, not from a reader (tracking.datasets → validation.dataset while
validation.data_quality → tracking was such a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "plugins"


def package_of(module: str) -> str | None:
    """`trainyard.plugins.advisor.search` → `advisor`; None for anything outside plugins/."""
    parts = module.split(".")
    if parts[:2] != ["trainyard", "plugins"] or len(parts) < 3 or parts[2] == "__init__":
        return None
    return parts[2]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    module = ".".join(("trainyard", *path.relative_to(ROOT).with_suffix("").parts))
    out: set[str] = set()
    for node in ast.walk(tree):  # every import, at any depth: functions, TYPE_CHECKING blocks
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[:-node.level]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{alias.name}" for alias in node.names)
    return out


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PLUGINS.rglob("*.py"):
        source = package_of(".".join(("trainyard", *path.relative_to(ROOT).with_suffix("").parts)))
        if source is None:
            continue
        edges = graph.setdefault(source, set())
        for name in imported_modules(path):
            target = package_of(name)
            if (target is not None and target != source and (PLUGINS / target).exists()) or (target is not None and target != source and (PLUGINS / f"{target}.py").exists()):
                edges.add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_checker_sees_lazy_imports_and_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    # tracking.artifacts imports validation only inside a function; the graph still has the edge.
    assert "validation" in package_graph()["tracking"]


def test_plugins_packages_have_no_import_cycles() -> None:
    graph = package_graph()
    assert {"advisor", "placement", "checkpoint", "storage", "data", "tracking", "validation"} <= set(graph)
    found = cycles(graph)
    detail = "; ".join(" ↔ ".join(c) + " (" + ", ".join(f"{a}→{b}" for a in c for b in sorted(graph[a])
                                                         if b in c) + ")" for c in found)
    assert found == [], f"package cycles under plugins/: {detail}"


def test_the_shared_packages_import_no_engine_that_uses_them() -> None:
    graph = package_graph()
    # plugins/retry.py (the one retry policy) imports only plugins/errors.py: a floor module too.
    assert graph["retry"] <= {"errors"}
    assert graph["storage"] <= {"errors", "retry"}
    # plugins/files.py (write_atomic, standard library only) commits the data cache's entries.
    assert graph["data"] <= {"errors", "storage", "files"}
