"""The MLflow run of a job: one experiment per `<team>/<project>`, one run per job across attempts.

DESIGN §4: every attempt of a job (the chain of DAG runs after failures) continues the same
MLflow run, resumed by id, so the UI shows one loss curve with the recoveries on it. This
module is the control plane's side: it creates or resumes the run, records params and lineage
tags, recovery events, committed checkpoints (URI + SHA-256, never bytes) and the dataset.
The training processes stream metrics into the same run with `trainyard.plugins.tracking.metrics`.

MLflow params are immutable: a resumed attempt logs only the params not logged before. A
value that changed (the advisor re-planned after an OOM, say) keeps its first value as the
param and is recorded as the tag `trainyard.attempt.<n>.<param>` so nothing is lost.

Tags this module writes (all under `trainyard.`, short; plus MLflow's own `mlflow.source.git.*`,
which its UI shows as the run's source, and `mlflow.experimentKind` on the experiment):

| tag | meaning |
|---|---|
| `job`, `team`, `project`, `run`, `status` | who, which training run; status = pending/running/recovering/completed/failed/cancelled |
| `attempt`, `attempts` | latest attempt, every attempt started (append-only) |
| `attempt.<n>` | that attempt's layout and start; `attempt.<n>.<param>` a param it changed |
| `platform.commit` | the Trainyard code (the training code is `mlflow.source.git.commit`: the spec's `source.git` commit, or the git commit of the entrypoint's folder) |
| `source.digest` | the training code outside git: SHA-256 of the entrypoint folder's Python files (`source_digest`) |
| `dataset.uri`, `dataset.version`, `dataset.digest`, `dataset.digest_method` | lineage (the registry searches by it) |
| `failure_causes` | failure classes seen, in order (append-only) |
| `recovery.NNNN` | one JSON record per recovery event, with what it cost (`recoveries`) |
| `recovery_s` | seconds the job stood still across its recoveries, once measured |

MLflow's own tags it writes: `mlflow.runColor` (a colour per run, `next_run_color`) and
`mlflow.note.content` (the run's description with its links, `description.py`).

Committed checkpoints are not tags: each is a `LoggedModel` of the run (type `checkpoint`, at
its step, with its metrics), listed on the run's page and the experiment's Models tab.

The control plane is the only writer of these tags for a job (one task at a time), so the
read-modify-write of the append-only tags is safe.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from trainyard.config.databases import down_message
from trainyard.config.settings import PACKAGE_ROOT
from trainyard.plugins.errors import DatabaseDown
from trainyard.plugins.files import locked, sqlite_file
from trainyard.plugins.tracking.metrics import series_key
from trainyard.plugins.tracking.params import (
    param_value,
    plan_params,
    safe_key,
    spec_params,
    truncate,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import LoggedModel, Run

    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.data.datasets import DatasetRef

log = logging.getLogger(__name__)

TAG = "trainyard."
MAX_TAG_VALUE_CHARS = 8000
"""`mlflow.utils.validation.MAX_TAG_VAL_LENGTH`."""
MAX_PARAMS_TAGS_PER_BATCH = 100
"""`mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH`."""

RunLifecycleState = Literal["pending", "running", "recovering", "completed", "failed", "cancelled"]
"""Where a training run is in its life, as its MLflow run records it (the launcher's
`RunStatus` is a different thing: what the processes of one attempt are doing now)."""
_TERMINAL = {"completed": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHECKPOINT_TAG = re.compile(re.escape(TAG) + r"checkpoint\.\d{10}$")


def client_for(tracking_uri: str) -> MlflowClient:
    """A client whose registry is the tracking store too (the embedded default and our servers)."""
    from mlflow import MlflowClient

    if not tracking_uri:
        raise ValueError("tracking_uri is empty; set TRAINYARD_MLFLOW_TRACKING_URI or pass one")
    down = down_message(tracking_uri, "MLflow's tracking store", "TRAINYARD_MLFLOW_TRACKING_URI")
    if down is not None:  # MLflow would retry, then raise the driver's traceback
        raise DatabaseDown(down)
    _prepare_sqlite_store(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


@functools.cache
def _prepare_sqlite_store(tracking_uri: str) -> None:
    """Open a SQLite store for the first time in this process under a lock beside the database.

    MLflow creates and migrates a store's tables on first open without any guard: two processes
    opening a fresh `mlflow.db` at once (the two launch tasks of two triggers on a new stack)
    fail with "table … already exists" or a half-applied migration. Under the lock exactly one
    creates the tables; the others then find them current. Servers and other databases migrate
    on their own (`mlflow server`, `mlflow db upgrade`)."""
    db = sqlite_file(tracking_uri)
    if db is None:
        return
    from mlflow import MlflowClient

    db.parent.mkdir(parents=True, exist_ok=True)
    with locked(db.with_name(db.name + ".lock")):
        client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        client.search_experiments(max_results=1)  # the tracking store: creates or migrates
        client.search_registered_models(max_results=1)  # the registry store opens it again


def experiment_name(job: TrainingJob) -> str:
    """`<team>/<project>`: runs of one project compare side by side."""
    return f"{job.metadata.team}/{job.metadata.project}"


def default_artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """For a SQLite store used directly, artifacts go beside the database (`mlartifacts/`),
    not into `./mlruns` of whatever folder the process happens to run in. Servers (http) and
    other databases use their own configured artifact root (None)."""
    db = sqlite_file(tracking_uri)
    if db is None:
        return None
    return (db.parent / "mlartifacts" / safe_key(experiment).replace("/", "__")).as_uri()


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
"""MLflow 3's experiment type, which picks the UI's mode for the experiment (its JS reads this
tag: `genai_development` opens on traces, `custom_model_development` on runs, charts and
models). Without it the UI infers a kind, and inferred our runs as GenAI (issue 30)."""
MODEL_TRAINING_KIND = "custom_model_development"


def ensure_experiment(client: MlflowClient, name: str, *, artifact_location: str | None = None) -> str:
    """The experiment's id, creating it if needed (tolerates a concurrent creator), marked as a
    model-training experiment (`EXPERIMENT_KIND_TAG`; an older experiment without a kind gets
    the mark too)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location,
                                            tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})
        except MlflowException:
            found = client.get_experiment_by_name(name)  # created by someone else meanwhile
            if found is None:
                raise
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    if EXPERIMENT_KIND_TAG not in found.tags:  # a kind a person chose in the UI stays
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
    return found.experiment_id


