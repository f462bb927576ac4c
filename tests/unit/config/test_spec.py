from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from trainyard.config.loader import load_spec_file, validate_document
from trainyard.config.problems import Code, SpecError
from trainyard.config.spec import TrainingJob

CONFIG = Path(__file__).resolve().parents[3] / "config"
SPECS = sorted([*(CONFIG / "jobs").glob("*.yaml"), *(CONFIG / "examples").glob("*.yaml")])
"""The embedded stack's jobs and the examples of production."""


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_example_spec_loads(path: Path) -> None:
    job = load_spec_file(path)
    assert isinstance(job, TrainingJob)
    assert job.to_yaml_dict()["apiVersion"] == "training.platform/v1"


def test_camel_case_in_yaml_snake_case_in_python(h100_doc: dict[str, Any]) -> None:
    job, problems = validate_document(h100_doc)
    assert problems == [] and job is not None
    assert job.spec.hardware.gpu_count == 64
    assert job.spec.hardware.min_gpu_count == 32
    assert job.spec.hardware.gpu_memory_min == 80_000_000_000
    assert job.spec.training.max_runtime == timedelta(hours=48)
    assert job.spec.checkpoint.interval_minutes == 30
    assert job.spec.checkpoint.async_save is True
    assert job.spec.parallelism.hints is not None
    assert job.spec.parallelism.hints.model_parameters == 6_700_000_000
    assert job.spec.training.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_round_trip_keeps_the_yaml_spelling(h100_doc: dict[str, Any]) -> None:
    job, _ = validate_document(h100_doc)
    assert job is not None
    again, problems = validate_document(job.to_yaml_dict())
    assert problems == [] and again == job
    assert job.to_yaml_dict()["spec"]["training"]["maxRuntime"] == "2d"


def test_unknown_key_suggests_the_closest(demo_doc: dict[str, Any]) -> None:
    demo_doc["spec"]["hardware"]["gpuCuont"] = demo_doc["spec"]["hardware"].pop("gpuCount")
    _, problems = validate_document(demo_doc)
    # One problem, on the key the user wrote: not also "gpuCount is missing".
    (p,) = problems
    assert p.code == Code.UNKNOWN_FIELD
    assert p.path == "spec.hardware.gpuCuont"
    assert p.hint == "did you mean 'gpuCount'?"


def test_unknown_key_without_a_close_match_lists_the_valid_ones(demo_doc: dict[str, Any]) -> None:
    demo_doc["spec"]["checkpoint"]["zzz"] = 1
    _, problems = validate_document(demo_doc)
    (p,) = problems
    assert p.code == Code.UNKNOWN_FIELD and "intervalSteps" in p.hint


def test_every_problem_is_reported_at_once(demo_doc: dict[str, Any]) -> None:
    demo_doc["metadata"]["priority"] = "urgent"
    demo_doc["spec"]["training"]["maxSteps"] = -3
    demo_doc["spec"]["faultTolerance"]["hangTimeout"] = "soon"
    del demo_doc["spec"]["dataset"]["source"]
    _, problems = validate_document(demo_doc)
    assert {p.path for p in problems} == {
        "metadata.priority", "spec.training.maxSteps", "spec.faultTolerance.hangTimeout",
        "spec.dataset.source",
    }
    by_path = {p.path: p for p in problems}
    assert "'critical'" in by_path["metadata.priority"].hint
    assert by_path["spec.dataset.source"].code == Code.MISSING_FIELD
    assert "soon" in by_path["spec.faultTolerance.hangTimeout"].message


def test_wrong_kind_and_version(demo_doc: dict[str, Any]) -> None:
    demo_doc["kind"] = "Job"
    demo_doc["apiVersion"] = "v2"
    _, problems = validate_document(demo_doc)
    assert {p.path for p in problems} == {"kind", "apiVersion"}
    assert all(p.code == Code.INVALID_VALUE for p in problems)


def test_unsupported_compression_names_the_alternative(demo_doc: dict[str, Any]) -> None:
    demo_doc["spec"]["checkpoint"]["compression"] = "lz4"
    _, problems = validate_document(demo_doc)
    (p,) = problems
    assert p.path == "spec.checkpoint.compression" and "zstd" in p.message


def test_env_scalars_become_strings(demo_doc: dict[str, Any]) -> None:
    demo_doc["spec"]["training"]["env"] = {"A": 1, "B": True, "C": 0.5}
    job, problems = validate_document(demo_doc)
    assert problems == [] and job is not None
    assert job.spec.training.env == {"A": "1", "B": "true", "C": "0.5"}


def test_spec_error_carries_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: training.platform/v1\nkind: TrainingJob\nmetadata: {}\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(bad)
    assert {p.path for p in info.value.problems} == {"metadata.name", "metadata.team", "spec"}


def test_ffn_and_kv_defaults() -> None:
    from trainyard.config.spec import ModelHints

    llama = ModelHints(hidden_size=4096, num_layers=32, num_attention_heads=32, sequence_length=2048,
                       global_batch_size=8)
    assert llama.shape().ffn_hidden_size == 11008  # Llama 7B's own value
    assert llama.shape().num_kv_heads == 32
    gelu = ModelHints(hidden_size=1024, num_layers=2, num_attention_heads=8, sequence_length=8,
                      global_batch_size=1, activation="gelu")
    assert gelu.shape().ffn_hidden_size == 4096


def test_hints_are_the_fields_own_docstrings(demo_doc: dict[str, Any]) -> None:
    """The loader reads a field's attribute docstring when a problem needs a hint (the models
    leave pydantic's `use_attribute_docstrings` off: it made every DAG parse walk the import
    frames); inherited fields, nested sections and explicit descriptions all still give one."""
    from trainyard.config.loader import attribute_docs
    from trainyard.config.spec import HardwareRequest, Metadata, Section

    del demo_doc["metadata"]["name"]
    demo_doc["spec"]["hardware"]["gpuCount"] = -3
    _, problems = validate_document(demo_doc)
    hints = {p.path: p.hint for p in problems}
    assert hints["metadata.name"] == "Job name; becomes the DAG id, the Kubernetes object names and the storage prefix"
    assert hints["spec.hardware.gpuCount"] == "Total accelerators (= world size)"
    assert attribute_docs(Metadata)["team"].startswith("Owning team")
    assert set(attribute_docs(HardwareRequest)) <= set(HardwareRequest.model_fields)

    class Derived(Metadata):
        extra_field: int = 0
        """Declared in a subclass."""

    docs = attribute_docs(Derived)
    assert docs["extra_field"] == "Declared in a subclass." and docs["name"].startswith("Job name")
    assert not Section.model_config.get("use_attribute_docstrings")
