"""Finds and parses the per-rank heartbeat files under the agent's heartbeat root.

Workers write `rank-NNNNN.json` atomically (`node_agent.heartbeat.write_heartbeat`), one
folder per job/attempt below the root, so the reader globs recursively. It must survive
whatever else lands there: a half-written file from a writer that does not rename, a foreign
JSON document, an empty file after a full disk. Such a file is skipped and warned about once
(again only if it turns valid and then breaks again), never per scrape, never a crash.

Parsed files are cached by (inode, mtime, size), so a scrape re-reads only files that changed.
The agent never writes into the heartbeat folders.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from node_agent.heartbeat import FILE_PATTERN, Heartbeat
from node_agent.once import OnceLog

log = logging.getLogger(__name__)

MAX_HEARTBEAT_BYTES = 64 * 1024
"""A heartbeat is a few hundred bytes; anything far larger is not one (and is not read)."""


@dataclass(frozen=True)
class _Entry:
    stamp: tuple[int, int, int]
    beat: Heartbeat | None


class HeartbeatReader:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._cache: dict[Path, _Entry] = {}
        self._once = OnceLog(log)
        self.invalid_files = 0
        """Files matching the pattern that did not parse at the last scan."""

    def scan(self) -> list[tuple[Path, Heartbeat]]:
        """Every valid heartbeat under the root, sorted by path."""
        if not self.root.is_dir():
            self._once.info("no-root", "heartbeat dir %s does not exist (yet): no ranks to report", self.root)
            self._cache.clear()
            self.invalid_files = 0
            return []
        self._once.forget("no-root")
        found: dict[Path, _Entry] = {}
        for path in sorted(self.root.rglob(FILE_PATTERN)):
            try:
                st = path.stat()
            except OSError:  # replaced or removed between the glob and the stat
                continue
            if not path.is_file():
                continue
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            entry = self._cache.get(path)
            if entry is None or entry.stamp != stamp:
                entry = _Entry(stamp, self._parse(path, st.st_size))
            found[path] = entry
        for gone in self._cache.keys() - found.keys():
            self._once.forget(gone)
        self._cache = found
        self.invalid_files = sum(1 for e in found.values() if e.beat is None)
        return [(path, e.beat) for path, e in found.items() if e.beat is not None]

    def _parse(self, path: Path, size: int) -> Heartbeat | None:
        if size > MAX_HEARTBEAT_BYTES:
            return self._skip(path, f"{size} bytes, more than a heartbeat's {MAX_HEARTBEAT_BYTES}")
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_HEARTBEAT_BYTES + 1)
        except OSError as e:
            return self._skip(path, f"unreadable ({os.strerror(e.errno) if e.errno else e})")
        if not data.strip():
            return self._skip(path, "empty")
        try:
            beat = Heartbeat.model_validate_json(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "document"
            return self._skip(path, f"not a heartbeat ({where}: {first['msg']})")
        self._once.forget(path)
        return beat

    def _skip(self, path: Path, why: str) -> None:
        self._once.warning(path, "skipping heartbeat file %s: %s", path, why)
        return None