RUN_COLOR_TAG = "mlflow.runColor"
"""The colour MLflow 3's UI draws a run in (charts, runs table); its colour picker writes the same
tag. Without it the UI hashes the run id into its palette, and two runs can share a colour."""
RUN_COLORS = ("#137dae", "#c83243", "#308613", "#de7921", "#8a63bf", "#04867d", "#b45091", "#a6630c")
"""Eight hues of MLflow's own palette, in an order where neighbours differ most."""


def next_run_color(client: MlflowClient, experiment_id: str) -> str:
    """The colour after the newest run's in the experiment: runs started one after another (the
    ones people compare) never share one, up to `len(RUN_COLORS)` runs. One query of one run;
    two runs created at the same moment may take the same colour."""
    newest = client.search_runs([experiment_id], max_results=1, order_by=["attributes.start_time DESC"])
    last = newest[0].data.tags.get(RUN_COLOR_TAG, "") if newest else ""
    index = RUN_COLORS.index(last) + 1 if last in RUN_COLORS else len(newest)
    return RUN_COLORS[index % len(RUN_COLORS)]


@functools.lru_cache(maxsize=1)
def platform_git_commit() -> str | None:
    """`git rev-parse HEAD` of the Trainyard checkout, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PACKAGE_ROOT, capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit or None


def start_or_resume_run(
    job: TrainingJob,
    plan: Plan,
    *,
    tracking_uri: str,
    run_id: str | None = None,
    attempt: int,
    dataset: DatasetRef | None = None,
    artifact_location: str | None = None,
    trigger_id: str | None = None,
) -> str:
    """Create the job's run (attempt 0) or resume it (a later attempt); returns the run id.

    `run_id` resumes that run. Without it, attempt 0 starts a new run — unless a run with the
    same `trigger_id` (the Airflow run that started the chain) exists, which makes a retried
    task idempotent — and a later attempt resumes the newest run of the same job in its
    experiment (the control plane lost the id), or starts a new one if there is none.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    client = client_for(tracking_uri)
    name = experiment_name(job)
    run = _existing_run(client, job, run_id, attempt, name, trigger_id)
    if run is None:
        exp_id = ensure_experiment(
            client, name, artifact_location=artifact_location or default_artifact_location(tracking_uri, name))
        tags = _identity_tags(job) | {RUN_COLOR_TAG: next_run_color(client, exp_id)}
        if trigger_id:
            tags[TAG + "run"] = trigger_id  # the training run: one trigger, all its attempts
        # the name the MLflow UI lists: the job and, for a training run, its id (runs tell apart)
        run = client.create_run(exp_id, run_name=f"{job.name} {trigger_id}" if trigger_id else job.name, tags=tags)
        log.info("MLflow run %s created for job %s in experiment %s", run.info.run_id, job.name, name)
    elif run.info.status != "RUNNING":
        client.update_run(run.info.run_id, status="RUNNING")
    rid = run.info.run_id

    existing = dict(run.data.params)
    wanted = {**spec_params(job), **plan_params(plan)}
    new_params = {k: v for k, v in wanted.items() if k not in existing}
    changed = {k: v for k, v in wanted.items() if k in existing and existing[k] != v}

    attempts = _split(run.data.tags.get(TAG + "attempts"))
    if str(attempt) not in attempts:
        attempts.append(str(attempt))
    tags = {
        TAG + "status": "running",
        TAG + "attempt": str(attempt),
        TAG + "attempts": ",".join(attempts),
        f"{TAG}attempt.{attempt}": f"{plan.describe()} · started {_now_iso()}",
        **{safe_key(f"{TAG}attempt.{attempt}.{k}"): v for k, v in changed.items()},
    }
    if dataset is not None:
        tags.update(dataset_tags(dataset))
    _log_params_and_tags(client, rid, new_params, tags)
    log_metrics(client, rid, {"trainyard.attempt": float(attempt)}, step=attempt)
    if changed:
        log.info("run %s attempt %d: %d param(s) changed since the first attempt (kept as tags): %s",
                 rid, attempt, len(changed), ", ".join(sorted(changed)[:10]))
    if dataset is not None and job.spec.dataset is not None:
        log_dataset_input(rid, dataset, tracking_uri=tracking_uri, fields=job.spec.dataset.quality.required_fields)
    return rid


