"""The recovery engine on real torchrun runs (2 nodes × 1 process, gloo, the launcher's tiny
job): the evidence a real crash and a real hang stop leave behind classifies as it should, and
a crash that repeats identically is given up on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.launch.test_local_launcher import start, wait_for
from trainyard.config.settings import Settings
from trainyard.plugins.attempt.bookkeeping import DecisionInputs, decide_from_catalog
from trainyard.plugins.attempt.evidence import gather
from trainyard.plugins.attempt.launchers import Runtime
from trainyard.plugins.attempt.watching import stop_gang
from trainyard.plugins.recovery.classify import classify
from trainyard.plugins.recovery.model import AttemptConf
from trainyard.plugins.run.records import StopReason

pytestmark = [pytest.mark.slow, pytest.mark.waits]


def test_a_real_crash_is_a_worker_crash_and_the_same_crash_twice_gives_up(tmp_path: Path) -> None:
    from trainyard.config.loader import load_spec_file

    conf, ctx = AttemptConf(), DecisionInputs(checkpoint_uri=(tmp_path / "ckpt").as_uri())
    actions = []
    for attempt in (0, 1):
        (tmp_path / str(attempt)).mkdir()
        launcher, handle = start(tmp_path / str(attempt), "tiny-crash", ["--steps", "2", "--fail-rank", "1"])
        status = launcher.wait(handle, timeout_s=120)
        report = classify(gather(handle, status, launcher=launcher, run="r-crash"))
        # the settle() that cleaned up the gang wrote stopped.json: a clean-up, not a request
        assert (report.outcome, report.rank, report.exit_code) == ("worker_crash", 1, 7), report
        assert report.reason.startswith("rank 1 on local-1 exited with code 7 at step 2"), report.reason
        report = report.model_copy(update={"attempt": attempt})
        job = load_spec_file(tmp_path / str(attempt) / "tiny-crash.yaml")
        action = decide_from_catalog(report, job, conf, ctx)
        actions.append(action)
        conf = conf.next_attempt(report, action)
    assert actions[0].kind == "restart"
    assert actions[1].kind == "give_up" and "fails the same way every time" in actions[1].reason


def test_a_gang_stopped_for_a_hang_is_a_hang(tmp_path: Path) -> None:
    launcher, handle = start(tmp_path, "tiny-hang", ["--steps", "400", "--sleep", "0.2"])
    wait_for(launcher, handle, lambda s: s.step is not None and s.step >= 2)
    status = stop_gang(handle, StopReason(reason="hang", detail="rank 1 made no step progress for 600 s",
                                          ranks=[1]), Runtime(Settings(home=tmp_path / "home")), grace_s=10)
    assert status.state == "stopped", status
    report = classify(gather(handle, status, launcher=launcher, run="r-hang"))
    assert report.outcome == "hang" and "rank 1 made no step progress" in report.reason
    assert report.rank == 1 and "stop-reason.json: hang: rank 1 made no step progress for 600 s" in report.evidence


def test_launch_timeout_is_recorded_as_the_stop_reason(tmp_path: Path) -> None:
    """`trainyard launch --timeout-s` stops the gang the control plane's way: the reason is on
    disk before the stop, and the verdict is a stop on request, not a crash."""
    from tests.integration.launch.test_local_launcher import cli, write_spec

    spec = write_spec(tmp_path / "slow.yaml", "tiny-slow", ["--steps", "100000", "--sleep", "0.1"])
    result = cli(tmp_path / "home", "launch", "--local", "--offline", "--timeout-s", "8", "--grace-s", "5", str(spec))
    assert "timeout after 8s; stopping" in result.stderr, result.stdout + result.stderr
    assert "verdict: cancelled — stopped on request (--timeout-s 8 reached)" in result.stdout, result.stdout
    reasons = list((tmp_path / "home" / "runs" / "tiny-slow").glob("*/0/stop-reason.json"))
    assert len(reasons) == 1 and StopReason.model_validate_json(reasons[0].read_text()).reason == "timeout"
