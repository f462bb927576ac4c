"""Skip, or fail in CI: one rule for tests that need a part this machine may not have.

A test that needs the PostgreSQL server, Redis, Chromium, the shared schemas, network
namespaces, nftables or the Kubernetes binaries calls `missing(part, why)` when the part is not there. Outside CI that is a skip
with the reason. But a skip in CI hides exactly what the test is for — a real server, a real
browser — so `.ci/run` sets `TRAINYARD_REQUIRE` (a comma-separated list, or `all`) and a
missing required part fails the test instead, saying which part and how to provide it.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

HOW = {
    "postgres": "start it: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start "
                "(127.0.0.1:5432, trust auth, database test)",
    "redis": "start it: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ''",
    "chromium": "install Debian's browser: apt-get install -y chromium",
    "schemas": "put the shared schemas beside the checkout (../shared/schemas, as on the CI machine)",
    "netns": "run as root on Linux with iproute2 (`ip netns add` must work)",
    "mountns": "run as root on Linux with util-linux's unshare (`unshare -m` gives a test its own /etc/hosts)",
    "scripts": "run `make venv` (installs the console scripts)",
    "nft": "install Debian's nftables: `make services` (tests/services.sh) installs it as root",
    "kube": "run `make kube-components` (builds kube-apiserver, etcd, … once into ~/.cache/trainyard/kube)",
}
"""How to provide each part, for the failure message."""


def required() -> set[str]:
    value = os.environ.get("TRAINYARD_REQUIRE", "")
    parts = {p.strip() for p in value.split(",") if p.strip()}
    return set(HOW) if "all" in parts else parts


def missing(part: str, why: str) -> NoReturn:
    """The test cannot run without `part`: fail when CI requires it, else skip — both with why."""
    if part not in HOW:
        raise ValueError(f"unknown part {part!r}; one of {sorted(HOW)}")
    if part in required():
        pytest.fail(f"required part {part!r} is missing (TRAINYARD_REQUIRE): {why}; {HOW[part]}",
                    pytrace=False)
    pytest.skip(f"{why} ({HOW[part]})")
