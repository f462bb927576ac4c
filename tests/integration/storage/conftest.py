"""An S3 endpoint that enforces IAM: moto's server in a process of its own (moto's switch is
process-wide, so the suite's shared in-process server stays open), with an administrator — the
deployment's principal — made before the switch (`/moto-api/reset-auth`, what moto's own
`set_initial_no_auth_action_count` sends in server mode) turns authentication on for every
later request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.procs import free_port

REGION = "us-east-1"


@dataclass(frozen=True)
class IamS3:
    endpoint_url: str
    admin: dict[str, str]
    """The deployment's credentials, as `AWS_*` variables."""
    bucket: str

    def client(self, service: str, keys: dict[str, str] | None = None, *, retries: int = 3) -> Any:
        """A client with `keys` (default: the deployment's); `retries=1` to see a refusal at once."""
        import boto3
        from botocore.config import Config

        keys = keys or self.admin
        return boto3.session.Session(
            aws_access_key_id=keys["AWS_ACCESS_KEY_ID"], aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=keys.get("AWS_SESSION_TOKEN"), region_name=REGION,
        ).client(service, endpoint_url=self.endpoint_url, config=Config(retries={"max_attempts": retries}))


def _wait_until_up(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto's server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto's server did not answer on {url} in {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def iam_s3() -> Iterator[IamS3]:
    import urllib.request

    import boto3

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {"AWS_DEFAULT_REGION": REGION}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until_up(url, proc)
        setup = boto3.session.Session(aws_access_key_id="setup", aws_secret_access_key="setup", region_name=REGION)
        iam = setup.client("iam", endpoint_url=url)
        iam.create_user(UserName="trainyard-platform")
        iam.put_user_policy(UserName="trainyard-platform", PolicyName="admin", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="trainyard-platform")["AccessKey"]
        setup.client("s3", endpoint_url=url).create_bucket(Bucket="trainyard-store")
        # every request from here on is authenticated and authorised
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset-auth", data=b"0", method="POST",
                                                      headers={"Content-Type": "text/plain"})).close()
        yield IamS3(url, {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
                          "AWS_DEFAULT_REGION": REGION}, "trainyard-store")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
