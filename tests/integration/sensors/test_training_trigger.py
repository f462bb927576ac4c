"""The training trigger on a real torchrun gang (2 ranks, gloo, the launcher's tiny job) whose
ranks stop making progress: it stops the gang, with `hang` as the recorded reason, and fires."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.integration.launch.test_local_launcher import start, wait_for
from trainyard.plugins.attempt.watching import read_stop_reason
from trainyard.sensors.triggers import TrainingTrigger

pytestmark = [pytest.mark.slow, pytest.mark.waits]


def test_a_hung_gang_is_stopped_with_the_reason_and_the_trigger_fires(tmp_path: Path) -> None:
    # two steps, then 60 s alive without a heartbeat: hung once the 2 s hang timeout has passed
    launcher, handle = start(tmp_path, "tiny-hang", ["--steps", "2", "--sleep", "60"], hang_timeout="2s")
    wait_for(launcher, handle, lambda s: s.step is not None)

    async def first() -> dict:
        return (await TrainingTrigger(handle.model_dump(mode="json"), watch={"renew_lease": False},
                                     poll_interval_s=0.5).run().asend(None)).payload

    event = asyncio.run(asyncio.wait_for(first(), timeout=120))
    assert event["status"] == "hang", event
    assert event["run_status"]["state"] in ("stopped", "failed") and not event["run_status"]["processes_alive"]
    reason = read_stop_reason(handle.run_dir)
    assert reason is not None and reason.reason == "hang" and reason.ranks


def test_an_attempt_past_its_max_runtime_is_stopped_as_a_timeout(tmp_path: Path) -> None:
    import time

    launcher, handle = start(tmp_path, "tiny-long", ["--steps", "1000", "--sleep", "0.2"])
    wait_for(launcher, handle, lambda s: s.step is not None)

    async def first() -> dict:
        trigger = TrainingTrigger(handle.model_dump(mode="json"), poll_interval_s=0.5,
                                  watch={"renew_lease": False, "deadline": time.time()})
        return (await trigger.run().asend(None)).payload

    event = asyncio.run(asyncio.wait_for(first(), timeout=120))
    assert event["status"] == "timeout" and not event["run_status"]["processes_alive"], event
    reason = read_stop_reason(handle.run_dir)
    assert reason is not None and reason.reason == "timeout"
