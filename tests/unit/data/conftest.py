"""A real S3 endpoint (moto's server) for the data-pipeline tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.s3_server import S3Server, running_s3_server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with running_s3_server() as server:
        yield server
