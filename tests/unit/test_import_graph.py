"""Dependencies point down (DESIGN §1): every product package sits on a declared floor, imports
only its own floor and the ones below, and no packages import each other in a cycle.

Every import counts, including the ones inside functions and `TYPE_CHECKING` blocks: a lazy import
hides a cycle from Python's import machinery, not from a reader (tracking.datasets → validation
while validation.data_quality → tracking was such a cycle; launch → worker → tracking → launch
another).

A node of the graph is a top-level folder (`worker`, `cli`, …) or one room under `plugins/` (a
package, or a loose module such as `plugins/errors.py`). A new room fails
`test_every_package_sits_on_a_floor` until it is given a floor below.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("config", "plugins", "worker", "node_agent", "operators", "sensors", "dags", "cli")

FLOORS: tuple[tuple[str, frozenset[str]], ...] = (
    ("the run's floor: stdlib and pydantic",
     frozenset({"plugins.errors", "plugins.files", "plugins.run"})),
    ("what a job, a cluster and a team are", frozenset({"config"})),
    ("shared services: the retry policy, the object store, the preload",
     frozenset({"plugins.retry", "plugins.storage", "plugins.preload"})),
    ("engines: no Airflow, no processes of their own",
     frozenset({"plugins.advisor", "plugins.placement", "plugins.checkpoint", "plugins.data",
                "plugins.validation", "plugins.launch", "plugins.tracking"})),
    ("beside the training: the ranks' runtime and the node agent",
     frozenset({"worker", "node_agent"})),
    ("the control plane over engines and processes, and its SQL state (which stores their values)",
     frozenset({"plugins.recovery", "plugins.state", "plugins.attempt", "plugins.control_room",
                "plugins.airflow_api"})),
    ("Airflow's tasks and the plugin it loads", frozenset({"operators", "plugins.trainyard_plugin"})),
    ("deferrable watchers over the tasks", frozenset({"sensors"})),
    ("the DAG file and the command line", frozenset({"dags", "cli"})),
)
"""Bottom to top. A package may import its own floor (without cycles) and any floor below it.
The worker sits above the engines it uses inside a rank (checkpoint, data, tracking's metrics
streamer, DESIGN §1), and below the control plane that launches it; what the two exchange lives on
the bottom floor (`plugins/run/`), so neither imports the other for it."""

FLOOR_OF = {node: level for level, (_, nodes) in enumerate(FLOORS) for node in nodes}


def node_of(module: str) -> str | None:
    """`trainyard.plugins.advisor.search` → `plugins.advisor`, `trainyard.cli.main` → `cli`; None
    outside the product (and for `trainyard` itself or the bare `trainyard.plugins`)."""
    parts = module.split(".")
    if parts[0] != "trainyard" or len(parts) < 2 or parts[1] not in FOLDERS:
        return None
    if parts[1] == "plugins":
        if len(parts) < 3 or parts[2] == "__init__":
            return None
        return f"plugins.{parts[2]}"
    return parts[1]


def module_name(path: Path) -> str:
    return ".".join(("trainyard", *path.relative_to(ROOT).with_suffix("").parts))


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    module = module_name(path)
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


def product_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


@cache
def edges() -> dict[tuple[str, str], tuple[str, ...]]:
    """(importer, imported) → the files that make the arrow."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in product_files():
        source = node_of(module_name(path))
        if source is None:
            continue
        for name in imported_modules(path):
            target = node_of(name)
            if target is not None and target != source and node_exists(target):
                found.setdefault((source, target), []).append(str(path.relative_to(ROOT)))
    return {edge: tuple(sorted(set(files))) for edge, files in found.items()}


def node_exists(node: str) -> bool:
    """`plugins.advisor.plan` names a package attribute, `plugins.plan_job` would not exist."""
    relative = Path(*node.split("."))
    return (ROOT / relative).is_dir() or (ROOT / relative).with_suffix(".py").exists()


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {node_of(module_name(p)) or "": set() for p in product_files()}
    graph.pop("", None)
    for source, target in edges():
        graph[source].add(target)
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


def upward_arrows() -> list[str]:
    return [f"{a} → {b} ({', '.join(files)})" for (a, b), files in sorted(edges().items())
            if a in FLOOR_OF and b in FLOOR_OF and FLOOR_OF[b] > FLOOR_OF[a]]


def test_the_checker_sees_lazy_imports_and_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    # tracking.artifacts imports validation only inside a function; the graph still has the edge.
    assert "plugins.validation" in package_graph()["plugins.tracking"]
    assert node_of("trainyard.plugins.run.records") == "plugins.run"
    assert node_of("trainyard.cli.main") == "cli"
    assert node_of("trainyard.plugins") is None and node_of("torch.nn") is None


def test_every_package_sits_on_a_floor() -> None:
    graph = package_graph()
    assert {"plugins.advisor", "plugins.run", "worker", "node_agent", "operators", "sensors", "cli"} <= set(graph)
    unplaced = sorted(set(graph) - set(FLOOR_OF))
    assert unplaced == [], f"give these a floor in FLOORS: {unplaced}"


def test_no_package_imports_upward() -> None:
    assert upward_arrows() == []


def test_product_packages_have_no_import_cycles() -> None:
    graph = package_graph()
    found = cycles(graph)
    detail = "; ".join(" ↔ ".join(c) + " (" + ", ".join(f"{a}→{b}" for a in c for b in sorted(graph[a])
                                                         if b in c) + ")" for c in found)
    assert found == [], f"package cycles: {detail}"


def test_the_floor_imports_nothing_above_the_standard_library_and_pydantic() -> None:
    """The run's floor is what every process of a run imports, a rank's wrapper included."""
    allowed = {"pydantic", "pydantic_core", "typing_extensions", "trainyard"}
    for path in product_files():
        if node_of(module_name(path)) not in FLOORS[0][1]:
            continue
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top in allowed or top == "__future__":
                continue
            assert top in _stdlib(), f"{path.relative_to(ROOT)} imports {name}"


@cache
def _stdlib() -> frozenset[str]:
    import sys

    return frozenset(sys.stdlib_module_names)


def test_the_shared_packages_import_no_engine_that_uses_them() -> None:
    graph = package_graph()
    assert graph["plugins.retry"] <= {"plugins.errors"}
    assert graph["plugins.storage"] <= {"plugins.errors", "plugins.retry"}
    assert graph["plugins.run"] <= {"plugins.files"}
    # plugins/files.py (write_atomic, standard library only) commits the data cache's entries.
    assert graph["plugins.data"] <= {"config", "plugins.errors", "plugins.storage", "plugins.files"}


def test_ruff_bans_the_bare_name_of_every_folder_and_engine() -> None:
    """A bare `import launch` would load a second copy beside `trainyard.plugins.launch` (two class
    identities) or a user's own module of that name: ruff's banned-api refuses each one, and a new
    engine cannot be left off the list."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    banned = set(config["tool"]["ruff"]["lint"]["flake8-tidy-imports"]["banned-api"])
    packages = {p.name for p in (ROOT / "plugins").iterdir() if (p / "__init__.py").exists()}
    assert set(FOLDERS) | packages <= banned, sorted(set(FOLDERS) | packages - banned)
