"""The dry run's memory check: INSUFFICIENT_GPU_MEMORY (auto and manual) with the estimate,
the budget and what would fit; MODEL_SIZE_MISMATCH past 5 %; silence where the rules speak."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainyard.config.cluster import load_cluster
from trainyard.config.loader import parse_spec_text
from trainyard.config.problems import Code
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor.model import ModelProfile
from trainyard.plugins.validation.memory import check_memory

JOBS = Path(__file__).resolve().parents[3] / "config" / "jobs"
EXAMPLES = JOBS.parent / "examples"
FLEET = load_cluster("h100-fleet")


def job_from(name: str, **replacements: str) -> TrainingJob:
    text = (JOBS / name if (JOBS / name).exists() else EXAMPLES / name).read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    job, problems = parse_spec_text(text)
    assert job is not None, problems
    return job


def test_the_example_specs_fit() -> None:
    assert check_memory(job_from("demo-tiny-lm.yaml"), load_cluster("local"), memory_fraction=0.9) == []
    assert check_memory(job_from("llama-7b-finetune.yaml"), FLEET, memory_fraction=0.9) == []


def test_auto_strategy_that_cannot_fit_names_need_budget_and_what_would_fit() -> None:
    job = job_from("llama-7b-finetune.yaml", **{"gpuCount: 64": "gpuCount: 1", "minGpuCount: 32": "minGpuCount: 1"})
    [problem] = check_memory(job, FLEET, memory_fraction=0.9)
    assert problem.code == Code.INSUFFICIENT_GPU_MEMORY and problem.severity == "error"
    assert problem.path == "spec.hardware.gpuCount"
    assert "the 80.0 GiB of one H100" in problem.message  # refused only above the device itself
    need = int(re.search(r"\(([\d,]+) bytes\)", problem.message).group(1).replace(",", ""))
    assert need > 80 * 1024**3
    assert "more devices:" in problem.hint


def test_manual_configuration_that_does_not_fit_is_an_error_with_fixes() -> None:
    job = job_from("llama-7b-finetune.yaml", **{"strategy: auto": "strategy: manual\n    microBatchSize: 4"})
    [problem] = check_memory(job, FLEET, memory_fraction=0.9)
    assert problem.code == Code.INSUFFICIENT_GPU_MEMORY and problem.path == "spec.parallelism"
    assert "TP1·PP1·DP64 ZeRO-0 mbs4×1" in problem.message and "GiB" in problem.message
    assert "would fit" in problem.hint


MANUAL_FSDP = {"strategy: auto": "strategy: manual\n    zeroStage: 3\n    activationCheckpointing: full"}


def test_a_plan_above_the_budget_but_within_the_device_is_a_warning_with_both_margins() -> None:
    job = job_from("llama-7b-finetune.yaml", **MANUAL_FSDP)
    assert check_memory(job, FLEET, memory_fraction=0.9) == []
    [problem] = check_memory(job, FLEET, memory_fraction=0.05)  # a budget of 4 GiB
    assert (problem.code, problem.severity, problem.path) == (
        Code.INSUFFICIENT_GPU_MEMORY, "warning", "spec.parallelism")
    need, over, budget, spare = (float(x) for x in re.search(
        r"needs an estimated ([\d.]+) GiB per device, ([\d.]+) GiB over the budget of ([\d.]+) GiB "
        r"\(5% of 80 GiB H100\); it runs in the headroom with ([\d.]+) GiB to spare",
        problem.message).groups())
    assert budget == 4.0 and need == pytest.approx(budget + over, abs=0.1)
    assert need + spare == pytest.approx(80.0, abs=0.1)
    assert "keepMemoryHeadroom" in problem.hint


def test_keeping_headroom_turns_a_plan_in_it_into_an_error() -> None:
    job = job_from("llama-7b-finetune.yaml", **{
        "gpuCount: 64": "gpuCount: 64\n    keepMemoryHeadroom: 0.95", **MANUAL_FSDP})
    assert job.spec.hardware.keep_memory_headroom == 0.95
    [problem] = check_memory(job, FLEET, memory_fraction=0.9)
    assert (problem.code, problem.severity) == (Code.INSUFFICIENT_GPU_MEMORY, "error")
    assert "the 4.0 GiB per device that keepMemoryHeadroom 0.95 leaves of 80 GiB H100" in problem.message


def test_the_headroom_kept_must_be_a_share_of_the_device() -> None:
    for bad in ("1", "-0.1", "1.5"):
        text = (EXAMPLES / "llama-7b-finetune.yaml").read_text().replace(
            "gpuCount: 64", f"gpuCount: 64\n    keepMemoryHeadroom: {bad}")
        job, problems = parse_spec_text(text)
        assert job is None and any("keepMemoryHeadroom" in p.path for p in problems), bad


@pytest.mark.parametrize("factor,warned", [(1.049, False), (0.951, False), (1.06, True), (0.9, True)])
def test_model_size_mismatch_is_a_warning_past_five_percent(factor: float, warned: bool) -> None:
    job = job_from("llama-7b-finetune.yaml")
    actual = ModelProfile.from_hints(job.spec.parallelism.hints).parameter_count()
    job = job_from("llama-7b-finetune.yaml", **{"modelParameters: 6.7e9": f"modelParameters: {int(actual * factor)}"})
    problems = check_memory(job, FLEET, memory_fraction=0.9)
    mismatch = [p for p in problems if p.code == Code.MODEL_SIZE_MISMATCH]
    assert bool(mismatch) == warned
    if warned:
        assert mismatch[0].severity == "warning"
        assert f"{int(actual * factor):,}" in mismatch[0].message and f"{actual:,}" in mismatch[0].message


def test_specs_the_rules_reject_are_left_to_the_rules() -> None:
    no_hints = job_from("demo-tiny-lm.yaml")
    no_hints = no_hints.model_copy(update={"spec": no_hints.spec.model_copy(update={
        "parallelism": no_hints.spec.parallelism.model_copy(update={"hints": None})})})
    assert check_memory(no_hints, load_cluster("local"), memory_fraction=0.9) == []
    wrong_type = job_from("demo-tiny-lm.yaml")
    assert check_memory(wrong_type, FLEET, memory_fraction=0.9) == []  # no cpu devices there
    bad_manual = job_from("demo-tiny-lm.yaml", **{"strategy: auto": "strategy: manual\n    dataParallel: 3"})
    assert check_memory(bad_manual, load_cluster("local"), memory_fraction=0.9) == []
