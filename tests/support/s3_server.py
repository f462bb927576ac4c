"""A real S3 HTTP endpoint for tests: moto's server mode on a free port (no mocks in-process).

Shared by the unit and integration checkpoint suites; each test gets its own bucket.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.environ import environment

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""moto accepts any credentials; these keep boto3 from looking for real ones."""


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str

    def new_bucket(self, prefix: str = "ckpt") -> str:
        """Create a fresh bucket (names need ≥ 3 characters, as on S3) and return its name."""
        import boto3

        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1").create_bucket(
            Bucket=name)
        return name


@contextmanager
def running_s3_server() -> Iterator[S3Server]:
    """Start `ThreadedMotoServer` on 127.0.0.1 and a free port; set dummy credentials."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    with environment(CREDENTIALS):
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield S3Server(f"http://{host}:{port}")
        finally:
            server.stop()
