"""The pod's first process decides whether its torchrun agent hosts the c10d store
(`plugins/launch/pod_entry.py`): the agent whose address is the endpoint's host."""

from __future__ import annotations

import pytest

from trainyard.plugins.launch.pod_entry import endpoint_host, with_is_host

TAIL = ["-m", "trainyard.plugins.launch.rank_exec", "--run-dir", "/run", "--", "train.py", "--local-addr", "x"]


def argv(local: str, *extra: str) -> list[str]:
    return ["--nnodes", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "j-worker-0.j:29500",
            "--local-addr", local, *extra, *TAIL]


def test_the_pod_at_the_endpoint_hosts_the_store_and_no_other() -> None:
    assert with_is_host(argv("j-worker-0.j")) == ["--rdzv-conf", "is_host=true", *argv("j-worker-0.j")]
    assert with_is_host(argv("j-worker-1.j")) == ["--rdzv-conf", "is_host=false", *argv("j-worker-1.j")]
    # `j-worker-0.j` as a prefix is not the host; nor is an address the script's own args name
    assert with_is_host(argv("j-worker-0.jx"))[:2] == ["--rdzv-conf", "is_host=false"]


def test_an_existing_rdzv_conf_keeps_its_other_keys() -> None:
    out = with_is_host(argv("j-worker-0.j", "--rdzv-conf", "read_timeout=120,is_host=false"))
    assert out[out.index("--rdzv-conf") + 1] == "read_timeout=120,is_host=true" and out.count("--rdzv-conf") == 1
    out = with_is_host(argv("j-worker-2.j", "--rdzv-conf=join_timeout=900"))
    assert out[out.index("--rdzv-conf") + 1] == "join_timeout=900,is_host=false"


def test_an_unexpanded_or_missing_address_is_refused() -> None:
    with pytest.raises(SystemExit, match="was not expanded"):
        with_is_host(argv("$(POD_NAME).j"))
    with pytest.raises(SystemExit, match="--local-addr and --rdzv-endpoint are both required"):
        with_is_host(["--nnodes", "2", *TAIL])


def test_endpoint_hosts() -> None:
    assert endpoint_host("j-worker-0.j:29500") == "j-worker-0.j" and endpoint_host("j-worker-0.j") == "j-worker-0.j"
    assert endpoint_host("[fd00::1]:29500") == "fd00::1"
