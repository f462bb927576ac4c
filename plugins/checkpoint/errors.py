"""The checkpoint engine's exceptions, in one place so callers can catch them by kind.

`ObjectNotFoundError` is also a `FileNotFoundError` and `UnsafeKeyError` also a `ValueError`,
so code that knows nothing about this module still handles them sensibly.
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Base of every error this engine raises on purpose."""


class ObjectNotFoundError(CheckpointError, FileNotFoundError):
    """A key that does not exist in the object store."""


class UnsafeKeyError(CheckpointError, ValueError):
    """A key or manifest path that could escape its folder (`..`, absolute, backslashes)."""


class IntegrityError(CheckpointError):
    """Stored bytes do not match the manifest (size or SHA-256), or a file is missing."""


class OutsideJobPrefixError(CheckpointError, ValueError):
    """A URI a job's writer or reader may not use: it lies outside the job's own prefix."""


class CheckpointSaveError(CheckpointError):
    """A save did not commit (some rank failed to stage, upload or the manifest write failed)."""


class NoValidCheckpointError(CheckpointError):
    """An explicit restore target that does not verify (no fallback for an explicit choice)."""
