"""The control plane's fault injection (`plugins.attempt.faults`): a corrupted checkpoint
against a real local catalog, a failed GPU through a real node agent's HTTP fault API (an
in-process server on a machine without NVIDIA GPUs: CPU slots stand in for GPUs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.checkpoint.fabricate import make_checkpoint
from trainyard.node_agent.client import fetch_health
from trainyard.node_agent.config import AgentConfig
from trainyard.node_agent.monitor import Monitor
from trainyard.node_agent.server import AgentServer
from trainyard.plugins.attempt.faults import FaultNotApplied, corrupt_newest_checkpoint, fail_gpu
from trainyard.plugins.checkpoint.catalog import latest_valid, list_checkpoints, verify
from trainyard.plugins.recovery.classify import FATAL_VERDICTS
from trainyard.plugins.recovery.model import AttemptConf, FaultParams
from trainyard.plugins.storage.store import open_store


def conf(attempt: int = 0, **faults: object) -> AttemptConf:
    return AttemptConf(run="r-0001", attempt=attempt, faults=FaultParams(**faults))


def test_corrupting_the_newest_checkpoint_keeps_it_committed_but_invalid(tmp_path: Path) -> None:
    store = open_store((tmp_path / "ckpt").as_uri())
    for step in (10, 20):
        make_checkpoint(store, step)
    assert corrupt_newest_checkpoint(conf(), store.uri) is None  # not asked: nothing happens
    assert corrupt_newest_checkpoint(conf(1, corrupt_newest_checkpoint=True), store.uri) is None  # attempt 0 only
    assert verify(store, 20).ok
    shard = corrupt_newest_checkpoint(conf(corrupt_newest_checkpoint=True), store.uri)
    assert shard and "step-00000020" in shard
    again = corrupt_newest_checkpoint(conf(corrupt_newest_checkpoint=True), store.uri)
    assert again == shard  # a retried task corrupts the same bytes the same way
    assert [r.step for r in list_checkpoints(store)] == [10, 20]  # still committed, nothing deleted
    report = verify(store, 20)
    assert not report.ok and "BLAKE3" in report.problems[0]  # same size: only the hash tells
    assert latest_valid(store).step == 10


def test_corrupting_without_a_checkpoint_says_so(tmp_path: Path) -> None:
    with pytest.raises(FaultNotApplied, match="committed no checkpoint"):
        corrupt_newest_checkpoint(conf(corrupt_newest_checkpoint=True), (tmp_path / "none").as_uri())


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[str]:
    config = AgentConfig(node="local-0", heartbeat_dir=tmp_path / "hb", host="127.0.0.1", port=0, cpu_slots=2,
                         enable_fault_injection=True)
    monitor = Monitor(config)
    monitor.open()
    server = AgentServer(monitor)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()
        monitor.close()


def test_failing_a_gpu_of_the_gang_reaches_the_node_agent(agent: str) -> None:
    agents = {"local-0": agent}
    assert fail_gpu(conf(1, fail_gpu_node="gang"), ["local-0"], agents) is None  # attempt 0 only
    assert not [v for v in fetch_health(agent).verdicts if v.kind in FATAL_VERDICTS]
    assert fail_gpu(conf(fail_gpu_node="gang"), ["local-0", "local-1"], agents) == "local-0"
    fatal = [v for v in fetch_health(agent).verdicts if v.kind in FATAL_VERDICTS]
    assert fatal and fatal[0].kind == "gpu_failed" and fatal[0].xid == 79


def test_failing_a_gpu_of_an_unknown_node_names_the_known_ones(agent: str) -> None:
    with pytest.raises(FaultNotApplied, match=r"no node agent URL for 'local-9'.*local-0"):
        fail_gpu(conf(fail_gpu_node="local-9"), ["local-0"], {"local-0": agent})


def test_the_fast_path_never_restarts_more_than_the_budget_has_left() -> None:
    import yaml

    from tests.support.procs import REPO_ROOT
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.attempt.conf import in_place_restarts

    doc = yaml.safe_load((REPO_ROOT / "config/jobs/demo-tiny-lm.yaml").read_text())  # maxRestarts 3
    del doc["spec"]["faultTolerance"]["inPlaceRestarts"]  # the demo turns it off to show the DAG's hand-over
    job = TrainingJob.model_validate(doc)
    assert job.spec.fault_tolerance.in_place_restarts == 1  # on by default
    assert in_place_restarts(job, AttemptConf(run="r-0001")) == 1
    assert in_place_restarts(job, AttemptConf(run="r-0001", attempt=2, restarts_used=3)) == 0
