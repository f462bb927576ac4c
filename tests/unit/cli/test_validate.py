"""`trainyard validate`: exit codes, human and JSON output, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
JOBS = sorted([*(ROOT / "config" / "jobs").glob("*.yaml"), *(ROOT / "config" / "examples").glob("*.yaml")],
              key=lambda p: p.name)  # the demo first


def test_examples_are_valid_offline_on_the_cluster_that_has_their_devices(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from trainyard.config.cluster import cluster_for

    for spec in JOBS:
        gpu = yaml.safe_load(spec.read_text())["spec"]["hardware"]["gpuType"]
        cluster = cluster_for(gpu, "local").name
        assert main(["validate", "--offline", "--cluster", cluster, str(spec)]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.count("✓") == len(JOBS)


def test_a_spec_whose_devices_another_cluster_has_is_refused_naming_it(capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.config.settings import get_settings

    monkeypatch.setenv("TRAINYARD_CLUSTER", "local")
    get_settings.cache_clear()
    try:
        h100 = next(s for s in JOBS if "gpuType: H100" in s.read_text())
        assert main(["validate", "--offline", str(h100)]) == 1
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr().out
    assert "LAUNCHER_UNAVAILABLE" in out and "H100 devices are not on cluster 'local'" in out
    assert "TRAINYARD_CLUSTER=h100-fleet or --cluster h100-fleet" in out


def test_a_spec_on_the_wrong_cluster_still_reports_its_other_problems(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Every problem at once: where it cannot run does not hide what is wrong in it."""
    import yaml

    doc = yaml.safe_load((ROOT / "config" / "jobs" / "demo-tiny-lm.yaml").read_text())
    doc["spec"]["hardware"]["gpuType"] = "V100"
    doc["spec"]["training"]["env"] = {"WORLD_SIZE": "8"}
    spec = tmp_path / "v100.yaml"
    spec.write_text(yaml.safe_dump(doc))
    assert main(["validate", "--offline", "--cluster", "local", str(spec)]) == 1
    out = capsys.readouterr().out
    assert "2 error(s)" in out and "LAUNCHER_UNAVAILABLE spec.hardware.gpuType" in out
    assert "RESERVED_ENV spec.training.env.WORLD_SIZE" in out


def test_an_entrypoint_this_host_does_not_have_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    doc = yaml.safe_load((ROOT / "config" / "jobs" / "demo-tiny-lm.yaml").read_text())
    doc["spec"]["source"]["entrypoint"] = str(tmp_path / "no_such_train.py")
    spec = tmp_path / "missing.yaml"
    spec.write_text(yaml.safe_dump(doc))
    assert main(["validate", "--offline", "--cluster", "local", str(spec)]) == 1
    out = capsys.readouterr().out
    assert "LAUNCHER_UNAVAILABLE spec.source.entrypoint" in out and "no_such_train.py' not found" in out


def test_problems_are_listed_path_message_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "typo.yaml"
    text = (ROOT / "config" / "jobs" / "demo-tiny-lm.yaml").read_text()
    spec.write_text(text.replace("gpuCount: 2", "gpuCuont: 2").replace("name: demo-tiny-lm", "name: Demo_LM"))
    assert main(["validate", "--offline", str(spec)]) == 1
    out = capsys.readouterr().out
    assert "spec.hardware.gpuCuont: unknown field 'gpuCuont' (did you mean 'gpuCount'?)" in out


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\x00\x01binary")
    assert main(["validate", "--offline", "--json", str(bad), str(JOBS[0])]) == 1
    items = json.loads(capsys.readouterr().out)
    assert items == [{"file": str(bad), "code": "NOT_YAML", "severity": "error", "path": str(bad),
                      "message": "the file is binary (it contains NUL bytes), not YAML",
                      "hint": "pass the YAML spec, not an archive or a checkpoint"}]


def test_usage_errors_exit_2() -> None:
    for args in (["validate"], ["validate", "--bogus", "x.yaml"], ["validate", "--cluster", "nope", str(JOBS[0])]):
        result = subprocess.run([sys.executable, "-m", "trainyard.cli", *args], cwd=ROOT, capture_output=True, text=True,
                                check=False)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
