"""Finds and parses the per-rank heartbeat files under the agent's heartbeat root.

Workers write `rank-NNNNN.json` atomically (`trainyard.plugins.run.heartbeat.write_heartbeat`), one
folder per job/attempt below the root, so the reader globs recursively. It must survive
whatever else lands there: a half-written file from a writer that does not rename, a foreign
JSON document, an empty file after a full disk. Such a file is skipped and warned about once
(again only if it turns valid and then breaks again), never per scrape, never a crash.

Parsed files are cached by (inode, mtime, size), so a scrape re-reads only files that changed.
The agent never writes into the heartbeat folders.

The root may be a glob (issue 56): on a cluster whose team namespaces enforce Pod Security
`restricted`, a job's pods may not mount a hostPath, so their heartbeats live in an `emptyDir`
and the agent reads the kubelet's copies of those volumes,
`<kubelet pods>/*/volumes/kubernetes.io~empty-dir/heartbeats` — only those folders, never the
other volumes of the node's pods (datasets, checkpoints) the recursive glob would descend into.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from trainyard.node_agent.once import OnceLog
from trainyard.plugins.run.heartbeat import FILE_PATTERN, Heartbeat

log = logging.getLogger(__name__)

MAX_HEARTBEAT_BYTES = 64 * 1024
"""A heartbeat is a few hundred bytes; anything far larger is not one (and is not read)."""


MAX_NAMED_INVALID = 20
"""Invalid files named in `/health` (the count is always whole): enough to find the culprit."""


@dataclass(frozen=True)
class _Entry:
    stamp: tuple[int, int, int]
    beat: Heartbeat | None
    why: str = ""


class HeartbeatReader:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._cache: dict[Path, _Entry] = {}
        self._once = OnceLog(log)
        self.invalid_files = 0
        """Files matching the pattern that did not parse at the last scan."""
        self.invalid: dict[str, str] = {}
        """Path → why it was skipped, at the last scan (the first `MAX_NAMED_INVALID`)."""

    def scan(self) -> list[tuple[Path, Heartbeat]]:
        """Every valid heartbeat under the root, sorted by path."""
        roots = self.roots()
        if not roots:
            self._once.info("no-root", "heartbeat dir %s does not exist (yet): no ranks to report", self.root)
            self._cache.clear()
            self.invalid_files, self.invalid = 0, {}
            return []
        self._once.forget("no-root")
        found: dict[Path, _Entry] = {}
        for path in sorted(path for root in roots for path in root.rglob(FILE_PATTERN)):
            try:
                st = path.stat()
            except OSError:  # replaced or removed between the glob and the stat
                continue
            if not path.is_file():
                continue
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            entry = self._cache.get(path)
            if entry is None or entry.stamp != stamp:
                beat, why = self._parse(path, st.st_size)
                entry = _Entry(stamp, beat, why)
            found[path] = entry
        for gone in self._cache.keys() - found.keys():
            self._once.forget(gone)
        self._cache = found
        bad = [(str(path), e.why) for path, e in found.items() if e.beat is None]
        self.invalid_files, self.invalid = len(bad), dict(bad[:MAX_NAMED_INVALID])
        return [(path, e.beat) for path, e in found.items() if e.beat is not None]

    def roots(self) -> list[Path]:
        """The folders scanned: the root, or each folder a glob root matches (none that is absent)."""
        text = str(self.root)
        if not any(c in text for c in "*?["):
            return [self.root] if self.root.is_dir() else []
        anchor = Path(self.root.anchor or ".")
        return [p for p in sorted(anchor.glob(str(self.root.relative_to(anchor)))) if p.is_dir()]

    def _parse(self, path: Path, size: int) -> tuple[Heartbeat | None, str]:
        """(the heartbeat, '') or (None, why it is not one). Values are bounded by the model
        (`Heartbeat`: types, ranges, sizes), so what passes renders in `/metrics`."""
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
            first = e.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "document"
            return self._skip(path, f"not a heartbeat ({where[:64]}: {first['msg'][:160]})")
        except (ValueError, RecursionError) as e:  # defensive: JSON the parser refuses outright
            return self._skip(path, f"not a heartbeat ({type(e).__name__})")
        self._once.forget(path)
        return beat, ""

    def _skip(self, path: Path, why: str) -> tuple[None, str]:
        self._once.warning(path, "skipping heartbeat file %s: %s", path, why)
        return None, why
