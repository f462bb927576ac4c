"""The checkpoint engine's unit tests run against both object stores: the storage fixtures."""

from __future__ import annotations

from tests.unit.storage.conftest import s3_server, store

__all__ = ["s3_server", "store"]
