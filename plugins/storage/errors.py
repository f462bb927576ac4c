"""The object store's exceptions.

Each derives from `trainyard.plugins.errors`' fatal or transient base, so a caller decides whether to
retry from the class alone. `ObjectNotFoundError` is also a `FileNotFoundError` and
`UnsafeKeyError` also a `ValueError`, so code that knows nothing about this module still
handles them sensibly.
"""

from __future__ import annotations

from trainyard.plugins.errors import FatalError, TrainyardError


class StorageError(TrainyardError):
    """Base of every error the object store raises on purpose."""


class ObjectNotFoundError(StorageError, FatalError, FileNotFoundError):
    """A key that does not exist in the object store (asking again will not create it)."""


class UnsafeKeyError(StorageError, FatalError, ValueError):
    """A key or manifest path that could escape its folder (`..`, absolute, backslashes)."""


class IntegrityError(StorageError, FatalError):
    """Stored bytes do not match what was expected (size or SHA-256), or a file is missing.
    Fatal for that object (a checkpoint falls back to the previous valid one)."""
