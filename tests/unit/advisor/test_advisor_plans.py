"""Where the placer's plan comes from: the advisor, or the spec's degrees without model hints."""

from __future__ import annotations

import pytest

from trainyard.config.cluster import load_cluster
from trainyard.config.loader import load_spec_file
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor.plans import manual_plan, plan_for_job


def with_parallelism(job: TrainingJob, **changes: object) -> TrainingJob:
    par = job.spec.parallelism.model_copy(update=changes)
    return job.model_copy(update={"spec": job.spec.model_copy(update={"parallelism": par})})


def test_the_advisor_plans_specs_with_hints() -> None:
    plan, source = plan_for_job(load_spec_file("config/jobs/demo-tiny-lm.yaml"), load_cluster("local"))
    assert source == "advisor, strategy auto" and plan.layout.world_size == 2
    assert plan.memory_per_gpu_bytes  # an advisor plan carries its estimates


def test_manual_specs_without_hints_keep_their_degrees() -> None:
    job = load_spec_file("config/examples/gpt-200b-pretrain.yaml")
    job = with_parallelism(job, strategy="manual", hints=None, tensor_parallel=8, pipeline_parallel=4)
    plan, source = plan_for_job(job, load_cluster("h100-fleet"))
    assert (plan.layout.tp, plan.layout.pp, plan.layout.dp) == (8, 4, 8) and "no model hints" in source
    assert manual_plan(job) == plan
    # a script of the team's own (this one is from git): no advisor, every rank runs it, DP over gpuCount
    plan, source = plan_for_job(with_parallelism(job, strategy="auto", tensor_parallel=None, pipeline_parallel=None),
                                load_cluster("h100-fleet"))
    assert (plan.layout.tp, plan.layout.pp, plan.layout.dp) == (1, 1, 256) and "no advisor plan" in source
    # Trainyard's own worker builds its model from the hints: nothing to plan without them
    worker = job.model_copy(update={"spec": job.spec.model_copy(update={"source": job.spec.source.model_copy(
        update={"git": None, "entrypoint": "worker/train.py"})})})
    with pytest.raises(ValueError, match=r"strategy 'auto' needs parallelism\.hints"):
        plan_for_job(with_parallelism(worker, strategy="auto"), load_cluster("h100-fleet"))


def test_nothing_fits_is_an_error_unless_previewing_a_manual_configuration() -> None:
    job = load_spec_file("config/examples/gpt-200b-pretrain.yaml")
    job = job.model_copy(update={"spec": job.spec.model_copy(update={
        "hardware": job.spec.hardware.model_copy(update={"gpu_count": 8})})})
    with pytest.raises(ValueError, match=r"no plan fits 8 × H100"):
        plan_for_job(job, load_cluster("h100-fleet"))
    manual = with_parallelism(job, strategy="manual", tensor_parallel=8)
    plan, source = plan_for_job(manual, load_cluster("h100-fleet"), allow_unfit=True)
    assert plan.layout.tp == 8 and "does not fit memory" in source


def test_one_manual_builder_for_specs_with_and_without_hints() -> None:
    from trainyard.plugins.advisor.model import ModelProfile
    from trainyard.plugins.advisor.planner import manual_layout
    from trainyard.plugins.advisor.rank_layout import RankLayout

    job = load_spec_file("config/examples/gpt-200b-pretrain.yaml")
    par = with_parallelism(job, strategy="manual", tensor_parallel=8, pipeline_parallel=4).spec.parallelism
    with_model = manual_layout(par, 256, ModelProfile.from_hints(par.hints))  # type: ignore[arg-type]
    without = manual_layout(par, 256)
    assert with_model.degrees == without.degrees == RankLayout(tp=8, pp=4, dp=8)
    assert par.manual_degrees(256) == (8, 4, 8, 1)  # the spec rules read the same rule
    with pytest.raises(ValueError, match=r"gpuCount 100 is not divisible by TP\(8\) \* PP\(4\) \* CP\(1\)"):
        manual_layout(par, 100)
    with pytest.raises(ValueError, match=r"TP\(8\) \* PP\(4\) \* DP\(2\) \* CP\(1\) = 64 != gpuCount\(256\)"):
        manual_layout(par.model_copy(update={"data_parallel": 2}), 256)
    with pytest.raises(ValueError, match="sequenceParallel needs tensorParallel > 1"):
        manual_layout(par.model_copy(update={"tensor_parallel": 1, "sequence_parallel": True}), 32)