def _existing_run(client: MlflowClient, job: TrainingJob, run_id: str | None, attempt: int,
                  experiment: str, trigger_id: str | None) -> Run | None:
    if run_id:
        run = client.get_run(run_id)
        owner = run.data.tags.get(TAG + "job")
        if owner is not None and owner != job.name:
            raise ValueError(f"MLflow run {run_id} belongs to job {owner!r}, not {job.name!r}")
        return run
    if attempt == 0 and not trigger_id:
        return None
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    query = f"tags.`{TAG}job` = {quote_filter_value(job.name)}"
    if trigger_id or attempt == 0:  # a training run's attempts share its MLflow run, never another's
        query += f" AND tags.`{TAG}run` = {quote_filter_value(trigger_id or '')}"
    runs = client.search_runs([exp.experiment_id], filter_string=query,
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def _code_identity(job: TrainingJob) -> tuple[str | None, str | None]:
    """(git commit, content digest) of the training code that runs — the user's, never Trainyard's
    unless the entrypoint is Trainyard's own (the reference script in its checkout): the spec's
    pinned `source.git` commit; else the commit of the git work tree the entrypoint's folder is
    in; else no commit and a digest of the folder's Python files."""
    src = job.spec.source
    if src.git and src.git.commit:
        return src.git.commit, None
    if src.path and src.path.startswith("s3://"):
        from trainyard.config.settings import get_settings
        from trainyard.plugins.launch.sources import prefix_digest

        try:  # the listing's digest names the content without downloading it
            return None, "prefix:" + prefix_digest(src.path, endpoint_url=get_settings().s3_endpoint_url)[0]
        except Exception:  # noqa: BLE001 - lineage is best effort; the launch says why it cannot fetch
            return None, None
    root = Path(src.path.removeprefix("file://")) if src.path else PACKAGE_ROOT
    folder = (root / src.entrypoint).parent if src.entrypoint.endswith(".py") else None
    if folder is None or not folder.is_dir():
        return None, None
    try:
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True)
        return out.stdout.strip() or None, None
    except (OSError, subprocess.SubprocessError):
        return None, source_digest(folder)


