"""Cross-field rules: what the spec alone — or the spec against a cluster — can decide.

Each rule is a small function that returns `Problem`s with a stable code; `check_spec` and
`check_against_cluster` run all of them, so a user sees every mistake at once. Checks that need
the world (memory fit, dataset present, quota) are the dry run in `plugins/validation/`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from trainyard.config.cluster import Cluster
from trainyard.config.pipeline import describe_split, rank_layer_counts, split_imbalance
from trainyard.config.prefix import UnsafePath, locate, storage_problem
from trainyard.config.problems import Code, Problem, preview
from trainyard.config.spec import TrainingJob
from trainyard.config.worker_env import is_reserved

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_JOB_NAME = 52
"""A job name is a label value and names its DAG; on Kubernetes each run's Volcano Job name is cut
further, with a digest, so its pods' hostnames stay DNS labels at any gang size
(`trainyard.plugins.launch.manifests.MAX_VOLCANO_NAME`)."""

Rule = Callable[[TrainingJob], Iterable[Problem]]


def job_name(job: TrainingJob) -> Iterable[Problem]:
    name = job.metadata.name
    if len(name) > MAX_JOB_NAME:
        yield Problem(code=Code.INVALID_JOB_NAME, path="metadata.name",
                      message=f"'{name}' is {len(name)} characters; at most {MAX_JOB_NAME}",
                      hint="Kubernetes object names derived from it must stay within 63 characters")
    if not DNS1123_LABEL.match(name):
        suggestion = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:MAX_JOB_NAME] or "my-job"
        yield Problem(code=Code.INVALID_JOB_NAME, path="metadata.name",
                      message=f"'{name}' is not a valid Kubernetes name (DNS-1123 label: lowercase "
                              "letters, digits and '-', starting and ending with a letter or digit)",
                      hint=f"try '{suggestion}'")


def manual_degrees(job: TrainingJob) -> Iterable[Problem]:
    par, gpus = job.spec.parallelism, job.spec.hardware.gpu_count
    tp, pp, dp, cp = par.manual_degrees(gpus)
    if par.strategy != "manual" and par.data_parallel is None:
        if gpus % (tp * pp * cp):
            yield Problem(code=Code.PARALLELISM_MISMATCH, path="spec.parallelism",
                          message=f"gpuCount {gpus} is not divisible by TP({tp}) * PP({pp}) * CP({cp}) = {tp * pp * cp}",
                          hint="change gpuCount or the fixed degrees")
        return
    product = tp * pp * dp * cp
    if product != gpus:
        yield Problem(code=Code.PARALLELISM_MISMATCH, path="spec.parallelism",
                      message=f"TP({tp}) * PP({pp}) * DP({dp}) * CP({cp}) = {product} != gpuCount({gpus})",
                      hint=f"make the product equal gpuCount, e.g. dataParallel: {gpus // (tp * pp * cp)}"
                      if gpus % (tp * pp * cp) == 0 else "make the product of the degrees equal gpuCount")


def model_divisibility(job: TrainingJob) -> Iterable[Problem]:
    par = job.spec.parallelism
    hints = par.hints
    if hints is None:
        return
    tp, pp = par.degree("tensor_parallel"), par.degree("pipeline_parallel")
    vpp = par.degree("virtual_pipeline_stages")
    if hints.num_layers % (pp * vpp):
        yield pipeline_split_problem(hints.num_layers, pp, vpp)
    for heads, label in ((hints.num_attention_heads, "numAttentionHeads"),
                         (hints.shape().num_kv_heads, "numKeyValueHeads")):
        if heads % tp:
            yield Problem(code=Code.TP_HEAD_MISMATCH, path="spec.parallelism.tensorParallel",
                          message=f"{label} = {heads} is not divisible by TP({tp})",
                          hint="tensor parallelism splits attention heads; pick a TP degree that divides them")
            break
    if hints.num_key_value_heads and hints.num_attention_heads % hints.num_key_value_heads:
        yield Problem(code=Code.INVALID_VALUE, path="spec.parallelism.hints.numKeyValueHeads",
                      message=f"numAttentionHeads {hints.num_attention_heads} is not a multiple of "
                              f"numKeyValueHeads {hints.num_key_value_heads}",
                      hint="grouped-query attention shares each KV head among a whole number of query heads")
    if hints.hidden_size % hints.num_attention_heads:
        yield Problem(code=Code.INVALID_VALUE, path="spec.parallelism.hints.hiddenSize",
                      message=f"hiddenSize {hints.hidden_size} is not divisible by numAttentionHeads "
                              f"{hints.num_attention_heads}", hint="the head dimension must be a whole number")


def pipeline_split_problem(layers: int, pp: int, vpp: int) -> Problem:
    """PP_LAYER_MISMATCH: an error when a stage would get no layer; otherwise a warning naming
    the uneven split (`config/pipeline.py`) — Llama 3 405B (126 layers on PP16) and BLOOM-176B
    (70 layers on PP12) trained that way, so it is valid, only slower than an even split."""
    stages = f"PP({pp})" + (f" * virtual stages({vpp})" if vpp > 1 else "")
    divisors = [d for d in range(1, layers + 1) if layers % d == 0]
    if pp * vpp > layers:
        return Problem(code=Code.PP_LAYER_MISMATCH, path="spec.parallelism.pipelineParallel",
                       message=f"{layers} layers cannot fill {stages} = {pp * vpp} stages; "
                               "every stage needs at least one layer",
                       hint=f"use at most {layers} stages, e.g. a degree that divides {layers}: {divisors[:8]}")
    imbalance = split_imbalance(layers, pp, vpp)
    return Problem(code=Code.PP_LAYER_MISMATCH, path="spec.parallelism.pipelineParallel",
                   severity="warning",
                   message=f"{layers} layers are not divisible by {stages}: stages of "
                           f"{describe_split(layers, pp, vpp)} layers; the busiest pipeline rank holds "
                           f"{max(rank_layer_counts(layers, pp, vpp))} where an even split would hold "
                           f"{layers / pp:.3g} ({imbalance - 1:+.1%} step time)",
                   hint=f"fine when intended (first and last stages lighter, as Llama 3 ran); a degree "
                        f"that divides {layers} balances exactly: {divisors[:8]}")


def hints_present(job: TrainingJob) -> Iterable[Problem]:
    """Trainyard's worker builds its model from the hints; a script of its own only loses the
    advisor (and the memory fit) without them, which `validate` says as a note."""
    if job.spec.parallelism.hints is not None:
        return
    if job.runs_platform_worker:
        yield Problem(code=Code.HINTS_REQUIRED, path="spec.parallelism.hints",
                      message="Trainyard's worker (worker/train.py) builds its model from the hints",
                      hint="add hints (hiddenSize, numLayers, numAttentionHeads, sequenceLength, "
                           "globalBatchSize)")
    elif job.spec.parallelism.strategy == "auto":
        yield Problem(code=Code.HINTS_REQUIRED, path="spec.parallelism.hints", severity="warning",
                      message=f"no model hints: no advisor plan and no memory-fit check; each of the "
                              f"{job.spec.hardware.gpu_count} ranks runs the script, which decides its own "
                              "parallelism (data parallel as far as Trainyard knows)",
                      hint="add hints (hiddenSize, numLayers, numAttentionHeads, sequenceLength, "
                           "globalBatchSize) for a plan and a memory check")


def platform_worker_inputs(job: TrainingJob) -> Iterable[Problem]:
    """What Trainyard's own worker reads that a script of the team's own need not give."""
    if not job.runs_platform_worker:
        return
    if job.spec.dataset is None:
        yield Problem(code=Code.INVALID_VALUE, path="spec.dataset",
                      message="Trainyard's worker (worker/train.py) trains on spec.dataset, and there is none",
                      hint="add dataset.source (an object-store prefix of jsonl/parquet/text shards)")
    if job.spec.training.max_steps is None:
        yield Problem(code=Code.INVALID_VALUE, path="spec.training.maxSteps",
                      message="Trainyard's worker (worker/train.py) trains for training.maxSteps, and it is not set",
                      hint="add training.maxSteps")


def min_gpu_count(job: TrainingJob) -> Iterable[Problem]:
    hw = job.spec.hardware
    if hw.min_gpu_count is not None and hw.min_gpu_count > hw.gpu_count:
        yield Problem(code=Code.MIN_GPU_COUNT, path="spec.hardware.minGpuCount",
                      message=f"minGpuCount {hw.min_gpu_count} is larger than gpuCount {hw.gpu_count}",
                      hint=f"set minGpuCount to at most {hw.gpu_count}")


def checkpoint_prefix(job: TrainingJob) -> Iterable[Problem]:
    """`checkpoint.storage` must be the job's own folder (by path structure, `config/prefix.py`),
    never inside another job's area; `checkpoint.initFrom` must name a manifest."""
    ckpt, name = job.spec.checkpoint, job.metadata.name
    if ckpt.storage is not None:
        problem = storage_problem(ckpt.storage, name)
        if problem:
            yield Problem(code=Code.CHECKPOINT_PREFIX, path="spec.checkpoint.storage",
                          message=preview(problem),
                          hint=f"use a folder named after the job, e.g. s3://checkpoints/{name}/, "
                               "or leave it out for <object store>/jobs/<job>/")
    if ckpt.init_from is not None:
        yield from _init_from(ckpt.init_from, ckpt.storage, name)


