"""Log a condition once, not once per poll: an agent that repeats the same warning every five
seconds buries the one line that matters."""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable


class OnceLog:
    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()

    def log(self, level: int, key: Hashable, msg: str, *args: object) -> bool:
        """Log `msg` if `key` has not been logged since it was last `forget`-ten; True if logged."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        self._logger.log(level, msg, *args)
        return True

    def warning(self, key: Hashable, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def info(self, key: Hashable, msg: str, *args: object) -> bool:
        return self.log(logging.INFO, key, msg, *args)

    def forget(self, key: Hashable) -> None:
        """The condition ended: log it again if it comes back."""
        with self._lock:
            self._seen.discard(key)
