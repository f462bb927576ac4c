"""The checkpoint engine's exceptions, in one place so callers can catch them by kind.

Each derives from `trainyard.plugins.errors`' fatal or transient base (retry or not). The object store's
errors (`ObjectNotFoundError`, `UnsafeKeyError`, `IntegrityError`) live with the store in
`plugins/storage/errors.py`; a checkpoint whose files fail verification raises the store's
`IntegrityError`.
"""

from __future__ import annotations

from trainyard.plugins.errors import FatalError, TrainyardError, TransientError


class CheckpointError(TrainyardError):
    """Base of every error this engine raises on purpose."""


class OutsideJobPrefixError(CheckpointError, FatalError, ValueError):
    """A URI a job's writer or reader may not use: it lies outside the job's own prefix."""


class CheckpointSaveError(CheckpointError, TransientError):
    """A save did not commit (some rank failed to stage or upload, or the manifest write
    failed). Nothing was committed, so saving again — the next interval, or a restarted
    attempt — may succeed."""


class NoValidCheckpointError(CheckpointError, FatalError):
    """An explicit restore target that does not verify (no fallback for an explicit choice)."""


class CheckpointMismatchError(CheckpointError, FatalError):
    """A checkpoint that verifies but cannot fill this model or optimizer (other parameter
    names or shapes): falling back to an older checkpoint of the same job would not help."""


class CheckpointCatalogError(CheckpointError, TransientError):
    """The job's checkpoints could not be listed (the store did not answer): retry later."""


class ManagerClosedError(CheckpointError, FatalError):
    """The checkpoint manager was used after `close()`: a bug in the caller."""
