"""The `TrainingJob` spec: what a team writes, as pydantic models.

camelCase in YAML, snake_case in Python. Every section forbids unknown keys, so a typo is an
error that names the key and the closest valid one (see `config/loader.py`), never a silently
ignored setting. Quantities (`80GB`, `48h`, `7e9`) are parsed by `config/quantities.py`.

The models check only what one field (or one section) can tell on its own. Rules that relate
fields to each other, or the spec to a cluster, live in `config/rules.py`; checks that need
the world (memory fit, dataset, quota) live in `plugins/validation/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from trainyard.config.quantities import Bytes, Count, Duration

API_VERSION = "training.platform/v1"
KIND = "TrainingJob"

Priority = Literal["critical", "high", "normal", "low", "preemptible"]
Precision = Literal["bf16", "fp16", "fp32"]
Recompute = Literal["none", "selective", "full"]


class Section(BaseModel):
    """Base of every spec section: camelCase aliases, unknown keys forbidden, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
    )


class Metadata(Section):
    name: str
    """Job name; becomes the DAG id, the Kubernetes object names and the storage prefix.
    Must be a DNS-1123 label (checked in `config/rules.py` so the message can say why)."""
    team: str = Field(min_length=1)
    """Owning team: quotas, fair share and the MLflow experiment are per team."""
    project: str = Field(default="default", min_length=1)
    """Project within the team; MLflow experiment is `<team>/<project>`."""
    priority: Priority = "normal"
    labels: dict[str, str] = Field(default_factory=dict)
    """Free-form labels copied onto Kubernetes objects and MLflow tags."""


class GitSource(Section):
    repo: str
    branch: str = "main"
    commit: str | None = None
    """Pin a commit for reproducible runs; recorded as an MLflow tag."""


PLATFORM_WORKER = ("worker/train.py", "trainyard.worker.train")
"""How a spec names Trainyard's own worker as its entrypoint (the script, or the module)."""


class Source(Section):
    git: GitSource | None = None
    """Where the training code comes from. Omit for code already in the image / checkout."""
    path: str | None = Field(default=None, min_length=1, max_length=4096)
    """Or: a folder on this machine (`/abs/folder`, `file:///abs/folder`) or a prefix in the
    object store (`s3://bucket/code/`, fetched once per content into the home's source cache).
    The local launcher only; the ranks run in it (docs/bring-your-own.md)."""
    entrypoint: str = Field(min_length=1)
    """Script torchrun runs, relative to the source root (e.g. `worker/train.py`)."""
    args: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source(self) -> Source:
        if self.git is not None and self.path is not None:
            raise ValueError("give source.git or source.path, not both")
        if self.path is not None and not (self.path.startswith(("/", "file:///", "s3://"))):
            raise ValueError(f"source.path {self.path!r} is not an absolute folder, file:///… or s3://bucket/prefix")
        return self


class HardwareRequest(Section):
    """The devices a job asks for (the advisor's `Hardware` is a device type plus its topology)."""

    gpu_type: str = Field(min_length=1)
    """Accelerator type, as named in the cluster inventory (`H100`, `H200`, `A100_80GB`, `cpu`)."""
    gpu_count: PositiveInt
    """Total accelerators (= world size)."""
    min_gpu_count: PositiveInt | None = None
    """Smallest world size the job accepts when resized (elastic DP)."""
    gpu_memory_min: Bytes | None = None
    """Smallest accelerator memory the job accepts, e.g. `80GB`."""
    nodes_preferred: PositiveInt | None = None
    """Hint for the placer: how many nodes to spread over."""
    keep_memory_headroom: float | None = Field(default=None, ge=0, lt=1)
    """Share of each device's memory a plan must leave free, e.g. `0.1`: the advisor refuses a
    plan whose estimate needs it. Unset (the default), a plan may use the device up to its
    capacity; one above the platform's budget (`TRAINYARD_MEMORY_FRACTION`, 90 %: the 10 % of
    headroom the advisor has always kept) is accepted with a warning that gives the margin —
    the estimate is not exact, and configurations that really ran (Llama 3 405B, an estimated
    73 GiB on 80 GiB H100s) sit there. Set it for jobs that need the room (another process on
    the device, memory fragmentation, large communication buffers)."""


