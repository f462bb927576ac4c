"""Register a trained checkpoint as an MLflow model version with its lineage; query by dataset.

A finished job's final (or best-by-metric) checkpoint is exported to safetensors and logged as
an MLflow 3 `LoggedModel` of the job's run — a pyfunc "model from code"
(`safetensors_pyfunc.py` + the weights file), so nothing in the registry is a pickle. A model
version is then created from that logged model (DESIGN §9: a plain artifact cannot be
registered) and the alias `candidate` moved to it.

Lineage lives in the version's tags, so "which model versions were trained on dataset v3?"
(seed §14: an erasure request becomes a query) is one registry search:

| tag | value |
|---|---|
| `trainyard.run_id`, `trainyard.job` | the run and job that trained it |
| `trainyard.model_id` | the MLflow 3 LoggedModel holding the files (also the version's source, `models:/<id>`) |
| `trainyard.checkpoint.uri`, `.sha256`, `.step` | the checkpoint's manifest and its digest |
| `trainyard.dataset.uri`, `.version`, `.digest` | the data it saw |
| `trainyard.weights.sha256` | the exported safetensors file |
| `trainyard.git.commit` | the training code |
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from trainyard.plugins.tracking.runs import (
    TAG,
    LoggedCheckpoint,
    checkpoints,
    client_for,
    quote_filter_value,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

log = logging.getLogger(__name__)

MODEL_CODE = Path(__file__).with_name("safetensors_pyfunc.py")
DEFAULT_ALIAS = "candidate"
PRODUCTION_ALIAS = "production"
"""The alias serving reads; only an approved promotion moves it (`operators/retrain.py`)."""
_RUN_TAGS_COPIED = ("job", "team", "project", "git.commit", "source.digest", "dataset.uri", "dataset.version",
                    "dataset.digest", "dataset.digest_method", "init_from")
_PIP_REQUIREMENTS = ("safetensors", "numpy")
"""What loading the registered model needs (pinned to the versions installed here), so MLflow
does not infer requirements by importing and tracing the model."""

ExportFn = Callable[[str, Path], object]
"""`export(manifest_uri, dest_path)`: write the checkpoint's weights as one safetensors file."""