def source_digest(folder: Path, *, max_files: int = 2000) -> str:
    """SHA-256 over the relative paths and bytes of the folder's `*.py` files, sorted (at most
    `max_files`: a code folder, not a dataset)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py"))[:max_files]:
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _identity_tags(job: TrainingJob) -> dict[str, str]:
    meta, src = job.metadata, job.spec.source
    platform = platform_git_commit()
    code_commit, code_digest = _code_identity(job)
    tags = {
        TAG + "job": job.name,
        TAG + "team": meta.team,
        TAG + "project": meta.project,
        TAG + "status": "pending",
        "mlflow.source.name": src.entrypoint,
        **{safe_key(f"label.{k}"): truncate(v, MAX_TAG_VALUE_CHARS) for k, v in meta.labels.items()},
    }
    if platform:
        tags[TAG + "platform.commit"] = platform
    if code_commit:  # MLflow's own tags, which its UI shows as the run's source
        tags["mlflow.source.git.commit"] = code_commit
    if code_digest:
        tags[TAG + "source.digest"] = code_digest
    if src.git:
        tags["mlflow.source.git.repoURL"] = src.git.repo
        tags["mlflow.source.git.branch"] = src.git.branch
    if job.spec.checkpoint.init_from:  # lineage: the other job's checkpoint this one starts from
        tags[TAG + "init_from"] = truncate(job.spec.checkpoint.init_from, MAX_TAG_VALUE_CHARS)
    return tags


def dataset_tags(dataset: DatasetRef) -> dict[str, str]:
    tags = {  # the lineage a registry search needs; shards and bytes are on the run's dataset input
        TAG + "dataset.uri": dataset.uri,
        TAG + "dataset.digest": dataset.digest,
        TAG + "dataset.digest_method": dataset.digest_method,
    }
    if dataset.version:
        tags[TAG + "dataset.version"] = dataset.version
    return tags


def log_dataset_input(
    run_id: str, dataset: DatasetRef, *, tracking_uri: str, fields: list[str] | None = None,
    context: str = "training",
) -> None:
    """Record the dataset as the run's input — what `mlflow.log_input` does, without needing
    an active fluent run in this process. A `MetaDataset`: the source URI, a digest and the
    schema of the required fields; no rows and nothing pickled. Logging it again on a resumed
    attempt adds nothing (MLflow de-duplicates by name and digest)."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.types import ColSpec, Schema

    with warnings.catch_warnings():  # file:// matches two equivalent local source types
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(dataset.uri)
    name = dataset.uri.rstrip("/").rsplit("/", 1)[-1] + (f"@{dataset.version}" if dataset.version else "")
    schema = Schema([ColSpec("string", f) for f in fields]) if fields else None
    meta = MetaDataset(source=source, name=name[:500], digest=dataset.digest[:32], schema=schema)
    input_tags = [InputTag(key="mlflow.data.context", value=context),
                  InputTag(key=TAG + "shards", value=str(dataset.num_shards)),
                  InputTag(key=TAG + "bytes", value=str(dataset.total_bytes))]
    if dataset.version:
        input_tags.append(InputTag(key=TAG + "dataset.version", value=dataset.version))
    client_for(tracking_uri).log_inputs(
        run_id, datasets=[DatasetInput(dataset=meta._to_mlflow_entity(), tags=input_tags)])


