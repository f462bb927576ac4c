"""README.md's layout section is the tree's own account of itself (`tests/support/layout.py`): a
package added, moved or renamed, or a room whose docstring changed, fails here until `make layout`
writes the section again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import layout


def test_the_readme_layout_is_made_from_the_tree() -> None:
    assert layout.readme_block() == layout.block(), "README.md's layout is stale: run `make layout`"


def test_every_package_is_in_the_layout() -> None:
    shown = layout.block()
    packages = {p.parent.relative_to(layout.ROOT).as_posix() + "/" for folder in layout.FOLDERS
                for p in (layout.ROOT / folder).rglob("__init__.py") if "__pycache__" not in p.parts}
    assert packages and all(f"\n{name}" in shown for name in packages)
    assert "\nplugins/run/" in shown


def test_a_room_without_a_docstring_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "__init__.py"
    bare.write_text("X = 1\n")
    with pytest.raises(ValueError, match="has no docstring"):
        layout.first_sentence(bare)
