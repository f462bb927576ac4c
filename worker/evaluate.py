"""The evaluation gate of a retraining run (DESIGN §4): score the newly registered model version
and the one at `production` on the same held-out samples, so a person approving the promotion
sees both numbers side by side.

What is scored: the weights each version was registered from — exported again from the
checkpoint its lineage names (`trainyard.checkpoint.uri`), whose manifest must still have the
digest the version recorded (`trainyard.checkpoint.sha256`), so the numbers belong to what the
registry holds. The model
is the example worker's Llama (`worker/models/llama.py`) built from the spec's hints, on CPU.

Held-out samples: the *last* `eval_samples` windows of `sequenceLength + 1` tokens of the job's
dataset (as the worker reads it; only the last shards are read). Partial, and said so: the demo has a single dataset, so these
windows are not excluded from training — the numbers compare versions on a fixed slice, they do
not measure generalisation. A job with a separate eval split would point `source` at it.

It runs the model, so it lives with the model: the worker's package uses the tracking engine's
registry, never the other way round. No Airflow here; torch and MLflow are imported inside the
functions.
"""

from __future__ import annotations

import logging
import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from trainyard.plugins.errors import FatalError
from trainyard.plugins.tracking.registry import PRODUCTION_ALIAS, ModelVersionInfo, version_at
from trainyard.plugins.tracking.runs import TAG, client_for

if TYPE_CHECKING:
    import torch

    from trainyard.config.spec import TrainingJob

log = logging.getLogger(__name__)

EVAL_TAG = TAG + "eval."
"""Each evaluated version keeps its numbers as tags (`trainyard.eval.loss`, …)."""


class EvaluationError(FatalError):
    """A version cannot be evaluated (no checkpoint in its lineage, weights that differ from the
    registered ones): a retry reads the same registry and fails the same way."""


class EvalResult(BaseModel):
    """One model version's scores on the held-out samples."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: str
    checkpoint_step: int | None
    loss: float
    """Mean next-token cross-entropy (nats per token)."""
    perplexity: float
    samples: int
    tokens: int


class EvalComparison(BaseModel):
    """The candidate against the version at `production` (None when none holds it yet)."""

    model_config = ConfigDict(frozen=True)

    candidate: EvalResult
    production: EvalResult | None
    dataset_uri: str

    @property
    def improves(self) -> bool:
        return self.production is None or self.candidate.loss < self.production.loss

    def approval_body(self) -> str:
        """The Markdown the approval task shows: both versions' metrics and what approving does."""
        c, p = self.candidate, self.production
        rows = [f"| candidate (v{c.version}) | {c.loss:.4f} | {c.perplexity:.2f} | {c.checkpoint_step} |"]
        if p is not None:
            rows.append(f"| production (v{p.version}) | {p.loss:.4f} | {p.perplexity:.2f} | {p.checkpoint_step} |")
        verdict = ("no version holds `production` yet" if p is None else
                   f"the candidate's loss is {'lower' if self.improves else 'NOT lower'} "
                   f"({c.loss - p.loss:+.4f})")
        return "\n".join([
            f"Model **{c.name}**: move alias `production` to version **{c.version}**?",
            "",
            "| version | eval loss | perplexity | checkpoint step |",
            "|---|---|---|---|",
            *rows,
            "",
            f"Scored on the same {c.samples} held-out samples ({c.tokens} tokens) of `{self.dataset_uri}`; "
            f"{verdict}.",
            "",
            "**Approve** moves `production` to the candidate; **Reject** leaves it where it is.",
        ])


def eval_windows(job: TrainingJob, *, object_store: str, endpoint_url: str | None = None,
                 samples: int = 32) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(inputs, targets, dataset URI): the last `samples` windows of the job's dataset as the
    worker reads it (the job's tokenizer, `end_of_document` after each document). Only the last
    shards are read — as many as hold those windows — so a large dataset is not loaded to score
    32 samples."""
    import io

    import numpy as np
    import torch

    from trainyard.plugins.data.documents import load_tokenizer, token_pieces
    from trainyard.plugins.data.shards import open_dataset
    from trainyard.worker.data import TokenWindows, shard_keys

    hints = job.spec.parallelism.hints
    if hints is None:
        raise EvaluationError(f"job {job.name} has no parallelism.hints: the model to evaluate is unknown")
    if samples < 1:
        raise ValueError(f"samples must be ≥ 1, got {samples}")
    ds = job.spec.dataset
    if ds is None:
        raise EvaluationError(f"job {job.name} has no spec.dataset: nothing to evaluate on")
    store = open_dataset(ds.source, object_store=object_store, endpoint_url=endpoint_url)
    tokenizer = load_tokenizer(ds.tokenizer, store)
    need = samples * hints.sequence_length + 1
    chunks: list[np.ndarray] = []
    for key in reversed(shard_keys(store, ds.format)):
        pieces = token_pieces(io.BytesIO(store.get_bytes(key)), key, ds.format, tokenizer, ds.quality.text_field)
        chunks[:0] = [p.astype(np.int64) for p in pieces]
        if sum(map(len, chunks)) >= need:
            break
    tail = np.concatenate(chunks)[-need:] if chunks else np.empty(0, np.int64)
    windows = TokenWindows(torch.from_numpy(np.ascontiguousarray(tail)), hints.sequence_length)
    count = min(samples, len(windows))
    inputs, targets = windows.batch(range(len(windows) - count, len(windows)))
    return inputs, targets, store.uri.rstrip("/")


def eval_loss(job: TrainingJob, weights: Path, inputs: torch.Tensor, targets: torch.Tensor,
              *, batch: int = 8) -> float:
    """Mean next-token loss of the worker's model holding `weights` (a safetensors file)."""
    import torch
    from safetensors.torch import load_file

    from trainyard.worker.models.llama import Llama, LlamaConfig, cross_entropy_loss

    model = Llama(LlamaConfig.from_hints(job.spec.parallelism.hints))  # type: ignore[arg-type]
    model.load_state_dict(load_file(str(weights)), strict=True)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(inputs), batch):
            x, y = inputs[start:start + batch], targets[start:start + batch]
            total += float(cross_entropy_loss(model(x), y)) * y.numel()
            count += y.numel()
    return total / count


