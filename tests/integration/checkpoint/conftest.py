"""Fixtures for the checkpoint integration tests: a real S3 endpoint (moto server mode)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.s3_server import S3Server, running_s3_server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with running_s3_server() as server:
        yield server
