"""`trainyard plan`: cluster choice, human and JSON output, exit codes, bad specs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.cli.main import main
from trainyard.config.settings import get_settings
from trainyard.plugins.advisor.planner import PLAN_JSON_KEYS

ROOT = Path(__file__).resolve().parents[3]
JOBS = ROOT / "config" / "jobs"
DEMO = JOBS / "demo-tiny-lm.yaml"


@pytest.fixture(autouse=True)
def local_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("TRAINYARD_CLUSTER", "local")
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / ".trainyard"))
    monkeypatch.delenv("TRAINYARD_MEMORY_FRACTION", raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_demo_json_is_the_issue_shape_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(DEMO), "--json", "--top", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["feasible", "plan", "alternatives", "rejected"]
    assert doc["feasible"] is True
    assert list(doc["plan"]) == list(PLAN_JSON_KEYS)
    assert (doc["plan"]["tp"], doc["plan"]["pp"], doc["plan"]["dp"]) == (1, 1, 2)
    assert len(doc["alternatives"]) == 2


def test_human_output_explains_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(DEMO)]) == 0
    out = capsys.readouterr().out
    for needle in ("demo-tiny-lm", "on local", "fits", "Memory per device", "activations",
                   "Time per step", "tokens/s", "MFU", "Alternatives", "Rejected"):
        assert needle in out, needle


def test_default_cluster_is_the_first_with_the_specs_gpu_type(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(ROOT / "config" / "examples" / "llama-7b-finetune.yaml"), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "on h100-fleet" in out
    assert "NCCL_DEBUG" in out  # GPU cluster: NCCL variables are suggested


def test_nothing_fits_exits_1_and_says_what_would(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "big.yaml"
    spec.write_text((ROOT / "config" / "examples" / "llama-7b-finetune.yaml").read_text().replace("gpuCount: 64", "gpuCount: 1")
                    .replace("minGpuCount: 32", "minGpuCount: 1"))
    assert main(["plan", str(spec), "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["feasible"] is False and doc["plan"] is None
    assert doc["rejected"]["exceeds_memory"] > 0
    assert "would fit: more devices:" in captured.err
    assert main(["plan", str(spec)]) == 1
    assert "Nothing fits" in capsys.readouterr().out


def test_manual_strategy_is_evaluated_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "manual.yaml"
    spec.write_text(DEMO.read_text().replace("strategy: auto", "strategy: manual\n    zeroStage: 3\n"
                                                               "    microBatchSize: 4"))
    assert main(["plan", str(spec), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert (plan["zero_stage"], plan["micro_batch_size"], plan["num_micro_batches"], plan["dp"]) == (3, 4, 2, 2)


def test_spec_problems_are_printed_like_validate_and_exit_1(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "typo.yaml"
    spec.write_text(DEMO.read_text().replace("gpuCount: 2", "gpuCuont: 2"))
    assert main(["plan", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "spec.hardware.gpuCuont: unknown field 'gpuCuont' (did you mean 'gpuCount'?)" in err
    rules = tmp_path / "rules.yaml"
    rules.write_text(DEMO.read_text().replace("strategy: auto", "strategy: auto\n    pipelineParallel: 3"))
    assert main(["plan", str(rules)]) == 1
    assert "spec.parallelism.pipelineParallel: 4 layers are not divisible by PP(3)" in capsys.readouterr().err


def test_usage_errors_exit_2() -> None:
    for args in (["plan"], ["plan", str(DEMO), "--top", "-1"], ["plan", "--cluster", "nope", str(DEMO)],
                 ["plan", str(DEMO), "--memory-fraction", "1.5"]):
        result = subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True,
                                text=True, check=False)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