class ModelHints(Section):
    """The model's shape, for the parallelism advisor. Parameter count is derived from it."""

    model_parameters: Count | None = None
    """Declared parameter count (`7e9`, `6.7B`); the advisor warns if its own count differs > 5 %."""
    hidden_size: PositiveInt
    num_layers: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt | None = None
    """For grouped-query attention; defaults to `numAttentionHeads` (plain multi-head)."""
    ffn_hidden_size: PositiveInt | None = None
    """Defaults to 4·hidden (gelu) or Llama's 2/3·4·hidden rounded up to 256 (swiglu)."""
    vocab_size: PositiveInt = 32000
    sequence_length: PositiveInt
    global_batch_size: PositiveInt
    """Sequences per optimizer step, over all data-parallel replicas."""
    mixed_precision: Precision = "bf16"
    activation: Literal["gelu", "swiglu"] = "swiglu"
    tie_embeddings: bool = False
    num_experts: PositiveInt | None = None
    """Mixture-of-experts: experts per MoE layer (omit for a dense model)."""
    expert_top_k: PositiveInt | None = None

    def shape(self) -> ModelShape:
        """The model these hints describe, every default filled in: the one place the hints are
        interpreted (a KV-head count of `numAttentionHeads` when not given, Llama's FFN width,
        `numExperts: 1` meaning dense), read by the advisor's `ModelProfile` and the worker's
        `LlamaConfig` alike, so the model planned for is the model trained. It does not check
        divisibility: `config/rules.py` reports that as a problem and the consumers raise."""
        if self.ffn_hidden_size is not None:
            ffn = self.ffn_hidden_size
        elif self.activation == "gelu":
            ffn = 4 * self.hidden_size
        else:  # Llama: 2/3 of 4·hidden, rounded up to a multiple of 256
            ffn = 256 * -(-int(2 * 4 * self.hidden_size / 3) // 256)
        moe = (self.num_experts or 1) > 1
        return ModelShape(
            hidden_size=self.hidden_size, num_layers=self.num_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads or self.num_attention_heads,
            ffn_hidden_size=ffn, vocab_size=self.vocab_size, activation=self.activation,
            tie_embeddings=self.tie_embeddings,
            num_experts=self.num_experts if moe else None,
            expert_top_k=(self.expert_top_k or 1) if moe else None,
        )


@dataclass(frozen=True)
class ModelShape:
    """A decoder's architecture as `ModelHints.shape` derives it from the spec: no optional
    field left to interpret. The advisor's `ModelProfile` and the worker's `LlamaConfig` are both
    built from one (`from_shape`) and add what they alone need (the batch and precision to plan
    for; the rotary table's length and the initialisation)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    """Grouped-query attention: every `num_heads / num_kv_heads` query heads share a K/V head."""
    ffn_hidden_size: int
    vocab_size: int
    activation: Literal["gelu", "swiglu"] = "swiglu"
    tie_embeddings: bool = False
    num_experts: int | None = None
    """Experts per MoE layer; None for a dense model."""
    expert_top_k: int | None = None
    """Experts each token is routed to; None for a dense model."""


class Parallelism(Section):
    """How to split the job. `auto`: the advisor searches; degrees given pin that dimension.
    `manual`: the degrees given are used as they are (missing ones default to 1, `dataParallel`
    to whatever fills `gpuCount`)."""

    strategy: Literal["auto", "manual"] = "auto"
    tensor_parallel: PositiveInt | None = None
    pipeline_parallel: PositiveInt | None = None
    data_parallel: PositiveInt | None = None
    context_parallel: PositiveInt | None = None
    virtual_pipeline_stages: PositiveInt | None = None
    """Interleaved 1F1B: model chunks per pipeline rank (1 = plain 1F1B)."""
    zero_stage: Literal[0, 1, 2, 3] | None = None
    """0 = DDP; 1/2 = sharded optimizer (and gradients); 3 = FSDP (parameters too)."""
    micro_batch_size: PositiveInt | None = None
    activation_checkpointing: Recompute | None = None
    sequence_parallel: bool | None = None
    hints: ModelHints | None = None

    def degree(self, name: str) -> int:
        """A manual degree, with 1 for the ones not given."""
        value = getattr(self, name)
        return 1 if value is None else int(value)

    def manual_degrees(self, gpu_count: int) -> tuple[int, int, int, int]:
        """(tp, pp, dp, cp) as written, missing ones 1 and data parallelism filling `gpu_count`
        when not given — the one statement of that rule (the spec rules check the product,
        the advisor's `manual_layout` builds the plan from it)."""
        tp, pp, cp = (self.degree(n) for n in ("tensor_parallel", "pipeline_parallel", "context_parallel"))
        dp = self.data_parallel if self.data_parallel is not None else max(gpu_count // (tp * pp * cp), 1)
        return tp, pp, dp, cp


class DataQuality(Section):
    """Great Expectations checks run on the dataset's shards before any accelerator is placed."""

    enabled: bool = True
    text_field: str = "text"
    """The field that holds each example's text."""
    required_fields: list[str] = Field(default_factory=lambda: ["text"])
    min_length: NonNegativeInt = 1
    """Shortest acceptable text, in characters."""
    max_length: PositiveInt = 1_000_000
    max_duplicate_fraction: float = Field(default=0.01, ge=0, le=1)
    """Largest acceptable fraction of rows whose text repeats another row's."""
    sample_rows: PositiveInt = 100_000
    """At most this many rows are read for validation."""


class Dataset(Section):
    source: str = Field(min_length=1)
    """URI of the dataset's shards: `s3://bucket/prefix/`, `file:///path/`, or a path under the
    object store (`datasets/demo/`)."""
    format: Literal["jsonl", "parquet", "text"] = "jsonl"
    size: Bytes | None = None
    streaming: bool = False
    version: str | None = None
    """Version tag for lineage (`v3`); the content digest is computed and recorded as well."""
    tokenizer: str = Field(default="bytes", min_length=1, max_length=512)
    """`bytes` (UTF-8 bytes, vocabulary 256), or the key of a Hugging Face `tokenizer.json`
    beside the shards (`tokenizer.json`, `tok/llama3.json`); `hints.vocabSize` must hold its
    vocabulary (checked by `validate`)."""
    stripes: PositiveInt | None = Field(default=None, le=65_536)
    """How many stripes the shards are split into (each data-parallel rank reads only its own).
    The sample order depends on this number, not on the data-parallel size
    (`trainyard.plugins.data.stripes`). Default: the data-parallel size the run starts with (at most one
    per shard). A resumed run keeps its checkpoint's. `1`: every rank walks one global stream
    (the same order at any data-parallel size; fine for a few ranks)."""
    quality: DataQuality = Field(default_factory=DataQuality)


class Checkpoint(Section):
    interval_steps: PositiveInt | None = 500
    interval_minutes: PositiveFloat | None = 30
    """Save every N steps or M minutes, whichever comes first."""
    max_keep: NonNegativeInt = 5
    """Keep the last N checkpoints."""
    keep_best_metric: str | None = None
    """Keep the best K checkpoints by this metric (lower is better), e.g. `eval_loss`."""
    keep_best_count: NonNegativeInt = 0
    keep_every_m_steps: PositiveInt | None = None
    """Also keep every checkpoint whose step is a multiple of M (milestones)."""
    min_age_minutes: NonNegativeFloat = 0
    """Never delete a checkpoint younger than this."""
    storage: str | None = None
    """The job's own checkpoint folder, named after the job (`s3://checkpoints/<job>`); runs
    keep theirs under `<storage>/runs/<run>`. Default: `<object store>/jobs/<job>/`. It may not
    lie inside another job's area (`config/prefix.py`)."""
    init_from: str | None = Field(default=None, max_length=4096)
    """Another job's checkpoint (its `…/step-NNNNNNNN/MANIFEST.json` URI) to start a new run
    from — fine-tuning. Read-only: the only foreign URI the job may read, never written, and
    recorded in the run's lineage (MLflow tag `trainyard.init_from`)."""
    async_save: bool = Field(default=True, alias="async")
    """Save in the background (the default); `false` commits every save before training goes on."""
    staging: Literal["deferred", "blocking"] = "deferred"
    """How a background save copies the state: `deferred` (the default) copies it while the next
    step's forward and backward run, and the optimizer's step waits for the copy; `blocking`
    copies it before training goes on — for a script that changes the weights outside
    `optimizer.step()` through `.data` (`trainyard.plugins.checkpoint.manager`). Host memory only for now:
    on CUDA machines the copy stays blocking (not yet run on a GPU)."""
    compression: Literal["none", "zstd"] = "none"
    """Per-file compression, recorded in the manifest."""

    @field_validator("compression", mode="before")
    @classmethod
    def _known_compression(cls, value: object) -> object:
        if value in ("lz4", "gzip", "snappy"):
            raise ValueError(f"compression {value!r} is not supported; use 'zstd' or 'none'")
        return value


class Training(Section):
    max_steps: PositiveInt | None = None
    """Optimizer steps to train. Trainyard's worker needs it; a managed script stops at it
    (`session.should_stop`); a plain script ignores it and decides for itself."""
    max_runtime: Duration | None = None
    eval_interval_steps: PositiveInt | None = None
    seed: NonNegativeInt = 0
    learning_rate: PositiveFloat | None = None
    """The peak learning rate, overridable from the Airflow trigger form: the script reads it as
    `TRAINYARD_LEARNING_RATE` (or from `TRAINYARD_SPEC`); nothing is added to its arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for the workers; platform-reserved names are refused."""

    @field_validator("env", mode="before")
    @classmethod
    def _scalars_as_strings(cls, value: object) -> object:
        # Environment values are strings; YAML turns `1` into an int. Accept scalars.
        if isinstance(value, dict):
            return {
                k: (str(v).lower() if isinstance(v, bool) else str(v))
                if isinstance(v, int | float | bool) else v
                for k, v in value.items()
            }
        return value


class FaultTolerance(Section):
    max_restarts: NonNegativeInt = 3
    """Restart budget across all failure classes; the attempt chain stops when spent."""
    in_place_restarts: NonNegativeInt = 1
    """The fast path (DESIGN §5): torchrun's own `--max-restarts` inside one attempt. A worker
    crash on a healthy node is relaunched in place from the newest verified checkpoint, in
    seconds; each one counts against `maxRestarts`. 0 sends every crash to the control plane."""
    spot_instance_ok: bool = False
    in_memory_checkpoint_replicas: NonNegativeInt = 0
    redundant_compute: bool = False
    hang_timeout: Duration = Field(default="10m")  # type: ignore[assignment]
    """No step progress for this long (stale heartbeat) is a hang: kill and restart."""
    divergence_factor: float = Field(default=10.0, gt=1)
    """Loss above this multiple of its running baseline counts as diverging…"""
    divergence_steps: PositiveInt = 100
    """…for this many consecutive steps. NaN/inf diverges at once."""


class Retrain(Section):
    """Retraining: what starts a new training run besides `schedule:`, where it starts from, and
    how its model reaches the `production` alias (DESIGN §4)."""

    on_asset: str | None = Field(default=None, min_length=1)
    """Retrain whenever this Airflow asset is updated. A URI with a scheme (`s3://bucket/data/`,
    `trainyard://datasets/pydoc-topics`) is the asset as written; a dataset source under the object
    store (`datasets/pydoc-topics/`) names that dataset's asset, `trainyard://datasets/pydoc-topics`
    — what `trainyard data publish` emits when a new version of it lands."""
    start_from_alias: str | None = Field(default=None, min_length=1)
    """Start each new run from the job's registered model at this alias (e.g. `production`): the
    checkpoint that version was exported from. While no version holds the alias, runs start fresh.
    A trigger's explicit `start_from` wins."""
    promote: Literal["manual", "none"] = "manual"
    """`manual`: after `register_model`, `evaluate` scores the new version and the `production`
    one on held-out data, and moving `production` to the new version waits for a person to approve
    it in the Airflow UI (both versions' metrics shown). `none`: register only (alias `candidate`)."""
    eval_samples: PositiveInt = 32
    """Held-out sequences (of `sequenceLength` tokens) the evaluation scores each version on."""


class CandidateRule(Section):
    """When a newly registered version takes the `candidate` alias. Both checks on by default:
    a short smoke run (fewer steps than `training.maxSteps` in the spec) or a worse final loss
    than the version holding `candidate` registers, but leaves the alias where it is — and the
    run's note says which check held it back."""

    require_max_steps: bool = True
    """The run reached the spec's own `training.maxSteps` (a trigger's smaller `max_steps` does
    not count); a spec without `maxSteps` passes."""
    require_no_worse_loss: bool = True
    """The run's final `loss` is no worse (≤) than the final loss of the run that registered the
    version holding `candidate`; passes while no version holds it, or either loss is unknown."""


class Registration(Section):
    """Whether a completed run registers its model, and when the `candidate` alias moves."""

    enabled: bool = True
    """Register a model version when a run completes; the trigger form's `register_model` Param
    overrides it for one run. Off: the run completes, nothing is registered, and every surface
    says why."""
    candidate: CandidateRule = Field(default_factory=CandidateRule)


class JobBody(Section):
    source: Source
    framework: Literal["pytorch"] = "pytorch"
    """Only PyTorch is launched by this platform version."""
    framework_version: str | None = None
    image: str | None = None
    """Container image for Kubernetes launches; ignored by the local launcher."""
    hardware: HardwareRequest
    parallelism: Parallelism = Field(default_factory=Parallelism)
    dataset: Dataset | None = None
    """The data Trainyard's worker trains on; optional for a script of your own (which reads its
    data itself: then no data-quality check runs, and MLflow records no dataset)."""
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    training: Training = Field(default_factory=Training)
    fault_tolerance: FaultTolerance = Field(default_factory=FaultTolerance)
    schedule: str | None = None
    """Cron expression or preset (`@daily`): a scheduled retraining DAG."""
    retrain: Retrain | None = None
    """Data-triggered retraining and the promotion gate; omit for a job trained on demand only."""
    registration: Registration = Field(default_factory=Registration)
    """Whether a completed run registers its model, and the rule that moves `candidate`."""


class TrainingJob(Section):
    """One training job: the root of a spec file."""

    api_version: Literal["training.platform/v1"]
    kind: Literal["TrainingJob"]
    metadata: Metadata
    spec: JobBody

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def runs_platform_worker(self) -> bool:
        """The entrypoint is Trainyard's own worker (`worker/train.py`), which builds its model
        from `parallelism.hints` and reads `dataset` and `training.maxSteps`."""
        s = self.spec.source
        return s.git is None and s.path is None and s.entrypoint in PLATFORM_WORKER

    def to_yaml_dict(self) -> dict:
        """The spec in its YAML spelling (camelCase, quantities as strings)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
