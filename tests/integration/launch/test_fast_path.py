"""The fast path (DESIGN §5) with real processes: the platform's `LocalLauncher` runs the real
`worker/train.py` under torchrun with `--max-restarts`; a rank SIGKILLed mid-run is restarted in
place from the newest checkpoint, the injected fault does not fire again, the attempt completes,
and the control plane counts the in-place restart."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.integration.worker.conftest import tiny_job
from tests.support import procs
from trainyard.config.cluster import load_cluster
from trainyard.config.settings import Settings
from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.attempt.evidence import gather
from trainyard.plugins.launch.environment import build_worker_env
from trainyard.plugins.launch.local import LocalLauncher
from trainyard.plugins.placement.gang import place_gang
from trainyard.plugins.placement.inventory import Inventory
from trainyard.plugins.placement.model import GangRequest
from trainyard.plugins.recovery.classify import classify

pytestmark = pytest.mark.slow


def test_a_killed_rank_is_restarted_in_place_from_the_newest_checkpoint(tmp_path: Path) -> None:
    from trainyard.cli.main import main

    settings = Settings(home=tmp_path / "home")
    assert main(["data", "prepare-demo", "--object-store", settings.object_store, "--shards", "4"]) == 0
    job = tiny_job("fast-path", max_steps=30, interval_steps=10)
    plan = Plan(layout=RankLayout(dp=2), micro_batch_size=4, global_batch_size=8, sequence_length=32)
    placement = place_gang(GangRequest.for_job(job, plan, run="r-fast"), Inventory.from_cluster(load_cluster("local")))
    launcher = LocalLauncher(settings.runs_dir, source_dir=procs.REPO_ROOT, max_restarts=1,
                             base_env=procs.test_env({"TRAINYARD_FAULTS": "sigkill@25:1"}))
    env = build_worker_env(job, plan, settings, run="r-fast", attempt=0)
    handle = launcher.submit(job, plan, placement, env, attempt=0)
    try:
        status = launcher.wait(handle, timeout_s=300)
    finally:
        launcher.stop(handle, grace_s=0)
    assert status.state == "succeeded", launcher.logs(handle)
    exits = [json.loads(line) for line in (Path(handle.run_dir) / "exits.jsonl").read_text().splitlines()]
    assert [(e["rank"], e["restart"], e["exit_code"]) for e in exits if e["rank"] == 1] == [(1, 0, -9), (1, 1, 0)]
    log = (Path(handle.run_dir) / "ranks" / "rank-00000.log").read_text()
    first, restarted = log.split("restart 1", 1)
    # the newest checkpoint committed before the kill (on a busy machine step 20's asynchronous
    # commit may not have landed by step 25: then it is step 10), not the attempt's first one
    committed = [int(m) for m in re.findall(r"checkpoint step (\d+) committed", first)]
    assert committed, log[-3000:]
    assert f"resumed from step {max(committed)}" in restarted, log[-3000:]
    from trainyard.plugins.run.heartbeat import heartbeat_path

    for rank in (0, 1):  # the gang's count, in what the node agents serve
        assert json.loads(heartbeat_path(Path(handle.heartbeat_dir), rank).read_text())["restart"] == 1
    report = classify(gather(handle, status, launcher=launcher, run="r-fast"))
    assert (report.outcome, report.restarts_in_place) == ("completed", 1)
