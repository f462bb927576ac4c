"""The structure's figures, counted the same way on any checkout (issue 59's "Done when"):
package cycles, upward arrows, function-level imports in product code, the types that declare
the parallel degrees, and the places that multiply them into a world size.

    python -m tests.support.structure [--root CHECKOUT]

prints one JSON line. The graph, its nodes and floors are `tests/unit/test_import_graph.py`'s;
a node that checkout has and the floors do not know is left out of the upward count (and listed).
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

from tests.unit import test_import_graph as graph

DEGREES = {"tp", "pp", "dp", "cp", "ep", "tp_degree", "pp_degree", "dp_degree", "cp_degree",
           "tensor_parallel", "pipeline_parallel", "data_parallel", "context_parallel"}
"""Field names that hold a parallel degree."""


def function_level_imports(files: list[Path]) -> tuple[int, dict[str, int]]:
    """Import statements inside a function body (each counted once, nested functions included)."""
    per_file: dict[str, int] = {}
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        count = 0

        def visit(node: ast.AST, in_function: bool) -> None:
            nonlocal count
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                    count += 1
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        visit(tree, False)
        if count:
            per_file[str(path.relative_to(graph.ROOT))] = count
    return sum(per_file.values()), per_file


def degree_carriers(files: list[Path]) -> list[str]:
    """Classes with two or more fields (annotated class attributes) named like a degree."""
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                fields = {s.target.id for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
                if len(fields & DEGREES) >= 2:
                    found.append(f"{path.relative_to(graph.ROOT)}:{node.name}")
    return sorted(found)


def world_size_products(files: list[Path]) -> list[str]:
    """Expressions multiplying two or more degrees (`tp * pp * dp`, `self.tp * self.dp`)."""
    def degree(node: ast.AST) -> bool:
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        return name in DEGREES

    def factors(node: ast.AST) -> list[ast.AST]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return factors(node.left) + factors(node.right)
        return [node]

    found = []
    for path in files:
        seen: set[int] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and node.lineno not in seen
                    and sum(degree(f) for f in factors(node)) >= 2):
                seen.add(node.lineno)
                found.append(f"{path.relative_to(graph.ROOT)}:{node.lineno}")
    return sorted(found)


def figures(root: Path) -> dict[str, object]:
    graph.ROOT = root
    graph.edges.cache_clear()
    files = graph.product_files()
    g = graph.package_graph()
    total, per_file = function_level_imports(files)
    carriers = degree_carriers(files)
    products = world_size_products(files)
    return {
        "package_cycles": graph.cycles(g),
        "upward_arrows": graph.upward_arrows(),
        "nodes_without_a_floor": sorted(set(g) - set(graph.FLOOR_OF)),
        "function_level_imports": total,
        "function_level_imports_top": sorted(per_file.items(), key=lambda kv: -kv[1])[:5],
        "degree_carriers": carriers,
        "world_size_products": products,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=graph.ROOT, help="a checkout (default: this one)")
    print(json.dumps(figures(parser.parse_args().root.resolve())))


if __name__ == "__main__":
    main()