def _init_from(uri: str, storage: str | None, name: str) -> Iterable[Problem]:
    hint = ("name another job's committed checkpoint, e.g. "
            "s3://store/jobs/base-model/runs/<run>/checkpoints/step-00001000/MANIFEST.json")
    try:
        loc = locate(uri)
    except UnsafePath as e:
        yield Problem(code=Code.CHECKPOINT_PREFIX, path="spec.checkpoint.initFrom",
                      message=preview(str(e)), hint=hint)
        return
    tail = loc.segments[-2:]
    if len(tail) < 2 or tail[1] != "MANIFEST.json" or not re.fullmatch(r"step-\d{8,}", tail[0]):
        yield Problem(code=Code.CHECKPOINT_PREFIX, path="spec.checkpoint.initFrom",
                      message=preview(f"'{uri}' does not name a step-NNNNNNNN/MANIFEST.json"), hint=hint)


def tokenizer(job: TrainingJob) -> Iterable[Problem]:
    """`dataset.tokenizer` is `bytes` or a `.json` key inside the dataset's prefix (never a way
    out of it), and a byte-level model has room for 256 ids. A file's vocabulary against
    `vocabSize` needs the file: the dry run (`plugins/validation/dataset.py`)."""
    if job.spec.dataset is None:
        return
    name = job.spec.dataset.tokenizer
    path = "spec.dataset.tokenizer"
    hints = job.spec.parallelism.hints
    if name == "bytes":
        if hints is not None and hints.vocab_size < 256:
            yield Problem(code=Code.TOKENIZER, path="spec.parallelism.hints.vocabSize",
                          message=f"vocabSize {hints.vocab_size} cannot hold the byte tokenizer's 256 ids",
                          hint="set vocabSize to at least 256, or name a tokenizer.json in spec.dataset.tokenizer")
        return
    parts = name.split("/")
    if not name.endswith(".json") or "://" in name or name.startswith("/") or ".." in parts or "" in parts:
        yield Problem(code=Code.TOKENIZER, path=path, message=f"tokenizer {preview(name)} is not 'bytes' or "
                      "the key of a tokenizer.json inside the dataset's prefix",
                      hint="use 'bytes', or upload the tokenizer beside the shards and name it by its key "
                           "(e.g. tokenizer: tokenizer.json)")


