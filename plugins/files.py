"""`write_atomic`: replace a small file so that a reader sees the old content or the new, never
half of either — the one implementation for every file one process writes and another reads
(rank records, agent exit files, the divergence record, heartbeats, the run handle).

Write to a unique temporary name in the same folder (same filesystem, so the rename is atomic on
POSIX), optionally fsync, then `os.replace` it over the target; on any failure the temporary
file is removed. Standard library only: `plugins/launch/rank_exec.py` imports it and must start
fast. Object-store writes have their own streaming, hashing version (`plugins/storage/`).

`locked`: the one exclusive file lock for processes of one machine that share a file.
`sqlite_file`: the database file a `sqlite:///…` URL names.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, fsync: bool = False) -> Path:
    """Atomically replace `path` with `data` (str is written as UTF-8); creates the folder.
    `fsync` makes the new content survive a power loss, not just a crash of this process."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


@contextlib.contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (created if missing) for the block: the one way the
    processes of a machine take turns on a shared file (the data cache, a fresh MLflow store).
    The kernel drops it when the holder dies, so a crash never leaves it held."""
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def sqlite_file(url: str) -> Path | None:
    """The database file of a `sqlite:///…` URL (absolute: `sqlite:////abs`, or relative to the
    working folder), without its `?query`; None for any other URL and for an in-memory database."""
    if not url.startswith("sqlite:///"):
        return None
    name = url.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(name).absolute() if name and name != ":memory:" else None
