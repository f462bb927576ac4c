"""Every error an engine raises on purpose says whether to retry (DESIGN §1, plugins/errors.py):
it derives from `FatalError` or `TransientError`, never both and never neither.

The classes are found by scanning the source (ast) for exception classes defined under
plugins/, node_agent/ and config/, and the ones actually raised (`raise X(...)`,
`raise X.of(...)`) must be fatal or transient; family bases (`CheckpointError`,
`Unschedulable`, …) need only be `TrainyardError`s.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.errors import FatalError, TrainyardError, TransientError, is_retryable

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("plugins", "node_agent", "config")
EXCEPTION_BASES = {"Exception", "ValueError", "RuntimeError", "FileNotFoundError", "OSError"}


def scan() -> tuple[dict[str, str], set[str]]:
    """({exception class: module}, {names raised})."""
    classes: dict[str, tuple[str, list[str]]] = {}
    raised: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(("trainyard", *path.relative_to(ROOT).with_suffix("").parts))
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                    classes[node.name] = (module, bases)
                elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    func = node.exc.func
                    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                        func = func.value  # Unschedulable.of(...)
                    if isinstance(func, ast.Name):
                        raised.add(func.id)
    errors: dict[str, str] = {}
    changed = True
    while changed:  # exception classes: a known exception base, or a base that is one
        changed = False
        for name, (module, bases) in classes.items():
            if name not in errors and any(b in EXCEPTION_BASES or b in errors or b.endswith("Error")
                                          for b in bases):
                errors[name] = module
                changed = True
    return errors, raised


ERRORS, RAISED = scan()


def load(name: str) -> type[BaseException]:
    return getattr(importlib.import_module(ERRORS[name]), name)


def test_the_scan_finds_the_engine_errors() -> None:
    for name in ("LaunchError", "ReservationConflict", "NeverSchedulable", "AgentUnreachable", "SpecError",
                 "IntegrityError", "CheckpointSaveError"):
        assert name in ERRORS, name
    assert {"LaunchError", "ReservationConflict", "Unschedulable", "SpecError"} <= RAISED


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_every_engine_error_is_a_trainyard_error(name: str) -> None:
    assert issubclass(load(name), TrainyardError), f"{name} ({ERRORS[name]}) must derive from trainyard.plugins.errors"


@pytest.mark.parametrize("name", sorted(n for n in RAISED if n in ERRORS))
def test_every_raised_error_says_whether_to_retry(name: str) -> None:
    cls = load(name)
    if name == "Unschedulable":  # raised through Unschedulable.of: one of its two subclasses
        subclasses = cls.__subclasses__()
        assert {c.__name__ for c in subclasses} == {"NeverSchedulable", "NotSchedulableNow"}
        return
    fatal, transient = issubclass(cls, FatalError), issubclass(cls, TransientError)
    assert fatal != transient, f"{name}: fatal={fatal}, transient={transient}"
    assert cls.retryable is transient


def test_the_classes_callers_rely_on_keep_their_other_bases() -> None:
    from trainyard.config.problems import SpecError
    from trainyard.plugins.storage.errors import ObjectNotFoundError, UnsafeKeyError

    assert issubclass(ObjectNotFoundError, FileNotFoundError) and issubclass(UnsafeKeyError, ValueError)
    assert issubclass(SpecError, ValueError) and not is_retryable(SpecError([]))


def test_unschedulable_tells_not_now_from_never() -> None:
    from tests.unit.placement.placement_fixtures import busy, inventory
    from trainyard.plugins.placement.gang import place_gang
    from trainyard.plugins.placement.model import (
        GangRequest,
        NeverSchedulable,
        NotSchedulableNow,
        Unschedulable,
    )

    inv = inventory([(2, 8, "H100")])
    with pytest.raises(NeverSchedulable) as never:  # 32 devices on a 16-device cluster
        place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8, dp=4)), inv)
    assert never.value.reason.permanent and not is_retryable(never.value)
    with pytest.raises(NeverSchedulable, match="no A100 nodes"):
        place_gang(GangRequest(job="j", gpu_type="A100", layout=RankLayout(tp=8)), inv)
    full = busy(inv, {n.name: 8 for n in inv.nodes})
    with pytest.raises(NotSchedulableNow) as later:  # fits the cluster, which is busy now
        place_gang(GangRequest(job="j", gpu_type="H100", layout=RankLayout(tp=8, dp=2)), inv, full)
    assert isinstance(later.value, Unschedulable) and is_retryable(later.value)
    assert later.value.reason.code == "not_enough_nodes" and not later.value.reason.permanent
