"""`trainyard validate --data` end to end: a real process, a real object store, GX on real shards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import procs
from tests.unit.tracking.factories import write_jsonl

pytestmark = pytest.mark.slow


def validate(tmp_path: Path, rows: list) -> tuple[int, list[dict]]:
    home = tmp_path / ".trainyard"
    write_jsonl(home / "objects/datasets/corpus/part-000.jsonl", rows)
    doc = yaml.safe_load((procs.REPO_ROOT / "config/jobs/demo-tiny-lm.yaml").read_text())
    doc["spec"]["dataset"]["source"] = "datasets/corpus/"
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "trainyard.cli", "validate", "--data", "--json", str(spec)],
                         cwd=tmp_path, env=procs.test_env({"TRAINYARD_HOME": str(home)}),
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode in (0, 1), out.stderr[-4000:]
    return out.returncode, json.loads(out.stdout)


def test_a_dataset_with_nulls_empty_rows_and_duplicates_fails_the_dry_run(tmp_path: Path) -> None:
    rows = [{"text": f"line {i}"} for i in range(20)] + [{"text": None}, {"text": ""}, ""] + [{"text": "dup"}] * 3
    rc, problems = validate(tmp_path, rows)
    assert rc == 1
    quality = [p for p in problems if p["code"] == "DATA_QUALITY"]
    assert {p["path"] for p in quality} == {
        "spec.dataset.quality.requiredFields", "spec.dataset.quality.textField",
        "spec.dataset.quality.minLength", "spec.dataset.quality.maxDuplicateFraction"}
    assert all(p["severity"] == "error" for p in quality)
    nulls = next(p for p in quality if p["path"] == "spec.dataset.quality.requiredFields")
    assert "2 of 26 rows fail" in nulls["message"] and "part-000.jsonl:21" in nulls["message"]
    dup = next(p for p in quality if p["path"] == "spec.dataset.quality.maxDuplicateFraction")
    assert "'dup' ×3" in dup["message"]


def test_clean_data_passes(tmp_path: Path) -> None:
    rc, problems = validate(tmp_path, [{"text": f"line {i}"} for i in range(50)])
    assert [p for p in problems if p["code"] == "DATA_QUALITY"] == []
    assert rc == 0, problems