def reserved_env(job: TrainingJob) -> Iterable[Problem]:
    for key in sorted(job.spec.training.env):
        if is_reserved(key):
            yield Problem(code=Code.RESERVED_ENV, path=f"spec.training.env.{key}",
                          message=f"'{key}' is set by the platform and cannot be overridden",
                          hint="remove it; RANK, WORLD_SIZE, MASTER_*, LOCAL_RANK, TRAINYARD_* and "
                               "MLFLOW_* are injected at launch")


def schedule(job: TrainingJob) -> Iterable[Problem]:
    expr = job.spec.schedule
    if expr is None:
        return
    presets = {"@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@continuous"}
    if expr in ("@once", "@continuous") and job.spec.retrain is not None and job.spec.retrain.on_asset:
        yield Problem(code=Code.INVALID_SCHEDULE, path="spec.schedule",
                      message=f"'{expr}' cannot be combined with retrain.onAsset (a run on either the "
                              "clock or the data needs a recurring clock)",
                      hint="use a cron expression or @hourly/@daily/@weekly, or drop schedule to retrain "
                           "on data only")
        return
    if expr in presets:
        return
    from croniter import croniter  # light; imported here so config stays cheap to import

    if not croniter.is_valid(expr):
        yield Problem(code=Code.INVALID_SCHEDULE, path="spec.schedule",
                      message=f"'{expr}' is not a cron expression or preset",
                      hint="e.g. '0 3 * * *' (03:00 daily) or '@daily'")


