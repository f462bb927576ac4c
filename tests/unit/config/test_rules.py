"""Each cross-field rule: one failing case (with its code) and one passing case."""

from __future__ import annotations

from typing import Any

import pytest

from trainyard.config.cluster import load_cluster
from trainyard.config.loader import validate_document
from trainyard.config.problems import Code, Problem
from trainyard.config.rules import check_against_cluster, check_spec
from trainyard.config.spec import TrainingJob


def _job(doc: dict[str, Any]) -> TrainingJob:
    job, problems = validate_document(doc)
    assert job is not None, problems
    return job


def _codes(problems: list[Problem]) -> list[Code]:
    return [p.code for p in problems if p.severity == "error"]


def _manual(doc: dict[str, Any], **degrees: int) -> dict[str, Any]:
    doc["spec"]["parallelism"]["strategy"] = "manual"
    doc["spec"]["parallelism"].update(degrees)
    return doc


def test_examples_pass_every_rule(demo_doc: dict[str, Any], h100_doc: dict[str, Any]) -> None:
    assert _codes(check_spec(_job(demo_doc))) == []
    assert _codes(check_against_cluster(_job(demo_doc), load_cluster("local"))) == []
    assert _codes(check_spec(_job(h100_doc))) == []
    assert _codes(check_against_cluster(_job(h100_doc), load_cluster("h100-fleet"))) == []


def test_parallelism_mismatch(h100_doc: dict[str, Any]) -> None:
    job = _job(_manual(h100_doc, tensorParallel=4, pipelineParallel=2, dataParallel=4))
    (p,) = [p for p in check_spec(job) if p.code == Code.PARALLELISM_MISMATCH]
    assert p.message == "TP(4) * PP(2) * DP(4) * CP(1) = 32 != gpuCount(64)"
    assert "dataParallel: 8" in p.hint
    ok = _job(_manual(h100_doc, dataParallel=8))
    assert Code.PARALLELISM_MISMATCH not in _codes(check_spec(ok))


def test_manual_without_dp_fills_the_gpus(h100_doc: dict[str, Any]) -> None:
    assert _codes(check_spec(_job(_manual(h100_doc, tensorParallel=8, pipelineParallel=2)))) == []
    bad = _job(_manual(h100_doc, tensorParallel=8, pipelineParallel=2, contextParallel=3))
    assert Code.PARALLELISM_MISMATCH in _codes(check_spec(bad))


def test_auto_with_pinned_degrees_must_divide(h100_doc: dict[str, Any]) -> None:
    h100_doc["spec"]["parallelism"]["tensorParallel"] = 8
    assert _codes(check_spec(_job(h100_doc))) == []
    h100_doc["spec"]["parallelism"]["pipelineParallel"] = 3
    assert Code.PARALLELISM_MISMATCH in _codes(check_spec(_job(h100_doc)))


def test_tp_exceeds_node(h100_doc: dict[str, Any]) -> None:
    fleet = load_cluster("h100-fleet")
    bad = _job(_manual(h100_doc, tensorParallel=16, dataParallel=4))
    (p,) = [p for p in check_against_cluster(bad, fleet) if p.code == Code.TP_EXCEEDS_NODE]
    assert "16" in p.message and "8" in p.message and "tensorParallel ≤ 8" in p.hint
    ok = _job(_manual(h100_doc, tensorParallel=8, dataParallel=8))
    assert check_against_cluster(ok, fleet) == []


def test_pp_without_a_layer_per_stage_is_an_error(h100_doc: dict[str, Any]) -> None:
    (p,) = [p for p in check_spec(_job(_manual(h100_doc, pipelineParallel=64, dataParallel=1)))
            if p.code == Code.PP_LAYER_MISMATCH]
    assert p.severity == "error"
    assert p.message == ("32 layers cannot fill PP(64) = 64 stages; every stage needs at least one layer")
    assert "[1, 2, 4, 8, 16, 32]" in p.hint
    assert Code.PP_LAYER_MISMATCH not in _codes(check_spec(_job(_manual(h100_doc, pipelineParallel=4))))


def test_uneven_pipeline_split_is_a_warning_naming_the_stages(h100_doc: dict[str, Any]) -> None:
    """Llama 3 405B ran 126 layers on PP16: valid, first and last stages one layer lighter."""
    h100_doc["spec"]["parallelism"]["hints"]["numLayers"] = 126
    problems = check_spec(_job(_manual(h100_doc, pipelineParallel=16, dataParallel=4, tensorParallel=1)))
    (p,) = [p for p in problems if p.code == Code.PP_LAYER_MISMATCH]
    assert p.severity == "warning"
    assert "stages of 7, 8 ×14, 7 layers" in p.message
    assert "holds 8 where an even split would hold 7.88 (+1.6% step time)" in p.message
    assert Code.PP_LAYER_MISMATCH not in _codes(problems)


