"""DATASET_NOT_FOUND: is the dataset where the spec says, before any accelerator is placed?

Three answers besides "yes": DATASET_NOT_FOUND (the store answered: no shards there, no such
bucket), STORE_CREDENTIALS (an error: no credentials, or the store refused them — the data may
be there, but nothing here or in the job can read it) and STORE_UNREACHABLE (a warning: the
store did not answer, nothing is known).

The dataset is located the way the worker and lineage locate it (`plugins/data/shards.py`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trainyard.config.problems import Code, Problem
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.plugins.data.shards import list_shards, open_dataset

if TYPE_CHECKING:
    from trainyard.plugins.storage.store import ObjectStore

log = logging.getLogger(__name__)

def check_dataset(job: TrainingJob, settings: Settings) -> list[Problem]:
    ds = job.spec.dataset
    path = "spec.dataset.source"
    if ds is None:  # a script of the team's own reads its data itself
        return []
    try:
        store = open_dataset(ds.source, object_store=settings.object_store,
                             endpoint_url=settings.s3_endpoint_url)
        shards = list_shards(store, ds.format)
    except Exception as e:
        if _is_missing(e):
            return [_not_found(ds.source, ds.format, f" (the store says: {_short(e)})")]
        log.debug("dataset check failed", exc_info=True)
        if _is_credentials(e):
            # Not "no dataset": the data may well be there; this machine cannot read it, and a
            # job started with the same settings could not either.
            return [Problem(code=Code.STORE_CREDENTIALS, path=path,
                            message=f"cannot read '{ds.source}': {_short(e)}",
                            hint="give the object store's credentials (AWS_ACCESS_KEY_ID and "
                                 "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role), or "
                                 "validate with --offline to skip the dataset check")]
        return [Problem(code=Code.STORE_UNREACHABLE, path=path, severity="warning",
                        message=f"could not check '{ds.source}': {_short(e)}",
                        hint="check the object store's address (TRAINYARD_OBJECT_STORE, "
                             "TRAINYARD_S3_ENDPOINT_URL) and that it is up")]
    if not shards:
        return [_not_found(ds.source, ds.format, "")]
    return _check_stripes(ds.stripes, len(shards)) + _check_tokenizer(job, store)


def _check_stripes(stripes: int | None, shards: int) -> list[Problem]:
    """A stripe is a set of whole shards (`trainyard.plugins.data.stripes`): more than one per shard
    cannot be made, so the run would quietly use fewer — and another order than asked for."""
    if stripes is None or stripes <= shards:
        return []
    return [Problem(code=Code.DATA_STRIPES, path="spec.dataset.stripes", severity="warning",
                    message=f"{stripes} stripes asked for, but the dataset has {shards} shard"
                            f"{'s' if shards != 1 else ''}: the run will use {shards}",
                    hint=f"set stripes to at most {shards}, or write the dataset in more shards")]


def _check_tokenizer(job: TrainingJob, store: ObjectStore) -> list[Problem]:
    """A `tokenizer.json` is there, loads, and its vocabulary fits the model's `vocabSize`."""
    from trainyard.plugins.data.documents import BYTES, load_tokenizer

    if job.spec.dataset is None:
        return []
    name, hints = job.spec.dataset.tokenizer, job.spec.parallelism.hints
    if name == BYTES:
        return []
    try:
        tokenizer = load_tokenizer(name, store)
    except ValueError as e:
        return [Problem(code=Code.TOKENIZER, path="spec.dataset.tokenizer", message=str(e),
                        hint="upload a tokenizers `tokenizer.json` beside the shards, or use 'bytes'")]
    if hints is not None and hints.vocab_size < tokenizer.vocab_size:
        return [Problem(code=Code.TOKENIZER, path="spec.parallelism.hints.vocabSize",
                        message=f"vocabSize {hints.vocab_size} is smaller than the tokenizer's "
                                f"vocabulary ({tokenizer.vocab_size} ids in {name})",
                        hint=f"set vocabSize to at least {tokenizer.vocab_size}")]
    return []


def _not_found(source: str, fmt: str, detail: str) -> Problem:
    return Problem(code=Code.DATASET_NOT_FOUND, path="spec.dataset.source",
                   message=f"no {fmt} shards at '{source}'{detail}",
                   hint="check the URI, or prepare the data first; for the demo: trainyard data prepare-demo")


def _is_missing(error: Exception) -> bool:
    code = getattr(error, "response", {}).get("Error", {}).get("Code", "") if hasattr(error, "response") else ""
    return isinstance(error, FileNotFoundError) or code in {"NoSuchBucket", "NoSuchKey", "404"}


_CREDENTIAL_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                               "InvalidToken", "TokenRefreshRequired", "403", "AllAccessDisabled"})
"""S3 error codes that mean "these credentials may not read this", not "nothing is there"."""


def _is_credentials(error: Exception) -> bool:
    """botocore's NoCredentialsError / PartialCredentialsError / a refused signature (by class
    name, so this module does not import botocore), or S3's access error codes."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                "ProfileNotFound", "NoAuthTokenError"}:
        return True
    code = getattr(error, "response", {}).get("Error", {}).get("Code", "") if hasattr(error, "response") else ""
    return code in _CREDENTIAL_CODES


def _short(error: Exception) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) < 200 else text[:197] + "..."
