"""The README's layout section, made from the tree: each product room and the first sentence of
its own docstring, so the map cannot fall behind the code (a new package, a renamed one, a room
whose purpose changed). `tests/unit/test_layout.py` fails while the README holds another text;
`make layout` (this module with `--write`) writes it.

A room is a package (a folder with `__init__.py`) of the product's folders, or a loose module
directly under `plugins/`; a nested package is listed under its parent.
"""

from __future__ import annotations

import argparse
import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("trainyard", "config", "plugins", "worker", "node_agent", "operators", "sensors", "dags", "cli")
OUTSIDE = (
    ("tests/", "unit/ integration/ e2e/ — mirrors the package layout; support/ holds the harness"),
    ("benchmarks/", "scripts that print one JSON line of figures against a same-run competitor"),
    ("docs/", "notes: the advisor against published runs, bringing your own training code"),
)
"""The folders that are not installed: said here, since they have no docstring of their own."""
BEGIN, END = "<!-- layout: made by `make layout` from each package's docstring -->", "<!-- /layout -->"
WIDTH, INDENT = 100, 21


def rooms(root: Path = ROOT) -> list[tuple[str, Path]]:
    """(name as shown, the file whose docstring describes it), in the order a reader walks down."""
    found: list[tuple[str, Path]] = []
    for folder in FOLDERS:
        top = root / folder
        packages = sorted(p.parent for p in top.rglob("__init__.py") if "__pycache__" not in p.parts)
        for package in packages:
            found.append((f"{package.relative_to(root).as_posix()}/", package / "__init__.py"))
        if folder == "plugins":
            found += [(f"plugins/{m.name}", m) for m in sorted(top.glob("*.py")) if m.name != "__init__.py"]
    return found


def first_sentence(path: Path) -> str:
    """The docstring's first sentence, on one line: up to the first full stop outside brackets."""
    doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    depth, match = 0, None
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "." and depth == 0 and text[i + 1: i + 2] in (" ", "") and text[i - 4: i] != " e.g":
            match = i
            break
    sentence = text[:match] if match is not None else text
    if not sentence:
        raise ValueError(f"{path} has no docstring: say what the room is for")
    return sentence.rstrip(".:")


def block(root: Path = ROOT) -> str:
    entries = [(name, first_sentence(path)) for name, path in rooms(root)] + list(OUTSIDE)
    lines = []
    for name, what in entries:
        wrapped = textwrap.wrap(what, WIDTH - INDENT) or [""]
        lines.append(f"{name:<{INDENT - 1}} {wrapped[0]}" if len(name) < INDENT else f"{name}\n{' ' * INDENT}{wrapped[0]}")
        lines += [" " * INDENT + rest for rest in wrapped[1:]]
    return "\n".join([BEGIN, "```", *lines, "```", END])


def readme_block(readme: Path = ROOT / "README.md") -> str:
    text = readme.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0:
        raise ValueError(f"README.md has no layout markers ({BEGIN} … {END})")
    return text[start: end + len(END)]


def write(readme: Path = ROOT / "README.md") -> bool:
    """Rewrite the README's block; True when it changed."""
    old, new = readme_block(readme), block()
    if old != new:
        readme.write_text(readme.read_text().replace(old, new))
    return old != new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md's layout section")
    if parser.parse_args().write:
        print("README.md: layout rewritten" if write() else "README.md: layout already current")
    else:
        print(block())


if __name__ == "__main__":
    main()
