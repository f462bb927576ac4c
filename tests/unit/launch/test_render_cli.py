"""`trainyard render k8s`: multi-document YAML in apply order."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli.main import main
from tests.unit.launch.launch_fixtures import GPU_SPEC, validate_volcano


def test_renders_every_manifest_in_apply_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(GPU_SPEC))
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet", "--namespace", "ml", "--attempt", "3"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs][-2:] == ["DaemonSet", "Job"]
    job = docs[-1]
    validate_volcano(job, "batch.volcano.sh_jobs.yaml")
    assert job["metadata"]["namespace"] == "ml" and job["metadata"]["labels"]["trainyard.io/attempt"] == "3"
    assert job["spec"]["minAvailable"] == 32


def test_job_only_to_a_file_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(GPU_SPEC))
    out = tmp_path / "out.yaml"
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet", "--job-only", "-o", str(out)]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(out.read_text())] == ["Job"]
    no_image = dict(GPU_SPEC, spec={k: v for k, v in GPU_SPEC["spec"].items() if k != "image"})
    spec.write_text(yaml.safe_dump(no_image))
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet"]) == 1
    assert "spec.image is required" in capsys.readouterr().err
