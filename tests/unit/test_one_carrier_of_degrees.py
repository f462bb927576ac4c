"""The parallel degrees have one carrier, `RankLayout`, and `world_size` one computation (#59).

Eight types used to hold tp/pp/dp/cp ints of their own (`Plan`, the advisor's `Layout` and
`Pins`, `GangRequest`, `Placement`, the control room's `PlanView`, …) and five computed
`tp * pp * dp * cp`; copies like that drift apart (a fifth degree added to one of them and not
the others). The scan below reads the product's source with `ast`, so it needs no import and
sees every class, whatever its base: pydantic models, dataclasses, NamedTuples, plain classes.

Allowed: `RankLayout` itself (and `Coords`, a rank's coordinates on the four dimensions, in the
same module), and the spec's `Parallelism` — the user writes those degrees (as
`tensorParallel`, …), and the advisor converts them to a `RankLayout` in one place
(`planner.manual_layout`, the search's pins).

One product is left outside `RankLayout`: `config/rules.py` checks that the degrees the user
wrote multiply to `gpuCount` and names the product in its message. It checks the spec alone,
before any engine is loaded, and `config/` may not import the advisor (DESIGN §1: dependencies
point down); `ALLOWED_PRODUCTS` names it so that a new one fails here.

Run as a script (`python tests/unit/test_one_carrier_of_degrees.py [ROOT]`) it prints the counts
for any checkout, which is how the before/after figures of #59 were measured.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "plugins", "worker", "node_agent", "cli", "operators", "sensors", "dags",
            "benchmarks")
DEGREE_NAMES = frozenset({
    "tp", "pp", "dp", "cp",
    *(f"{d}_{suffix}" for d in ("tp", "pp", "dp", "cp") for suffix in ("degree", "size")),
    "tensor_parallel", "pipeline_parallel", "data_parallel", "context_parallel",
})
"""Names a field holding a parallel degree goes by."""
HOME = "plugins/advisor/rank_layout.py"
ALLOWED_CARRIERS = {(HOME, "RankLayout"), (HOME, "Coords"), ("config/spec.py", "Parallelism")}
ALLOWED_PRODUCTS = ("config/rules.py",)
WORLD_FACTORS = frozenset({"tp", "pp", "dp"})
"""A product whose factors include these three is a world size (cp may or may not be there)."""


def product_files(root: Path) -> Iterator[tuple[str, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            yield str(path.relative_to(root)), ast.parse(path.read_text(), filename=str(path))


def degree_fields(cls: ast.ClassDef) -> set[str]:
    """Degree-named fields a class declares (annotated class attributes) or sets on `self`."""
    out = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)
           and isinstance(n.target, ast.Name) and n.target.id in DEGREE_NAMES}
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        out |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                and t.value.id == "self" and t.attr in DEGREE_NAMES}
    return out


def carriers(root: Path = ROOT) -> dict[tuple[str, str], set[str]]:
    """(file, class) → the degree fields it holds, for every class that holds any."""
    return {(path, node.name): fields
            for path, tree in product_files(root)
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            if (fields := degree_fields(node))}


def _factors(node: ast.expr) -> list[str] | None:
    """The leaf names of a `*` chain (`a.tp * b["pp"] * dp` → tp, pp, dp); None if not one."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = _factors(node.left), _factors(node.right)
        return (left or []) + (right or []) if left is not None or right is not None else None
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)):
        return [node.slice.value]  # size["tp"]
    return []


def world_size_products(root: Path = ROOT) -> list[str]:
    """`file:line` of every product of tp, pp and dp (a world size), outermost chains only."""
    out: list[tuple[str, int]] = []
    for path, tree in product_files(root):
        inner: set[int] = set()
        for node in ast.walk(tree):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)) or id(node) in inner:
                continue
            inner |= {id(n) for n in ast.walk(node) if n is not node}
            if set(_factors(node) or []) >= WORLD_FACTORS:
                out.append((path, node.lineno))
    return [f"{path}:{line}" for path, line in sorted(out)]


def test_the_scan_finds_the_carrier_and_its_product() -> None:
    found = carriers()
    assert found[(HOME, "RankLayout")] >= {"tp", "pp", "dp", "cp"}
    assert found[("config/spec.py", "Parallelism")] >= {"tensor_parallel", "data_parallel"}
    assert f"{HOME}:{_world_size_line()}" in world_size_products()


def _world_size_line() -> int:
    tree = ast.parse((ROOT / HOME).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RankLayout")
    prop = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "world_size")
    return next(n.lineno for n in ast.walk(prop) if isinstance(n, ast.BinOp))


def test_the_degrees_are_declared_in_one_type() -> None:
    others = {f"{path}:{cls}": sorted(fields) for (path, cls), fields in carriers().items()
              if (path, cls) not in ALLOWED_CARRIERS}
    assert others == {}, "hold a RankLayout instead of degrees of your own: " + str(others)


def test_world_size_is_computed_in_one_place() -> None:
    products = [w for w in world_size_products() if w.split(":")[0] not in ALLOWED_PRODUCTS]
    assert products == [f"{HOME}:{_world_size_line()}"], (
        "use RankLayout.world_size instead of multiplying the degrees")


def test_the_scan_would_see_a_second_carrier(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "x.py").write_text(
        "class Gang:\n    tp: int = 1\n    def __init__(self):\n        self.dp_degree = 2\n"
        "    def n(self):\n        return 2 * self.tp * (self.pp) * self.dp\n"
        "def m(d):\n    return d['tp'] * d['pp'] * d['dp'] * d['cp']\n")
    assert carriers(tmp_path) == {("plugins/x.py", "Gang"): {"tp", "dp_degree"}}
    assert world_size_products(tmp_path) == ["plugins/x.py:6", "plugins/x.py:8"]


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    found = carriers(root)
    products = world_size_products(root)
    print(f"classes holding degree fields: {len(found)}")
    for (path, cls), fields in sorted(found.items()):
        print(f"  {path}:{cls} {sorted(fields)}")
    print(f"world-size products (tp*pp*dp[*cp]): {len(products)}")
    for where in products:
        print(f"  {where}")
