"""DATASET_NOT_FOUND: is the dataset where the spec says, before any accelerator is placed?

The dataset is located the way the worker and lineage locate it (`plugins/data/shards.py`).
"""

from __future__ import annotations

import logging

from config.problems import Code, Problem
from config.settings import Settings
from config.spec import TrainingJob
from plugins.data.shards import list_shards, open_dataset

log = logging.getLogger(__name__)

def check_dataset(job: TrainingJob, settings: Settings) -> list[Problem]:
    ds = job.spec.dataset
    path = "spec.dataset.source"
    try:
        store = open_dataset(ds.source, object_store=settings.object_store,
                             endpoint_url=settings.s3_endpoint_url)
        shards = list_shards(store, ds.format)
    except Exception as e:
        if _is_missing(e):
            return [_not_found(ds.source, ds.format, f" (the store says: {_short(e)})")]
        log.debug("dataset check failed", exc_info=True)
        return [Problem(code=Code.DATASET_NOT_FOUND, path=path, severity="warning",
                        message=f"could not check '{ds.source}': {_short(e)}",
                        hint="check the object store's address and credentials "
                             "(TRAINYARD_OBJECT_STORE, TRAINYARD_S3_ENDPOINT_URL, AWS_*)")]
    if not shards:
        return [_not_found(ds.source, ds.format, "")]
    return []


def _not_found(source: str, fmt: str, detail: str) -> Problem:
    return Problem(code=Code.DATASET_NOT_FOUND, path="spec.dataset.source",
                   message=f"no {fmt} shards at '{source}'{detail}",
                   hint="check the URI, or prepare the data first; for the demo: trainyard data prepare-demo")


def _is_missing(error: Exception) -> bool:
    code = getattr(error, "response", {}).get("Error", {}).get("Code", "") if hasattr(error, "response") else ""
    return isinstance(error, FileNotFoundError) or code in {"NoSuchBucket", "NoSuchKey", "404"}


def _short(error: Exception) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) < 200 else text[:197] + "..."
