"""UNSUPPORTED_BY_RUNTIME: a spec that asks for something the worker runtime cannot apply.

The limits are declared once in `plugins/advisor/runtime.py` (`WORKER_RUNTIME`); the advisor
never proposes a plan outside them, and this check rejects a spec that pins one (a context-
parallel degree, fp16, a mixture-of-experts model, tied embeddings under TP or PP) before any
accelerator is allocated — instead of the job failing inside torchrun. It needs no world (no
store, no cluster), so it runs in offline validation too. It lives here, not in
`config/rules.py`, because config imports no engine.
"""

from __future__ import annotations

from trainyard.config.problems import Code, Problem
from trainyard.config.spec import TrainingJob
from trainyard.plugins.advisor.runtime import WORKER_RUNTIME, RuntimeCapabilities


def check_runtime(job: TrainingJob, runtime: RuntimeCapabilities = WORKER_RUNTIME) -> list[Problem]:
    par = job.spec.parallelism
    hints = par.hints
    tied = bool(hints and hints.tie_embeddings)
    asks = [
        ("spec.parallelism.contextParallel", {"cp": par.degree("context_parallel")},
         "remove contextParallel (or set it to 1); long sequences fit with more recomputation, "
         "ZeRO-3 or more devices"),
        ("spec.parallelism.hints.numExperts", {"moe": bool(hints and (hints.num_experts or 1) > 1)},
         "the worker's model is dense; run a mixture-of-experts model with its own runtime"),
        ("spec.parallelism.hints.mixedPrecision", {"precision": hints.mixed_precision if hints else None},
         f"use mixedPrecision {' or '.join(runtime.precisions)}"),
        ("spec.parallelism.tensorParallel", {"tp": par.degree("tensor_parallel"), "tie_embeddings": tied},
         "set tieEmbeddings false or tensorParallel 1"),
        ("spec.parallelism.pipelineParallel", {"pp": par.degree("pipeline_parallel"), "tie_embeddings": tied},
         "set tieEmbeddings false or pipelineParallel 1"),
    ]
    return [Problem(code=Code.UNSUPPORTED_BY_RUNTIME, path=path, message=reason, hint=hint)
            for path, ask, hint in asks for reason in runtime.refusals(**ask)]
