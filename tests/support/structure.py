"""The structure's figures, counted the same way on any checkout (issue 59's "Done when"):
package cycles, upward arrows, function-level imports in product code, the types that declare
the parallel degrees and the places that multiply them into a world size (those two with
`tests/unit/test_one_carrier_of_degrees.py`'s scan).

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
from tests.unit import test_one_carrier_of_degrees as degrees


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


def figures(root: Path) -> dict[str, object]:
    graph.ROOT = root
    graph.edges.cache_clear()
    files = graph.product_files()
    g = graph.package_graph()
    total, per_file = function_level_imports(files)
    return {
        "package_cycles": graph.cycles(g),
        "upward_arrows": graph.upward_arrows(),
        "nodes_without_a_floor": sorted(set(g) - set(graph.FLOOR_OF)),
        "function_level_imports": total,
        "function_level_imports_top": sorted(per_file.items(), key=lambda kv: -kv[1])[:5],
        "degree_carriers": sorted(f"{path}:{cls}" for path, cls in degrees.carriers(root)),
        "world_size_products": degrees.world_size_products(root),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=graph.ROOT, help="a checkout (default: this one)")
    print(json.dumps(figures(parser.parse_args().root.resolve())))


if __name__ == "__main__":
    main()
