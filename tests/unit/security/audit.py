"""What a call actually touched on the local store, seen by the interpreter itself.

An audit hook (PEP 578) records every `open`, listing, rename and removal the process makes
while `recording()` is active: the hostile-input tests check the *store* — which paths were
read or written — not the error messages. Plus a content snapshot of a folder, so a write that
bypassed Python's file API would still show as a difference.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_EVENTS = {"open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.replace", "os.rmdir",
           "os.mkdir", "os.truncate", "os.chmod", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
_lock = threading.Lock()
_active: list[list[tuple[str, str]]] = []


def _path_of(value: Any) -> str | None:
    if isinstance(value, str | bytes | os.PathLike):
        try:
            return os.path.abspath(os.fsdecode(value))
        except (TypeError, ValueError):
            return None
    return None


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _active or event not in _EVENTS:
        return
    paths = [p for p in map(_path_of, args[:2] if event in ("os.rename", "os.replace", "shutil.copyfile",
                                                              "shutil.move") else args[:1]) if p]
    with _lock:
        for record in _active:
            record.extend((event, p) for p in paths)


sys.addaudithook(_hook)


@contextmanager
def recording() -> Iterator[list[tuple[str, str]]]:
    """`(event, absolute path)` of everything the process touches inside the block."""
    record: list[tuple[str, str]] = []
    with _lock:
        _active.append(record)
    try:
        yield record
    finally:
        with _lock:
            _active.remove(record)


def touched_under(record: list[tuple[str, str]], folder: Path) -> list[tuple[str, str]]:
    """The events of `record` on `folder` or anything inside it."""
    root = os.path.abspath(folder)
    return [(e, p) for e, p in record if p == root or p.startswith(root + os.sep)]


def snapshot(folder: Path) -> dict[str, str]:
    """Relative path → SHA-256 of every file under `folder` (symlinks not followed)."""
    out: dict[str, str] = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out
