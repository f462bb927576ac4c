"""Fixtures for the object-store tests (and the checkpoint tests, which import them): both
object stores, one parametrised fixture."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.s3_server import S3Server, running_s3_server
from trainyard.plugins.storage.store import ObjectStore, S3Store, open_store


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with running_s3_server() as server:
        yield server


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """The same tests run against a local folder and a real S3 endpoint (moto over HTTP).

    The S3 store uses 5 MiB multipart parts (S3's minimum) so tests exercise multipart uploads.
    """
    if request.param == "local":
        return open_store((tmp_path / "objects").as_uri())
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = server.new_bucket()
    return S3Store(bucket, "root/prefix", endpoint_url=server.endpoint_url,
                   multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