def set_run_status(run_id: str, status: RunLifecycleState, *, tracking_uri: str) -> None:
    """Record the job's status; completed/failed/cancelled also end the MLflow run."""
    if status not in {"pending", "running", "recovering", *_TERMINAL}:
        raise ValueError(f"status must be one of pending, running, recovering, completed, failed, "
                         f"cancelled; got {status!r}")
    client = client_for(tracking_uri)
    client.set_tag(run_id, TAG + "status", status)
    if status in _TERMINAL:
        client.set_terminated(run_id, status=_TERMINAL[status])


class RecoveryEvent(BaseModel):
    """One recovery of the run, with what it cost as far as it is known (the figures of
    `trainyard.plugins.tracking.recovery_timing`; the later ones are filled in as they are measured)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    """Failure class (`worker_crash`, `node_lost`, `hang`, `diverged`, `checkpoint_corrupt`,
    `oom`, `preempted`) or another recovery action."""
    attempt: int
    step: int | None = None
    """Training step at which it happened (the last step reached), if known."""
    detail: str = ""
    at: str
    """When the control plane detected it (ISO 8601)."""
    detect_s: float | None = Field(default=None, validation_alias=AliasChoices("detect_s", "duration_s"))
    """Seconds from the failure to its detection (older records called it `duration_s`)."""
    resume_step: int | None = None
    """The checkpoint step the next attempt restores (0: from scratch)."""
    restart_s: float | None = None
    """Seconds from the detection to the next attempt's gang start."""
    time_to_train_again_s: float | None = None
    """Seconds from the failure to the next attempt's first step after its restore."""
    steps_lost: int | None = None
    device_hours_lost: float | None = None
    key: str | None = None
    """Idempotency key given by the caller (e.g. `<dag run>:<attempt>:<kind>`)."""

    @property
    def tag(self) -> str:
        """The tag's value: the record without its empty fields."""
        return self.model_dump_json(exclude_none=True)


RECOVERY_TAG_PREFIX = TAG + "recovery."
"""`trainyard.recovery.NNNN`: one recovery event each, in order."""


def _events(tags: Mapping[str, str]) -> dict[str, RecoveryEvent]:
    return {k: RecoveryEvent.model_validate_json(tags[k]) for k in sorted(tags) if k.startswith(RECOVERY_TAG_PREFIX)}


