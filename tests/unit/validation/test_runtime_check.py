"""UNSUPPORTED_BY_RUNTIME: what the worker runtime cannot apply is refused by the dry run (before
anything is allocated) and never proposed by the advisor; the worker refuses the same things."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.config.cluster import load_cluster
from trainyard.config.loader import parse_spec_text
from trainyard.config.problems import Code
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor.planner import plan_job
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.advisor.runtime import WORKER_RUNTIME
from trainyard.plugins.advisor.search import REJECT_RUNTIME
from trainyard.plugins.validation.dry_run import validate_job
from trainyard.plugins.validation.runtime import check_runtime

EXAMPLES = Path(__file__).resolve().parents[3] / "config" / "examples"
FLEET = load_cluster("h100-fleet")
LONG = {"sequenceLength: 4096": "sequenceLength: 32768", "globalBatchSize: 256": "globalBatchSize: 64"}


def job_from(**replacements: str) -> TrainingJob:
    text = (EXAMPLES / "llama-7b-finetune.yaml").read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    job, problems = parse_spec_text(text)
    assert job is not None, problems
    return job


def test_the_example_spec_asks_for_nothing_the_runtime_lacks() -> None:
    assert check_runtime(job_from()) == []


@pytest.mark.parametrize(("replacements", "path", "words"), [
    ({"strategy: auto": "strategy: auto\n    contextParallel: 2"}, "spec.parallelism.contextParallel", "cp(2)"),
    ({"mixedPrecision: bf16": "mixedPrecision: fp16"}, "spec.parallelism.hints.mixedPrecision", "fp16"),
    ({"activation: swiglu": "activation: swiglu\n      numExperts: 8"}, "spec.parallelism.hints.numExperts",
     "mixture-of-experts"),
    ({"activation: swiglu": "activation: swiglu\n      tieEmbeddings: true",
      "strategy: auto": "strategy: auto\n    tensorParallel: 2"}, "spec.parallelism.tensorParallel", "tp(2)"),
])
def test_a_spec_asking_for_more_is_rejected_with_the_reason(replacements: dict[str, str], path: str,
                                                            words: str) -> None:
    job = job_from(**replacements)
    [problem] = check_runtime(job)
    assert (problem.code, problem.path, problem.severity) == (Code.UNSUPPORTED_BY_RUNTIME, path, "error")
    assert words in problem.message and problem.hint
    # The dry run reports it even offline (no store, no cluster needed) ...
    offline = validate_job(job, cluster=FLEET, settings=Settings(), offline=True)
    assert problem in offline
    # ... and the advisor refuses to plan it for the worker.
    with pytest.raises(ValueError, match="runtime"):
        plan_job(job, FLEET)


def test_the_advisor_never_recommends_context_parallelism_for_the_worker() -> None:
    job = job_from(**LONG)
    result = plan_job(job, FLEET, top_k=40)
    plans = [result.best, *result.alternatives]
    assert result.feasible and all(p is not None and p.layout.cp == 1 and p.ep == 1 for p in plans)
    assert result.rejected.get(REJECT_RUNTIME, 0) > 0
    # Without the runtime's limits the same search does propose CP (the model allows it).
    unlimited = plan_job(job, FLEET, top_k=40, runtime=None)
    assert any(p.layout.cp > 1 for p in [unlimited.best, *unlimited.alternatives] if p is not None)


def test_the_advisor_avoids_tp_and_pp_for_tied_embeddings() -> None:
    job = job_from(**{"activation: swiglu": "activation: swiglu\n      tieEmbeddings: true"})
    result = plan_job(job, FLEET, top_k=40)
    assert result.feasible
    assert all(p.layout.tp == 1 and p.layout.pp == 1 for p in [result.best, *result.alternatives] if p is not None)


def test_the_worker_refuses_what_the_declaration_refuses() -> None:
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.worker.distributed.parallelize import check_plan, compute_dtype
    from trainyard.worker.models.llama import Llama, LlamaConfig

    model = Llama(LlamaConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_hidden_size=64))
    assert WORKER_RUNTIME.max_cp == 1
    with pytest.raises(ValueError, match=r"cp\(2\)"):
        check_plan(Plan(layout=RankLayout(cp=2)), model)
    assert "fp16" not in WORKER_RUNTIME.precisions
    with pytest.raises(ValueError, match="fp16"):
        compute_dtype("cuda", "fp16")