class ModelVersionInfo(BaseModel):
    """One registered model version and where it came from."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: str
    aliases: list[str] = []
    status: str = ""
    created_at: str = ""
    model_id: str | None = None
    run_id: str | None = None
    job: str | None = None
    checkpoint_uri: str | None = None
    checkpoint_sha256: str | None = None
    checkpoint_step: int | None = None
    dataset_uri: str | None = None
    dataset_version: str | None = None
    dataset_digest: str | None = None
    weights_sha256: str | None = None
    git_commit: str | None = None
    candidate_note: str = ""
    """Why `candidate` did or did not move to this version (`candidate.DECISION_TAG`)."""

    @classmethod
    def from_mlflow(cls, mv: ModelVersion) -> ModelVersionInfo:
        t = mv.tags or {}
        step = t.get(TAG + "checkpoint.step")
        created = dt.datetime.fromtimestamp(mv.creation_timestamp / 1000, dt.UTC) if mv.creation_timestamp else None
        return cls(
            name=mv.name, version=str(mv.version), aliases=sorted(mv.aliases or []), status=str(mv.status or ""),
            created_at=created.isoformat(timespec="seconds") if created else "",
            model_id=getattr(mv, "model_id", None) or t.get(TAG + "model_id") or model_id_of(mv.source),
            run_id=mv.run_id or t.get(TAG + "run_id"),
            job=t.get(TAG + "job"), checkpoint_uri=t.get(TAG + "checkpoint.uri"),
            checkpoint_sha256=t.get(TAG + "checkpoint.sha256"),
            checkpoint_step=int(step) if step and step.isdigit() else None,
            dataset_uri=t.get(TAG + "dataset.uri"), dataset_version=t.get(TAG + "dataset.version"),
            dataset_digest=t.get(TAG + "dataset.digest"), weights_sha256=t.get(TAG + "weights.sha256"),
            git_commit=t.get(TAG + "git.commit"),
            candidate_note=t.get(TAG + "candidate") or "",
        )


def logged_model_uri(model_id: str) -> str:
    """`models:/<model_id>`: the registry source that names a LoggedModel (MLflow 3)."""
    if not model_id or "/" in model_id:
        raise ValueError(f"model_id must be a LoggedModel id like 'm-0123abcd', got {model_id!r}")
    return f"models:/{model_id}"


def model_id_of(source: str | None) -> str | None:
    """The LoggedModel id of a version whose source is `models:/<model_id>`, else None
    (`models:/<name>/<version>` and artifact paths name no logged model)."""
    if not source or not source.startswith("models:/"):
        return None
    rest = source.removeprefix("models:/")
    return rest if rest.startswith("m-") and "/" not in rest else None


def select_checkpoint(
    run_id: str, *, tracking_uri: str, metric: str | None = None, mode: Literal["min", "max"] = "min"
) -> LoggedCheckpoint:
    """The run's final checkpoint (highest step), or with `metric` the best one by it (ties go
    to the later step). Raises LookupError when the run recorded none (or none with the metric)."""
    records = checkpoints(run_id, tracking_uri=tracking_uri)
    if metric is None:
        if not records:
            raise LookupError(f"run {run_id} recorded no checkpoint")
        return records[-1]
    scored = [r for r in records if metric in r.metrics]
    if not scored:
        raise LookupError(f"no checkpoint of run {run_id} recorded metric {metric!r} "
                          f"(checkpoints: {len(records)})")
    sign = 1.0 if mode == "min" else -1.0
    return min(scored, key=lambda r: (sign * r.metrics[metric], -r.step))


def register_checkpoint(
    run_id: str,
    *,
    tracking_uri: str,
    metric: str | None = None,
    mode: Literal["min", "max"] = "min",
    model_name: str | None = None,
    alias: str = DEFAULT_ALIAS,
    endpoint_url: str | None = None,
    export: ExportFn | None = None,
    area: str | None = None,
) -> ModelVersionInfo:
    """Export the final (or best by `metric`) checkpoint the run recorded to safetensors and
    register it. The default export is the checkpoint engine's `export_safetensors`, held to
    the job's own area (`area`, `trainyard.plugins.checkpoint.uris.area_for`; without it, the area the
    checkpoint's URI claims by structure): a job reads only its own checkpoints."""
    record = select_checkpoint(run_id, tracking_uri=tracking_uri, metric=metric, mode=mode)
    if export is None:
        job = client_for(tracking_uri).get_run(run_id).data.tags.get(TAG + "job")
        export = functools.partial(find_export(), endpoint_url=endpoint_url, job=job, area=area)
    with tempfile.TemporaryDirectory(prefix="trainyard-export-") as tmp:
        weights = Path(tmp) / "model.safetensors"
        export(record.manifest_uri, weights)
        if not weights.is_file():
            raise FileNotFoundError(f"exporting {record.manifest_uri} wrote no file at {weights}")
        _check_manifest_digest(weights, record)
        return register_safetensors(weights, run_id=run_id, checkpoint=record, tracking_uri=tracking_uri,
                                    model_name=model_name, alias=alias)


def find_export() -> Callable[..., object]:
    """The checkpoint engine's `export_safetensors(manifest_uri, dest, *, endpoint_url, job)`."""
    from trainyard.plugins.checkpoint.export import export_safetensors

    return export_safetensors


def _check_manifest_digest(weights: Path, record: LoggedCheckpoint) -> None:
    """The export stamps the manifest's SHA-256 into the file's header: it must be the one the
    run recorded, or the checkpoint changed after it was committed."""
    from safetensors import safe_open

    with safe_open(str(weights), framework="numpy") as f:
        stamped = (f.metadata() or {}).get("trainyard.manifest_sha256")
    if stamped is not None and stamped != record.sha256:
        raise ValueError(f"checkpoint {record.manifest_uri} has manifest SHA-256 {stamped}, but the run "
                         f"recorded {record.sha256} when it was committed; refusing to register it")