def test_pp_with_virtual_stages_must_leave_a_layer_per_stage(h100_doc: dict[str, Any]) -> None:
    job = _job(_manual(h100_doc, pipelineParallel=8, virtualPipelineStages=8))
    assert Code.PP_LAYER_MISMATCH in _codes(check_spec(job))
    uneven = _job(_manual(h100_doc, pipelineParallel=8, virtualPipelineStages=3))
    (p,) = [p for p in check_spec(uneven) if p.code == Code.PP_LAYER_MISMATCH]
    assert p.severity == "warning" and "virtual stages(3)" in p.message


def test_tp_head_mismatch(h100_doc: dict[str, Any]) -> None:
    h100_doc["spec"]["parallelism"]["hints"]["numAttentionHeads"] = 36
    h100_doc["spec"]["parallelism"]["hints"]["hiddenSize"] = 4608
    (p,) = [p for p in check_spec(_job(_manual(h100_doc, tensorParallel=8))) if p.code == Code.TP_HEAD_MISMATCH]
    assert "36" in p.message and "TP(8)" in p.message
    assert _codes(check_spec(_job(_manual(h100_doc, tensorParallel=4)))) == []


def test_tp_must_divide_kv_heads_too(h100_doc: dict[str, Any]) -> None:
    h100_doc["spec"]["parallelism"]["hints"]["numKeyValueHeads"] = 4
    (p,) = [p for p in check_spec(_job(_manual(h100_doc, tensorParallel=8))) if p.code == Code.TP_HEAD_MISMATCH]
    assert "numKeyValueHeads = 4" in p.message


def test_min_gpu_count(h100_doc: dict[str, Any]) -> None:
    h100_doc["spec"]["hardware"]["minGpuCount"] = 128
    (p,) = [p for p in check_spec(_job(h100_doc)) if p.code == Code.MIN_GPU_COUNT]
    assert "128" in p.message and "64" in p.message
    h100_doc["spec"]["hardware"]["minGpuCount"] = 64
    assert _codes(check_spec(_job(h100_doc))) == []


def test_unknown_gpu_type_suggests(h100_doc: dict[str, Any]) -> None:
    h100_doc["spec"]["hardware"]["gpuType"] = "H10O"
    (p,) = check_against_cluster(_job(h100_doc), load_cluster("h100-fleet"))
    assert p.code == Code.UNKNOWN_GPU_TYPE and p.hint == "did you mean 'H100'?"
    h100_doc["spec"]["hardware"]["gpuType"] = "TPUv5"
    (p,) = check_against_cluster(_job(h100_doc), load_cluster("h100-fleet"))
    assert "this cluster has: H100" in p.hint


def test_cluster_too_small_and_memory_floor(h100_doc: dict[str, Any]) -> None:
    fleet = load_cluster("h100-fleet")
    h100_doc["spec"]["hardware"]["gpuCount"] = 20000
    h100_doc["spec"]["hardware"]["minGpuCount"] = 16
    h100_doc["spec"]["hardware"]["gpuMemoryMin"] = "141GB"
    codes = _codes(check_against_cluster(_job(h100_doc), fleet))
    assert codes == [Code.CLUSTER_TOO_SMALL, Code.GPU_MEMORY_TOO_SMALL]


@pytest.mark.parametrize(("storage", "ok"), [
    ("s3://checkpoints/llama-7b-finetune-v3/", True),
    ("s3://ckpt/teams/nlp/llama-7b-finetune-v3/", True),
    ("file:///data/jobs/llama-7b-finetune-v3", True),
    # The storage is the job's folder (runs go to <storage>/runs/<run>): its last segment
    # names the job, and it never nests inside a job's area or a run's folder.
    ("s3://ckpt/teams/nlp/llama-7b-finetune-v3/run1/", False),
    ("file:///data/jobs/llama-7b-finetune-v3/checkpoints", False),
    ("s3://ckpt/jobs/other-job/checkpoints/llama-7b-finetune-v3", False),
    ("s3://ckpt/jobs/other-job/llama-7b-finetune-v3/", False),
    ("s3://ckpt/other/runs/x/llama-7b-finetune-v3/", False),
    ("s3://ckpt/llama-7b-finetune-v3/%2e%2e/llama-7b-finetune-v3/", False),
    ("s3://checkpoints/other-job/", False),
    ("s3://llama-7b-finetune-v3/", False),  # a bucket named like the job is not the job's prefix
    ("s3://checkpoints/llama-7b-finetune-v3/../other-job/", False),
    ("gs://checkpoints/llama-7b-finetune-v3/", False),
])
def test_checkpoint_prefix(h100_doc: dict[str, Any], storage: str, ok: bool) -> None:
    h100_doc["spec"]["checkpoint"]["storage"] = storage
    codes = _codes(check_spec(_job(h100_doc)))
    assert (Code.CHECKPOINT_PREFIX not in codes) is ok