def log_recovery_event(
    run_id: str,
    kind: str,
    attempt: int,
    step: int | None,
    detail: str = "",
    *,
    tracking_uri: str,
    duration_s: float | None = None,
    key: str | None = None,
    resume_step: int | None = None,
    at: dt.datetime | None = None,
) -> RecoveryEvent:
    """Append a recovery event: a JSON tag `recovery.NNNN`, the cause appended to
    `failure_causes`, and metrics `recovery/<kind>` (= 1 at the step, a mark on the charts) and
    `recovery_events` (running count).

    `duration_s` is the detection time (the failure until the control plane knew), `at` the
    detection (default: now); `resume_step` what the next attempt restores. What the recovery
    cost beyond detecting it is known later: the restart when the next gang starts
    (`log_recovery_timings(attempt=…)`), the time to train again and the device-hours at the
    run's end (`trainyard.plugins.tracking.recoveries.record_recovery_costs`).

    `key` makes it idempotent: an event with the same key already on the run is returned and
    nothing is logged again (an Airflow task that retries records its event once).
    """
    if not kind or not re.fullmatch(r"[A-Za-z0-9_\-.]+", kind):
        raise ValueError(f"kind must be a word like 'worker_crash', got {kind!r}")
    client = client_for(tracking_uri)
    tags = client.get_run(run_id).data.tags
    events = _events(tags)
    if key is not None:
        for seen in events.values():
            if seen.key == key:
                return seen
    seq = len(events)
    event = RecoveryEvent(kind=kind, attempt=attempt, step=step, detail=truncate(detail, 4000),
                          at=(at or dt.datetime.now(dt.UTC)).isoformat(), detect_s=duration_s,
                          resume_step=resume_step,
                          steps_lost=max(0, step - resume_step) if step is not None and resume_step is not None
                          else None, key=key)
    causes = [*_split(tags.get(TAG + "failure_causes")), kind]
    new_tags = {
        f"{RECOVERY_TAG_PREFIX}{seq:04d}": event.tag,
        TAG + "failure_causes": truncate(",".join(causes), MAX_TAG_VALUE_CHARS),
    }
    _log_params_and_tags(client, run_id, {}, new_tags)
    log_metrics(client, run_id, {f"recovery/{kind}": 1.0, "recovery_events": float(seq + 1)}, step=step or 0)
    return event


def log_recovery_timings(run_id: str, *, step: int, tracking_uri: str, time_to_detect_s: float | None = None,
                         steps_lost: int | None = None, time_to_resume_s: float | None = None,
                         attempt: int | None = None) -> None:
    """The figures of one recovery as metrics `recovery/time_to_detect_s`, `recovery/steps_lost`
    and `recovery/time_to_resume_s` (the ones given; a chart per figure across the run). With
    `attempt`, they are also written into that attempt's recovery event, and logged at its step."""
    figures = {"time_to_detect_s": time_to_detect_s, "steps_lost": steps_lost, "time_to_resume_s": time_to_resume_s}
    metrics = {f"recovery/{k}": float(v) for k, v in figures.items() if v is not None}
    if not metrics:
        return
    client = client_for(tracking_uri)
    if attempt is not None:
        found = [(k, e) for k, e in _events(client.get_run(run_id).data.tags).items() if e.attempt == attempt]
        if found:
            tag, event = found[-1]
            update = {"detect_s": time_to_detect_s, "steps_lost": steps_lost, "restart_s": time_to_resume_s}
            event = event.model_copy(update={k: v for k, v in update.items() if v is not None})
            _log_params_and_tags(client, run_id, {}, {tag: event.tag})
            step = event.step or 0
    log_metrics(client, run_id, metrics, step=step)


def set_recovery_event(run_id: str, index: int, event: RecoveryEvent, *, tracking_uri: str) -> None:
    """Replace the `index`-th recovery event's record (its costs measured since)."""
    _log_params_and_tags(client_for(tracking_uri), run_id, {}, {f"{RECOVERY_TAG_PREFIX}{index:04d}": event.tag})


def recovery_events(run_id: str, *, tracking_uri: str) -> list[RecoveryEvent]:
    """The run's recovery events, in order."""
    return list(_events(client_for(tracking_uri).get_run(run_id).data.tags).values())


class LoggedCheckpoint(BaseModel):
    """A committed checkpoint as the MLflow run remembers it: where and which bytes, never the
    bytes (the store's own view of a checkpoint is `trainyard.plugins.checkpoint.catalog.CheckpointRecord`)."""

    model_config = ConfigDict(frozen=True)

    step: int
    manifest_uri: str
    sha256: str
    """SHA-256 of the manifest (which lists every file's SHA-256)."""
    metrics: dict[str, float] = {}