def register_safetensors(
    weights_path: str | Path,
    *,
    run_id: str,
    checkpoint: LoggedCheckpoint,
    tracking_uri: str,
    model_name: str | None = None,
    alias: str = DEFAULT_ALIAS,
) -> ModelVersionInfo:
    """Log `weights_path` as a LoggedModel of `run_id`, register a version, point `alias` at it."""
    weights = Path(weights_path)
    if weights.suffix != ".safetensors" or not weights.is_file():
        raise ValueError(f"weights_path must be an existing .safetensors file, got {str(weights)!r}")
    _check_safetensors(weights)
    client = client_for(tracking_uri)
    run = client.get_run(run_id)
    name = model_name or run.data.tags.get(TAG + "job") or run.info.run_name
    if not name:
        raise ValueError(f"run {run_id} has no job tag; pass model_name")
    from trainyard.plugins.storage.store import sha256_of_stream

    with weights.open("rb") as f:
        _, weights_sha = sha256_of_stream(f)
    lineage = _lineage_tags(run.data.tags, run_id, checkpoint, weights_sha)

    model = client.create_logged_model(run.info.experiment_id, name=name, source_run_id=run_id, tags=lineage)
    try:
        _save_and_upload(client, model.model_id, model.artifact_location, run_id, weights)
        client.finalize_logged_model(model.model_id, "READY")
    except BaseException:
        client.finalize_logged_model(model.model_id, "FAILED")
        raise
    from mlflow.entities import LoggedModelOutput

    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=checkpoint.step)])
    _ensure_registered_model(client, name)
    # The source is `models:/<model_id>`, as `mlflow.register_model` writes it: the UI links the
    # version to its logged model through it. MLflow's SQL registry resolves that URI through
    # the *process-wide* tracking URI (a TODO in its store), so ours is made the default for
    # the call. That registry keeps no model id column either: the tag records it as well.
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    with _use_tracking_uri(tracking_uri):
        mv = client.create_model_version(name, source=logged_model_uri(model.model_id), run_id=run_id,
                                         tags={**lineage, TAG + "model_id": model.model_id},
                                         model_id=model.model_id)
    if alias:
        client.set_registered_model_alias(name, alias, mv.version)
    log.info("registered %s version %s (run %s, checkpoint step %d)", name, mv.version, run_id, checkpoint.step)
    return ModelVersionInfo.from_mlflow(client.get_model_version(name, mv.version))


def move_alias(name: str, alias: str, version: str, *, tracking_uri: str, by: str = "") -> str | None:
    """Point `alias` (e.g. `production`) of model `name` at `version`; returns the version that
    held it before (None if none did). The version records who moved it there and when
    (`trainyard.alias.<alias>.by` / `.at`), so the registry shows each promotion's approver."""
    from mlflow.exceptions import MlflowException

    client = client_for(tracking_uri)
    client.get_model_version(name, version)  # a version that does not exist fails here, by name
    try:
        before: str | None = str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        before = None
    client.set_registered_model_alias(name, alias, version)
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    client.set_model_version_tag(name, version, f"{TAG}alias.{alias}.at", stamp)
    if by:
        client.set_model_version_tag(name, version, f"{TAG}alias.{alias}.by", by)
    log.info("model %s: alias %r moved from version %s to %s%s", name, alias, before, version,
             f" (by {by})" if by else "")
    return before


def models_trained_on(
    dataset_uri: str, version: str | None = None, *, tracking_uri: str, digest: str | None = None
) -> list[ModelVersionInfo]:
    """Every registered model version whose training data was `dataset_uri` (optionally at
    `version`, or with exactly this content `digest`), newest first."""
    if not dataset_uri:
        raise ValueError("dataset_uri is empty")
    clauses = [f"tags.`{TAG}dataset.uri` = {quote_filter_value(dataset_uri.rstrip('/'))}"]
    if version:
        clauses.append(f"tags.`{TAG}dataset.version` = {quote_filter_value(version)}")
    if digest:
        clauses.append(f"tags.`{TAG}dataset.digest` = {quote_filter_value(digest)}")
    client = client_for(tracking_uri)
    found = list(_search_model_versions(client, " AND ".join(clauses)))
    # Searches do not return aliases (SQL registry): read them once per registered model.
    aliases: dict[str, dict[str, list[str]]] = {}
    for mv in found:
        if mv.name not in aliases:
            by_version: dict[str, list[str]] = {}
            for alias, version in client.get_registered_model(mv.name).aliases.items():
                by_version.setdefault(str(version), []).append(alias)
            aliases[mv.name] = by_version
    infos = [ModelVersionInfo.from_mlflow(mv).model_copy(update={"aliases": sorted(aliases[mv.name].get(str(mv.version), []))})
             for mv in found]
    return sorted(infos, key=lambda i: (i.created_at, i.name, int(i.version)), reverse=True)


