"""`trainyard launch` and a rank that hangs: after the spec's `hangTimeout` the gang is stopped
through the recovery engine (`watching.hang_stop` + `stop_gang`, the reason recorded beside the
run) and the command exits with the hang code instead of following it forever."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.integration.launch.test_local_launcher import cli, write_spec
from trainyard.cli.launch import EXIT_HANG
from trainyard.plugins.launch.files import StopReason

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
