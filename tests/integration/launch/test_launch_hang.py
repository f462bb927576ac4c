"""`trainyard launch` and a rank that hangs: after the spec's `hangTimeout` the gang is stopped
through the recovery engine (`watching.hang_stop` + `stop_gang`, the reason recorded beside the
run) and the command exits with the hang code instead of following it forever."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.integration.launch.test_local_launcher import cli, write_spec
from trainyard.cli.launch import EXIT_HANG
from trainyard.plugins.run.records import StopReason

pytestmark = [pytest.mark.slow, pytest.mark.waits]


def test_a_hung_gang_is_stopped_and_launch_exits_with_the_hang_code(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "hang.yaml", "tiny-hang-cli", ["--steps", "50", "--sleep", "120"])
    doc = yaml.safe_load(spec.read_text())
    doc["spec"]["faultTolerance"]["hangTimeout"] = "3s"  # every rank sleeps 120 s after step 1
    spec.write_text(yaml.safe_dump(doc))
    result = cli(tmp_path / "home", "launch", "--local", "--offline", "--grace-s", "5", str(spec), timeout=180)
    assert result.returncode == EXIT_HANG, result.stdout + result.stderr
    assert "hang" in result.stderr and "made no step progress" in result.stderr, result.stderr
    assert "verdict: hang" in result.stdout, result.stdout
    (reason,) = (tmp_path / "home" / "runs" / "tiny-hang-cli").glob("*/0/stop-reason.json")
    assert StopReason.model_validate_json(reason.read_text()).reason == "hang"


PLAIN_STUCK = '''\
"""A plain torchrun script (no Trainyard import): a few collectives, then rank 1 stops making
progress (asleep) and rank 0 waits for it in the next all_reduce."""
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1024)
for _ in range(5):
    dist.all_reduce(t)
print(f"rank {dist.get_rank()}: 5 steps", flush=True)
if dist.get_rank() == 1:
    with open(sys.argv[1], "w") as out:
        out.write(repr(time.time()))
    time.sleep(600)
dist.all_reduce(t)
'''


def test_a_plain_script_that_stops_making_progress_is_stopped_as_hung_within_its_timeout(tmp_path: Path) -> None:
    """(e) of the bring-your-own issue: no heartbeat of its own, so its ranks' activity (CPU time
    and I/O, written by their wrappers) stands in; the hang is seen within `hangTimeout` plus one
    pulse of the watch plus one poll of `trainyard launch` (with 1 s for a loaded machine)."""
    script, still = tmp_path / "code" / "stuck.py", tmp_path / "still-at"
    script.parent.mkdir()
    script.write_text(PLAIN_STUCK)
    spec = write_spec(tmp_path / "plain.yaml", "plain-hang-cli", [str(still)], hang_timeout="4s")
    doc = yaml.safe_load(spec.read_text())
    doc["spec"]["source"]["entrypoint"] = str(script)
    spec.write_text(yaml.safe_dump(doc))
    result = cli(tmp_path / "home", "launch", "--local", "--offline", "--grace-s", "3", str(spec), timeout=180)
    assert result.returncode == EXIT_HANG, result.stdout + result.stderr
    assert "used no CPU and did no I/O" in result.stderr and "watched by its activity" in result.stderr, result.stderr
    (path,) = (tmp_path / "home" / "runs" / "plain-hang-cli").glob("*/0/stop-reason.json")
    reason = StopReason.model_validate_json(path.read_text())
    assert reason.reason == "hang" and 1 in reason.ranks, reason
    went_still = float(still.read_text())
    from trainyard.plugins.launch.activity import pulse_s

    assert reason.at - went_still <= 4.0 + pulse_s(4.0) + 0.5 + 1.0, (reason.at - went_still, reason)
    assert reason.at - went_still > 4.0, "judged before its timeout"