@pytest.mark.parametrize(("name", "ok"), [
    ("RANK", False), ("WORLD_SIZE", False), ("MASTER_ADDR", False), ("MASTER_PORT", False),
    ("LOCAL_RANK", False), ("TRAINYARD_PLAN", False), ("MLFLOW_RUN_ID", False),
    ("TORCHELASTIC_RESTART_COUNT", False), ("NCCL_DEBUG", True), ("MY_RANK", True),
])
def test_reserved_env(h100_doc: dict[str, Any], name: str, ok: bool) -> None:
    h100_doc["spec"]["training"]["env"] = {name: "1"}
    problems = [p for p in check_spec(_job(h100_doc)) if p.code == Code.RESERVED_ENV]
    assert (not problems) is ok
    if problems:
        assert problems[0].path == f"spec.training.env.{name}"


@pytest.mark.parametrize(("name", "ok"), [
    ("llama-7b", True), ("a", True), ("Llama_7B", False), ("-llama", False), ("llama-", False),
    ("x" * 53, False), ("llama.7b", False),
])
def test_job_name(demo_doc: dict[str, Any], name: str, ok: bool) -> None:
    demo_doc["metadata"]["name"] = name
    problems = [p for p in check_spec(_job(demo_doc)) if p.code == Code.INVALID_JOB_NAME]
    assert (not problems) is ok


def test_job_name_hint_offers_a_valid_name(demo_doc: dict[str, Any]) -> None:
    demo_doc["metadata"]["name"] = "Llama_7B Finetune"
    (p,) = [p for p in check_spec(_job(demo_doc)) if p.code == Code.INVALID_JOB_NAME]
    assert p.hint == "try 'llama-7b-finetune'"


def test_trainyards_worker_needs_hints_a_script_of_ones_own_is_only_told(demo_doc: dict[str, Any]) -> None:
    del demo_doc["spec"]["parallelism"]["hints"]
    assert _codes(check_spec(_job(demo_doc))) == [Code.HINTS_REQUIRED]  # worker/train.py builds its model from them
    demo_doc["spec"]["parallelism"]["strategy"] = "manual"
    assert _codes(check_spec(_job(demo_doc))) == [Code.HINTS_REQUIRED]
    demo_doc["spec"]["source"]["entrypoint"] = "/home/team/train.py"
    assert _codes(check_spec(_job(demo_doc))) == []
    demo_doc["spec"]["parallelism"]["strategy"] = "auto"
    (note,) = [p for p in check_spec(_job(demo_doc)) if p.code == Code.HINTS_REQUIRED]
    assert note.severity == "warning" and "no advisor plan and no memory-fit check" in note.message


def test_trainyards_worker_needs_a_dataset_and_max_steps_a_script_of_ones_own_does_not(
        demo_doc: dict[str, Any]) -> None:
    del demo_doc["spec"]["dataset"]
    del demo_doc["spec"]["training"]["maxSteps"]
    problems = [p for p in check_spec(_job(demo_doc)) if p.severity == "error"]
    assert sorted(p.path for p in problems) == ["spec.dataset", "spec.training.maxSteps"]
    demo_doc["spec"]["source"]["entrypoint"] = "/home/team/train.py"
    assert _codes(check_spec(_job(demo_doc))) == []


@pytest.mark.parametrize(("expr", "ok"), [("0 3 * * *", True), ("@daily", True), ("every day", False),
                                          ("61 * * * *", False)])
def test_schedule(demo_doc: dict[str, Any], expr: str, ok: bool) -> None:
    demo_doc["spec"]["schedule"] = expr
    assert (Code.INVALID_SCHEDULE not in _codes(check_spec(_job(demo_doc)))) is ok


@pytest.mark.parametrize(("expr", "ok"), [("@daily", True), ("0 3 * * 1", True), ("@once", False),
                                          ("@continuous", False)])
def test_schedule_beside_a_retraining_asset(demo_doc: dict[str, Any], expr: str, ok: bool) -> None:
    demo_doc["spec"]["schedule"] = expr
    demo_doc["spec"]["retrain"] = {"onAsset": "datasets/pydoc-topics/"}
    problems = [p for p in check_spec(_job(demo_doc)) if p.code == Code.INVALID_SCHEDULE]
    assert (problems == []) is ok
    if not ok:
        assert "retrain.onAsset" in problems[0].message and problems[0].path == "spec.schedule"


def test_unimplemented_features_are_warnings_not_silence(h100_doc: dict[str, Any]) -> None:
    h100_doc["spec"]["faultTolerance"]["redundantCompute"] = True
    problems = check_spec(_job(h100_doc))
    assert [p.severity for p in problems] == ["warning"]