CHECKPOINT_MODEL_TYPE = "checkpoint"
"""`LoggedModel.model_type` of a committed checkpoint (MLflow 3: a run's checkpoints are its
logged models, each at its step with its metrics; the Models tab lists and compares them)."""
CHECKPOINT_KIND_TAG = TAG + "kind"
"""`checkpoint` on a checkpoint's LoggedModel: the registered export is a LoggedModel too."""


def log_checkpoint(
    run_id: str,
    manifest_uri: str,
    sha256: str,
    step: int,
    metrics: Mapping[str, float] | None = None,
    *,
    tracking_uri: str,
) -> LoggedCheckpoint:
    """Record a committed checkpoint as a `LoggedModel` of the run (name `step-<NNNNNNNN>`,
    type `checkpoint`; tags `trainyard.checkpoint.uri|sha256|step`), an output of the run at
    its step, with the metrics `checkpoint/step` and `checkpoint/<metric>` at the step linked
    to it (under `system/`: `metrics.series_key`). No files are copied: the checkpoint stays in the object store, the model names it.

    Idempotent (a retried watcher): the same step with the same manifest logs nothing again. A
    step committed again after a rollback replaces the older model of that step (its files were
    overwritten), so the run lists one checkpoint per step."""
    if not manifest_uri:
        raise ValueError("manifest_uri is empty")
    if not _SHA256.match(sha256 or ""):
        raise ValueError(f"sha256 must be 64 lowercase hex digits, got {sha256!r}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    from mlflow.entities import LoggedModelOutput, Metric

    record = LoggedCheckpoint(step=step, manifest_uri=manifest_uri, sha256=sha256,
                              metrics={k: float(v) for k, v in (metrics or {}).items()})
    client = client_for(tracking_uri)
    run = client.get_run(run_id)
    earlier = _checkpoint_models(client, run.info.experiment_id, run_id, step=step)
    if any(_as_checkpoint(m) == record for m in earlier):
        return record  # already recorded: log nothing twice
    model = client.create_logged_model(
        run.info.experiment_id, name=f"step-{step:08d}", source_run_id=run_id, model_type=CHECKPOINT_MODEL_TYPE,
        tags={CHECKPOINT_KIND_TAG: CHECKPOINT_MODEL_TYPE, TAG + "checkpoint.uri": manifest_uri,
              TAG + "checkpoint.sha256": sha256, TAG + "checkpoint.step": str(step)})
    import time

    ts = int(time.time() * 1000)
    values = {"checkpoint/step": float(step), **{safe_key(f"checkpoint/{k}"): v for k, v in record.metrics.items()}}
    client.log_batch(run_id, metrics=[Metric(series_key(k), v, ts, step, model_id=model.model_id)
                                      for k, v in values.items()], synchronous=True)
    client.finalize_logged_model(model.model_id, "READY")
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=step)])
    for old in earlier:  # the same step saved again (a rollback): one checkpoint per step
        client.delete_logged_model(old.model_id)
    return record


def _checkpoint_models(client: MlflowClient, experiment_id: str, run_id: str, *, step: int | None = None
                       ) -> list[LoggedModel]:
    """The run's checkpoint LoggedModels (of one step, or all)."""
    clauses = [f"source_run_id = {quote_filter_value(run_id)}",
               f"tags.`{CHECKPOINT_KIND_TAG}` = {quote_filter_value(CHECKPOINT_MODEL_TYPE)}"]
    if step is not None:
        clauses.append(f"tags.`{TAG}checkpoint.step` = {quote_filter_value(str(step))}")
    found: list[LoggedModel] = []
    token = None
    while True:
        page = client.search_logged_models([experiment_id], filter_string=" AND ".join(clauses), page_token=token)
        found.extend(page)
        token = page.token
        if not token:
            return found


