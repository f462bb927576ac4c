"""`trainyard place`: the map, the JSON, and the numbers when a job cannot be placed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainyard.cli.main import main

SPEC = {
    "apiVersion": "training.platform/v1", "kind": "TrainingJob",
    "metadata": {"name": "gpt-200b", "team": "foundation"},
    "spec": {"source": {"entrypoint": "pretrain.py"}, "hardware": {"gpuType": "H100", "gpuCount": 256},
             "parallelism": {"strategy": "manual", "tensorParallel": 8, "pipelineParallel": 4},
             "dataset": {"source": "s3://d/"}, "training": {"maxSteps": 1}},
}


def spec_file(tmp_path: Path, **parallelism: int) -> Path:
    data = json.loads(json.dumps(SPEC))
    data["spec"]["parallelism"].update(parallelism)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_json_placement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", str(spec_file(tmp_path)), "--cluster", "h100-fleet", "--ignore-state", "--json"]) == 0
    placement = json.loads(capsys.readouterr().out)
    assert len(placement["nodes"]) == 32
    pp = [g for g in placement["groups"] if g["kind"] == "pp"]
    assert len(pp) == 64 and all(len(g["racks"]) == 1 for g in pp)


def test_map_shows_racks_nodes_and_groups(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["place", str(spec_file(tmp_path)), "--cluster", "h100-fleet", "--ignore-state"]) == 0
    out = capsys.readouterr().out
    assert "PP groups inside one rack: 64/64" in out
    assert "rack-007 [n0:DP0/PP0] [n1:DP0/PP1] [n2:DP0/PP2] [n3:✗] [n4:DP0/PP3]" in out
    assert "TP8·PP4·DP8" in out and "rack-135-n3" in out


def test_unschedulable_explains_in_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = spec_file(tmp_path, pipelineParallel=16)  # pipelines of 16 nodes; racks hold 8
    code = main(["place", str(path), "--cluster", "h100-fleet", "--ignore-state", "--strict-racks"])
    err = capsys.readouterr().err
    assert code == 1
    assert "needs 32 healthy H100 nodes with 8 free devices each and PP groups of 16 nodes in one rack" in err
    assert "largest free block in a rack: 8" in err and "racks can hold 0 of the 2 pipelines of 16 nodes" in err


def test_invalid_spec_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = spec_file(tmp_path, tensorParallel=16)
    assert main(["place", str(path), "--cluster", "h100-fleet", "--ignore-state"]) == 1
    assert "TP_EXCEEDS_NODE" in capsys.readouterr().err
