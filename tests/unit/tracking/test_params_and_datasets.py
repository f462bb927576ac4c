"""Param flattening and dataset identity (digest, canonical URI) on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.tracking.factories import make_job, write_jsonl
from trainyard.config.settings import Settings
from trainyard.config.spec import Dataset
from trainyard.plugins.data.datasets import canonical_dataset_uri, describe_dataset, sample_rows
from trainyard.plugins.storage.store import open_store
from trainyard.plugins.tracking.params import (
    MAX_KEY_CHARS,
    flatten,
    param_value,
    safe_key,
    spec_params,
)


def test_flatten_uses_dotted_names_json_for_lists_and_skips_empty() -> None:
    assert flatten({"a": {"b": 1, "c": [1, "x"], "d": None, "e": {}}, "f": True, "g": "text"}, "p") == {
        "p.a.b": "1", "p.a.c": '[1,"x"]', "p.f": "true", "p.g": "text"}


def test_spec_params_keep_the_yaml_spelling() -> None:
    params = spec_params(make_job())
    assert params["spec.hardware.gpuCount"] == "2"
    assert params["spec.checkpoint.async"] == "true"
    assert params["spec.faultTolerance.hangTimeout"] == "2m"  # as written, not as parsed
    assert "apiVersion" not in params and "kind" not in params


def test_keys_and_values_fit_mlflow_limits() -> None:
    assert safe_key("label.app.kubernetes.io/name") == "label.app.kubernetes.io/name"
    assert safe_key("weird key=é") == "weird key__"
    long = safe_key("x" * 400)
    assert len(long) == MAX_KEY_CHARS and long != safe_key("x" * 401)
    assert len(param_value("y" * 10_000)) == 6000


def shards(root: Path, rows_per_shard: dict[str, list[dict]]) -> Path:
    for name, rows in rows_per_shard.items():
        write_jsonl(root / name, rows)
    return root


def test_content_digest_tracks_bytes_listing_digest_tracks_files(tmp_path: Path) -> None:
    ds = Dataset(source="x", version="v3")
    a = shards(tmp_path / "a", {"p0.jsonl": [{"text": "one"}], "p1.jsonl": [{"text": "two"}], "README.md": []})
    b = shards(tmp_path / "b", {"p0.jsonl": [{"text": "one"}], "p1.jsonl": [{"text": "two"}]})
    ref_a, ref_b = describe_dataset(open_store(a), ds), describe_dataset(open_store(b), ds)
    assert ref_a.digest == ref_b.digest and ref_a.digest_method == "content"  # same data, other place
    assert (ref_a.num_shards, ref_a.version, ref_a.uri) == (2, "v3", a.as_uri())
    (b / "p1.jsonl").write_text('{"text": "tw0"}\n')  # same size, different bytes
    assert describe_dataset(open_store(b), ds).digest != ref_a.digest
    listing = describe_dataset(open_store(b), ds, hash_contents=False)
    assert listing.digest_method == "listing"
    assert describe_dataset(open_store(a), ds, hash_contents=False).digest == listing.digest  # sizes equal
    write_jsonl(b / "p2.jsonl", [{"text": "three"}])
    assert describe_dataset(open_store(b), ds, hash_contents=False).digest != listing.digest
    with pytest.raises(FileNotFoundError, match="no jsonl shards"):
        describe_dataset(open_store(tmp_path / "empty"), ds)


def test_canonical_uri_resolves_object_store_prefixes(settings: Settings) -> None:
    objects = Path(settings.object_store.removeprefix("file://"))
    assert canonical_dataset_uri("datasets/wiki/", settings) == (objects / "datasets/wiki").as_uri()
    assert canonical_dataset_uri((objects / "datasets/wiki").as_uri() + "/", settings) == (
        objects / "datasets/wiki").as_uri()
    assert canonical_dataset_uri("s3://bucket/datasets/wiki/", settings) == "s3://bucket/datasets/wiki"


def test_sample_takes_from_each_shard_and_records_origins(tmp_path: Path) -> None:
    root = shards(tmp_path, {"a.jsonl": [{"text": "a"}] * 2, "b.jsonl": [{"text": "b"}] * 10})
    sample = sample_rows(open_store(root), "jsonl", 6)
    assert len(sample.rows) == 6 and sample.origins[:3] == [("a.jsonl", 1), ("a.jsonl", 2), ("b.jsonl", 1)]
    with pytest.raises(ValueError, match="limit must be >= 1"):
        sample_rows(open_store(root), "jsonl", 0)


def test_tracking_and_validation_modules_import_no_heavy_library() -> None:
    from tests.support.imports import assert_none_loaded

    assert_none_loaded("tracking_and_validation", {"mlflow", "great_expectations", "torch", "pandas"})