def trained_datasets(*, tracking_uri: str) -> dict[str, list[str]]:
    """Dataset URI → its versions, for every dataset some registered model version was trained
    on: what to suggest when a `models_trained_on` query finds nothing (a prefix that resolves
    elsewhere, a version that was never trained on)."""
    seen: dict[str, set[str]] = {}
    for mv in _search_model_versions(client_for(tracking_uri), f"tags.`{TAG}dataset.uri` LIKE '%'"):
        uri, version = mv.tags.get(TAG + "dataset.uri"), mv.tags.get(TAG + "dataset.version")
        if uri:
            seen.setdefault(uri, set()).update([version] if version else [])
    return {uri: sorted(seen[uri]) for uri in sorted(seen)}


def _search_model_versions(client: MlflowClient, filter_string: str) -> Iterator[ModelVersion]:
    """Every model version the search finds, page after page."""
    token = None
    while True:
        page = client.search_model_versions(filter_string, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


# -- helpers --------------------------------------------------------------------------------------

def _lineage_tags(run_tags: dict[str, str], run_id: str, ckpt: LoggedCheckpoint, weights_sha: str) -> dict[str, str]:
    tags = {TAG + k: run_tags[TAG + k] for k in _RUN_TAGS_COPIED if run_tags.get(TAG + k)}
    if "mlflow.source.git.commit" in run_tags:  # the training code (runs no longer copy it under TAG)
        tags.setdefault(TAG + "git.commit", run_tags["mlflow.source.git.commit"])
    tags.update({
        TAG + "run_id": run_id,
        TAG + "checkpoint.uri": ckpt.manifest_uri,
        TAG + "checkpoint.sha256": ckpt.sha256,
        TAG + "checkpoint.step": str(ckpt.step),
        TAG + "weights.sha256": weights_sha,
        **{f"{TAG}checkpoint.metric.{k}": f"{v:g}" for k, v in sorted(ckpt.metrics.items())},
    })
    return tags


def _save_and_upload(client: MlflowClient, model_id: str, artifact_location: str, run_id: str,
                     weights: Path) -> None:
    import mlflow.pyfunc
    from mlflow.models import Model

    with tempfile.TemporaryDirectory(prefix="trainyard-model-") as tmp, _no_progress_bars():
        local = Path(tmp) / "model"
        mlflow.pyfunc.save_model(
            str(local), python_model=str(MODEL_CODE), artifacts={"weights": str(weights)},
            pip_requirements=_pinned_requirements(),
            mlflow_model=Model(artifact_path=artifact_location, run_id=run_id, model_uuid=model_id,
                               model_id=model_id),
        )
        pickles = sorted(p.name for p in local.rglob("*") if p.suffix in {".pkl", ".pickle", ".pt", ".pth"})
        if pickles:
            raise RuntimeError(f"the model folder holds pickles {pickles}; refusing to register it")
        client.log_model_artifacts(model_id, str(local))


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """MLflow draws a progress bar per artifact copy: noise in task logs. Off while we save."""
    import os

    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        try:
            client.create_registered_model(
                name, description="Checkpoints registered by Trainyard; lineage in each version's tags.")
        except MlflowException:
            client.get_registered_model(name)  # created concurrently: fine if it exists now


def _pinned_requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in _PIP_REQUIREMENTS:
        try:
            out.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            out.append(pkg)
    return out


def _check_safetensors(path: Path) -> None:
    """Refuse a file that is not safetensors (e.g. a torch pickle renamed) before uploading it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            if not list(f.keys()):
                raise ValueError(f"{path} holds no tensors")
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"{path} is not a safetensors file: {e}") from e


def version_at(name: str, alias: str, *, tracking_uri: str) -> ModelVersionInfo | None:
    """The version holding `alias`, or None when no version does."""
    from mlflow.exceptions import MlflowException

    client = client_for(tracking_uri)
    try:
        return ModelVersionInfo.from_mlflow(client.get_model_version_by_alias(name, alias))
    except MlflowException:
        return None
