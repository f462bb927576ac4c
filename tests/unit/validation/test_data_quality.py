"""Great Expectations data-quality checks on real shard files in a real local object store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import procs
from tests.unit.tracking.factories import make_job, write_jsonl
from trainyard.config.problems import Code
from trainyard.config.settings import Settings
from trainyard.plugins.storage.store import open_store
from trainyard.plugins.validation.data_quality import (
    CheckOutcome,
    DataQualityReport,
    check_data_quality,
    data_quality_problems,
    report_problems,
)


def clean_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"text": f"example number {i}: some words", "id": i} for i in range(start, start + n)]


def dataset(tmp_path: Path, shards: dict[str, list[Any]]) -> Path:
    root = tmp_path / "ds"
    for name, rows in shards.items():
        write_jsonl(root / name, rows)
    return root


def check(root: Path, **quality: Any) -> DataQualityReport:
    job = make_job(source=root.as_uri(), quality=quality or None)
    return check_data_quality(job, store=open_store(root.as_uri()))


def failed(report: DataQualityReport, expectation: str) -> CheckOutcome:
    matches = [o for o in report.failures if o.expectation == expectation]
    assert len(matches) == 1, report.summary()
    return matches[0]


def test_clean_shards_pass_every_check(tmp_path: Path) -> None:
    root = dataset(tmp_path, {"part-000.jsonl": clean_rows(40), "part-001.jsonl": clean_rows(40, 40)})
    report = check(root)
    assert report.success, report.summary()
    assert (report.rows_checked, report.shards_read, report.shards_total) == (80, 2, 2)
    assert [o.expectation for o in report.outcomes] == [
        "rows_are_json_objects", "expect_column_values_to_not_be_null", "expect_column_values_to_be_of_type",
        "expect_column_values_to_not_match_regex", "expect_column_value_lengths_to_be_between",
        "expect_column_proportion_of_unique_values_to_be_between"]
    assert report.engine.startswith("great_expectations 1.")
    assert report_problems(report) == []
    assert report.summary().startswith("data quality OK: 6 checks passed on 80 rows")


def test_nulls_and_missing_fields_fail_with_counts_and_examples(tmp_path: Path) -> None:
    rows = [*clean_rows(8), {"text": None, "id": 8}, {"id": 9}]
    report = check(dataset(tmp_path, {"part-000.jsonl": rows}))
    outcome = failed(report, "expect_column_values_to_not_be_null")
    assert (outcome.failing_rows, outcome.rows_checked) == (2, 10)
    assert outcome.examples == ['part-000.jsonl:9: {"text": null, "id": 8}', 'part-000.jsonl:10: {"id": 9}']
    assert "field 'text' is present and not null: 2 of 10 rows fail (20.0%)" in report.summary()
    (problem,) = report_problems(report)
    assert problem.code == Code.DATA_QUALITY and problem.path == "spec.dataset.quality.requiredFields"
    assert "2 of 10 rows" in problem.message and "part-000.jsonl:9" in problem.message


def test_empty_rows_fail_the_blank_and_length_checks(tmp_path: Path) -> None:
    rows = [*clean_rows(6), {"text": ""}, {"text": "   \t"}, ""]  # "" = a blank line: an empty row
    report = check(dataset(tmp_path, {"part-000.jsonl": rows}))
    blank = failed(report, "expect_column_values_to_not_match_regex")
    assert blank.failing_rows == 2 and blank.examples[0] == 'part-000.jsonl:7: {"text": ""}'
    assert failed(report, "expect_column_value_lengths_to_be_between").failing_rows == 1
    assert failed(report, "expect_column_values_to_not_be_null").examples == ["part-000.jsonl:9: {}"]


def test_duplicates_over_the_limit_fail_and_under_it_pass(tmp_path: Path) -> None:
    rows = clean_rows(90) + [{"text": "the same line"}] * 10
    report = check(dataset(tmp_path, {"a.jsonl": rows[:50], "b.jsonl": rows[50:]}), maxDuplicateFraction=0.05)
    dup = failed(report, "expect_column_proportion_of_unique_values_to_be_between")
    assert (dup.failing_rows, dup.rows_checked) == (9, 100)  # ten copies = nine repeats
    assert dup.setting == "spec.dataset.quality.maxDuplicateFraction"
    assert dup.examples == ["'the same line' ×10 (b.jsonl:41, b.jsonl:42, b.jsonl:43, …)"]
    assert "duplicate fraction 0.09 > limit 0.05" in dup.observed
    assert check(dataset(tmp_path / "ok", {"a.jsonl": rows}), maxDuplicateFraction=0.1).success


def test_length_bounds_and_types_come_from_the_spec(tmp_path: Path) -> None:
    rows = [*clean_rows(5), {"text": "x" * 500}, {"text": 42}]
    report = check(dataset(tmp_path, {"s.jsonl": rows}), maxLength=100, textField="text")
    length = failed(report, "expect_column_value_lengths_to_be_between")
    assert length.failing_rows == 1 and length.setting == "spec.dataset.quality.maxLength"
    assert "1 longer than 100" in length.observed
    assert failed(report, "expect_column_values_to_be_of_type").examples == ['s.jsonl:7: {"text": 42}']


def test_a_required_field_no_row_has_is_reported_once(tmp_path: Path) -> None:
    report = check(dataset(tmp_path, {"s.jsonl": [{"body": "a"}, {"body": "b"}]}),
                   textField="body", requiredFields=["body", "label"])
    missing = failed(report, "expect_column_to_exist")
    assert missing.column == "label" and missing.failing_rows == 2
    assert report.success is False and len(report.failures) == 1


def test_lines_that_are_not_json_objects_are_counted(tmp_path: Path) -> None:
    report = check(dataset(tmp_path, {"s.jsonl": [*clean_rows(3), "{not json", "[1, 2]"]}))
    parse = failed(report, "rows_are_json_objects")
    assert (parse.failing_rows, parse.rows_checked) == (2, 5)
    assert parse.examples[1].startswith("s.jsonl:5: '[1, 2]' (a JSON list, not an object)")


def test_the_sample_is_spread_over_every_shard(tmp_path: Path) -> None:
    root = dataset(tmp_path, {f"part-{i}.jsonl": clean_rows(100, 100 * i) for i in range(4)})
    job = make_job(source=root.as_uri())
    report = check_data_quality(job, store=open_store(root.as_uri()), sample_rows=10)
    assert (report.rows_checked, report.shards_read) == (10, 4)


def test_compressed_and_parquet_shards_are_read(tmp_path: Path) -> None:
    import pandas as pd
    import zstandard

    root = tmp_path / "mixed"
    root.mkdir()
    payload = "".join(json.dumps(r) + "\n" for r in [*clean_rows(3), {"text": None}]).encode()
    (root / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(payload))
    report = check(root)
    assert failed(report, "expect_column_values_to_not_be_null").examples == ['a.jsonl.zst:4: {"text": null}']

    pq = tmp_path / "pq"
    pq.mkdir()
    pd.DataFrame({"text": ["a", "b", None]}).to_parquet(pq / "p.parquet")
    job = make_job(source=pq.as_uri()).model_copy(deep=True)
    doc = job.to_yaml_dict()
    doc["spec"]["dataset"]["format"] = "parquet"
    from trainyard.config.spec import TrainingJob

    report = check_data_quality(TrainingJob.model_validate(doc), store=open_store(pq.as_uri()))
    assert failed(report, "expect_column_values_to_not_be_null").failing_rows == 1


def test_disabled_checks_are_skipped(tmp_path: Path) -> None:
    report = check(dataset(tmp_path, {"s.jsonl": [{"text": None}]}), enabled=False)
    assert report.skipped and report.success and report_problems(report) == []


def test_no_rows_at_all_fails(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    (root / "s.jsonl").write_text("")
    report = check(root)
    assert failed(report, "dataset_has_rows").observed == "no readable rows in 1 shard(s)"


def test_the_dry_run_entry_point_resolves_the_source_in_the_object_store(settings: Settings) -> None:
    objects = Path(settings.object_store.removeprefix("file://"))
    write_jsonl(objects / "datasets/dirty/s.jsonl", [*clean_rows(3), {"text": ""}])
    problems = data_quality_problems(make_job(source="datasets/dirty/"), settings)
    assert [(p.code, p.path, p.severity) for p in problems] == [
        (Code.DATA_QUALITY, "spec.dataset.quality.textField", "error"),
        (Code.DATA_QUALITY, "spec.dataset.quality.minLength", "error")]
    missing = data_quality_problems(make_job(source="datasets/nowhere/"), settings)
    assert [(p.code, p.severity) for p in missing] == [(Code.DATA_QUALITY, "error")]


def test_importing_is_cheap_and_gx_logs_stay_quiet(tmp_path: Path) -> None:
    root = dataset(tmp_path, {"s.jsonl": clean_rows(5)})
    # Airflow's logging config first (the situation of a DAG task), then our module and GX.
    code = f"""
import logging, sys
import airflow  # noqa: F401
logging.getLogger().setLevel(logging.INFO)
import trainyard.plugins.validation.data_quality as dq
print("GX_IMPORTED", "great_expectations" in sys.modules)
from trainyard.plugins.storage.store import open_store
from tests.unit.tracking.factories import make_job
r = dq.check_data_quality(make_job(source={root.as_uri()!r}), store=open_store({root.as_uri()!r}))
print("SUCCESS", r.success)
"""
    env = procs.test_env({"AIRFLOW_HOME": str(tmp_path / "airflow")})
    out = subprocess.run([sys.executable, "-c", code], cwd=procs.REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    assert "GX_IMPORTED False" in out.stdout and "SUCCESS True" in out.stdout
    noise = [line for line in (out.stdout + out.stderr).splitlines() if "great_expectations" in line]
    assert noise == [], noise[:5]