def _as_checkpoint(model: LoggedModel) -> LoggedCheckpoint:
    # the others: runs recorded before (`system/checkpoint/…`, and before issue 57 `checkpoint/…`)
    prefixes = (series_key("checkpoint/"), "system/checkpoint/", "checkpoint/")
    metrics = {}
    for m in model.metrics or []:
        prefix = next((p for p in prefixes if m.key.startswith(p)), None)
        if prefix is not None and m.key != prefix + "step":
            metrics[m.key.removeprefix(prefix)] = m.value
    return LoggedCheckpoint(
        step=int(model.tags[TAG + "checkpoint.step"]), manifest_uri=model.tags[TAG + "checkpoint.uri"],
        sha256=model.tags[TAG + "checkpoint.sha256"], metrics=metrics)


def log_committed_checkpoint(
    run_id: str, manifest_uri: str, *, tracking_uri: str, endpoint_url: str | None = None
) -> LoggedCheckpoint:
    """`log_checkpoint` for a manifest in the object store: reads it, hashes its bytes, takes its
    step and metrics (what the checkpoint watcher calls for each new commit)."""
    from trainyard.plugins.checkpoint.catalog import open_manifest_uri
    from trainyard.plugins.checkpoint.manifest import MANIFEST_NAME, manifest_sha256

    store, record = open_manifest_uri(manifest_uri, endpoint_url=endpoint_url)
    digest = manifest_sha256(store.get_bytes(f"{record.folder}/{MANIFEST_NAME}"))
    return log_checkpoint(run_id, manifest_uri, digest, record.step, record.metrics, tracking_uri=tracking_uri)


def checkpoints(run_id: str, *, tracking_uri: str) -> list[LoggedCheckpoint]:
    """Every checkpoint the run recorded, by step: its checkpoint LoggedModels (the newest of a
    step, should a rollback's re-save not have replaced it yet), and the `checkpoint.<step>`
    tags runs recorded before checkpoints were LoggedModels."""
    client = client_for(tracking_uri)
    run = client.get_run(run_id)
    by_step: dict[int, LoggedCheckpoint] = {}
    for k, v in run.data.tags.items():
        if _CHECKPOINT_TAG.match(k):
            record = LoggedCheckpoint.model_validate_json(v)
            by_step[record.step] = record
    models = sorted(_checkpoint_models(client, run.info.experiment_id, run_id), key=lambda m: m.creation_timestamp)
    for model in models:
        record = _as_checkpoint(model)
        by_step[record.step] = record
    return [by_step[s] for s in sorted(by_step)]


# -- helpers --------------------------------------------------------------------------------------

def _log_params_and_tags(client: MlflowClient, run_id: str, params: Mapping[str, str],
                         tags: Mapping[str, str]) -> None:
    from mlflow.entities import Param, RunTag

    entities: list[Param | RunTag] = [Param(k, param_value(v)) for k, v in sorted(params.items())]
    entities += [RunTag(k, truncate(str(v), MAX_TAG_VALUE_CHARS)) for k, v in sorted(tags.items())]
    for i in range(0, len(entities), MAX_PARAMS_TAGS_PER_BATCH):
        chunk = entities[i: i + MAX_PARAMS_TAGS_PER_BATCH]
        client.log_batch(run_id, params=[e for e in chunk if isinstance(e, Param)],
                         tags=[e for e in chunk if isinstance(e, RunTag)], synchronous=True)


def log_metrics(client: MlflowClient, run_id: str, metrics: Mapping[str, float], *, step: int) -> None:
    """All `metrics` at `step` in one synchronous batch (one round trip, one timestamp)."""
    import time

    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(series_key(k), float(v), ts, step) for k, v in metrics.items()],
                     synchronous=True)


def quote_filter_value(value: str) -> str:
    """A single-quoted literal for MLflow's search filter grammar."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _split(value: str | None) -> list[str]:
    return [v for v in (value or "").split(",") if v]


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