def evaluate_version(job: TrainingJob, version: ModelVersionInfo, inputs: torch.Tensor,
                     targets: torch.Tensor, *, endpoint_url: str | None = None) -> EvalResult:
    """Export the version's checkpoint again, check it is the registered weights, score it."""
    from trainyard.plugins.checkpoint.export import export_safetensors

    if not version.checkpoint_uri:
        raise EvaluationError(f"model {version.name} version {version.version} records no checkpoint "
                              "(tag trainyard.checkpoint.uri): it cannot be evaluated")
    with tempfile.TemporaryDirectory(prefix="trainyard-eval-") as tmp:
        exported = export_safetensors(version.checkpoint_uri, Path(tmp) / "model.safetensors",
                                      endpoint_url=endpoint_url, job=job.name)
        stamped = _manifest_digest(exported.path)
        if version.checkpoint_sha256 and stamped != version.checkpoint_sha256:
            raise EvaluationError(
                f"model {version.name} version {version.version}: checkpoint {version.checkpoint_uri} now has "
                f"manifest SHA-256 {stamped[:12]}…, the version was registered from {version.checkpoint_sha256[:12]}…")
        loss = eval_loss(job, exported.path, inputs, targets)
    return EvalResult(name=version.name, version=version.version, checkpoint_step=version.checkpoint_step,
                      loss=round(loss, 6), perplexity=round(math.exp(min(loss, 50.0)), 4),
                      samples=len(inputs), tokens=int(targets.numel()))


def _manifest_digest(weights: Path) -> str:
    """The manifest SHA-256 the export stamps into the file (the safetensors bytes themselves
    are not reproducible: their metadata order varies, so the file digest cannot be compared)."""
    from safetensors import safe_open

    with safe_open(str(weights), framework="numpy") as f:
        return (f.metadata() or {}).get("trainyard.manifest_sha256", "")


def compare_with_production(job: TrainingJob, version: str, *, tracking_uri: str, object_store: str,
                            endpoint_url: str | None = None, samples: int = 32,
                            baseline_alias: str = PRODUCTION_ALIAS) -> EvalComparison:
    """Score `version` of the job's model and the version at `baseline_alias` on the same
    held-out samples; record each score as tags of its version."""
    client = client_for(tracking_uri)
    candidate = ModelVersionInfo.from_mlflow(client.get_model_version(job.name, version))
    current = version_at(job.name, baseline_alias, tracking_uri=tracking_uri)
    inputs, targets, dataset_uri = eval_windows(job, object_store=object_store, endpoint_url=endpoint_url,
                                                samples=samples)
    scored = [evaluate_version(job, candidate, inputs, targets, endpoint_url=endpoint_url)]
    if current is not None and current.version != candidate.version:
        scored.append(evaluate_version(job, current, inputs, targets, endpoint_url=endpoint_url))
    elif current is not None:
        scored.append(scored[0])
    for result in scored:
        for key, value in (("loss", result.loss), ("perplexity", result.perplexity),
                           ("samples", result.samples), ("dataset", dataset_uri)):
            client.set_model_version_tag(job.name, result.version, EVAL_TAG + key, str(value))
    comparison = EvalComparison(candidate=scored[0], production=scored[1] if len(scored) > 1 else None,
                                dataset_uri=dataset_uri)
    log.info("evaluated %s v%s (loss %.4f) against %s", job.name, version, comparison.candidate.loss,
             f"v{comparison.production.version} (loss {comparison.production.loss:.4f})"
             if comparison.production else f"no {baseline_alias} version")
    return comparison