def warnings(job: TrainingJob) -> Iterable[Problem]:
    ft = job.spec.fault_tolerance
    if ft.redundant_compute:
        yield Problem(code=Code.INVALID_VALUE, path="spec.faultTolerance.redundantCompute",
                      message="redundant compute is not implemented; the setting is ignored",
                      severity="warning")
    if ft.in_memory_checkpoint_replicas:
        yield Problem(code=Code.INVALID_VALUE, path="spec.faultTolerance.inMemoryCheckpointReplicas",
                      message="in-memory checkpoint replicas are not implemented yet; checkpoints go "
                              "to the object store only", severity="warning")


SPEC_RULES: tuple[Rule, ...] = (
    job_name, hints_present, platform_worker_inputs, manual_degrees, model_divisibility, min_gpu_count,
    checkpoint_prefix, tokenizer, reserved_env, schedule, warnings,
)


def check_spec(job: TrainingJob) -> list[Problem]:
    """Every rule the spec alone can decide."""
    return [p for rule in SPEC_RULES for p in rule(job)]


def check_against_cluster(job: TrainingJob, cluster: Cluster) -> list[Problem]:
    """Rules that need the cluster inventory: GPU type, node size, memory floor, fleet size."""
    hw, par = job.spec.hardware, job.spec.parallelism
    types = cluster.gpu_types()
    if hw.gpu_type not in types:
        import difflib

        close = difflib.get_close_matches(hw.gpu_type, sorted(types), n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'?" if close else f"this cluster has: {', '.join(sorted(types))}"
        return [Problem(code=Code.UNKNOWN_GPU_TYPE, path="spec.hardware.gpuType",
                        message=f"cluster '{cluster.name}' has no '{hw.gpu_type}' devices", hint=hint)]
    problems: list[Problem] = []
    per_node = cluster.gpus_per_node(hw.gpu_type)
    tp = par.degree("tensor_parallel")
    if tp > per_node:
        problems.append(Problem(
            code=Code.TP_EXCEEDS_NODE, path="spec.parallelism.tensorParallel",
            message=f"TP degree {tp} exceeds the {per_node} {hw.gpu_type} devices per node of cluster '{cluster.name}'",
            hint=f"TP must fit within one NVLink domain: use tensorParallel ≤ {per_node} and more "
                 "pipeline or data parallelism"))
    total = cluster.total_gpus(hw.gpu_type, healthy_only=True)
    if hw.gpu_count > total:
        problems.append(Problem(
            code=Code.CLUSTER_TOO_SMALL, path="spec.hardware.gpuCount",
            message=f"{hw.gpu_count} {hw.gpu_type} requested; cluster '{cluster.name}' has {total} healthy",
            hint=f"ask for at most {total}"))
    memory = cluster.accelerator(hw.gpu_type).memory
    if hw.gpu_memory_min is not None and memory is not None and memory < hw.gpu_memory_min:
        problems.append(Problem(
            code=Code.GPU_MEMORY_TOO_SMALL, path="spec.hardware.gpuMemoryMin",
            message=f"{hw.gpu_type} on '{cluster.name}' has {memory.human_readable()} of memory; "
                    f"the spec needs at least {hw.gpu_memory_min.human_readable()}",
            hint="choose a larger GPU type or lower gpuMemoryMin"))
    return problems
