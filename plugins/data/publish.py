"""Publishing a dataset version: record what landed (the dataset's identity at that moment) so a
retraining run's lineage can name it, and say which Airflow asset announces it.

A version record is `<object store>/dataset-versions/<asset path>/<version>.json` — a
`DatasetRef` plus the asset URI and the time — kept beside, not inside, the dataset's own prefix
(a file there would change its listing digest). Publishing the same version again with the same
digest is a no-op that returns the first record; with another digest it is refused (a version tag
names one set of bytes). Emitting the asset event is the caller's (the CLI posts it to Airflow's
REST API, a data-preparation task declares the asset as its outlet).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from trainyard.plugins.data.assets import dataset_asset_uri
from trainyard.plugins.data.datasets import DatasetRef, describe_dataset
from trainyard.plugins.data.shards import open_dataset
from trainyard.plugins.errors import FatalError

if TYPE_CHECKING:
    from trainyard.plugins.storage.store import ObjectStore

VERSIONS_PREFIX = "dataset-versions"


class VersionConflict(FatalError):
    """The version tag is already published with other bytes."""


class PublishedVersion(BaseModel):
    model_config = ConfigDict(frozen=True)

    asset_uri: str
    dataset: DatasetRef
    published_at: dt.datetime
    record_uri: str = ""

    def event_extra(self) -> dict[str, object]:
        """What the asset event carries (shown in Airflow's asset view and the triggered run)."""
        d = self.dataset
        return {"dataset_uri": d.uri, "version": d.version, "digest": d.digest,
                "digest_method": d.digest_method, "num_shards": d.num_shards, "total_bytes": d.total_bytes}


def version_key(asset_uri: str, version: str) -> str:
    """`dataset-versions/<scheme>/<path>/<version>.json` (the trainyard scheme is left out)."""
    scheme, _, path = asset_uri.partition("://")
    parts = ([] if scheme == "trainyard" else [scheme]) + [p for p in path.split("/") if p]
    if not version or "/" in version or version in (".", ".."):
        raise ValueError(f"version {version!r} must be a single path segment like 'v3'")
    return "/".join([VERSIONS_PREFIX, *parts, f"{version}.json"])


def publish_version(source: str, *, version: str, object_store: str, fmt: str = "jsonl",
                    endpoint_url: str | None = None, now: dt.datetime | None = None) -> PublishedVersion:
    """Describe the dataset at `source` as `version` and record it (idempotent per digest)."""
    from trainyard.config.spec import Dataset
    from trainyard.plugins.storage.errors import ObjectNotFoundError
    from trainyard.plugins.storage.store import open_store

    data = open_dataset(source, object_store=object_store, endpoint_url=endpoint_url)
    ref = describe_dataset(data, Dataset(source=source, format=fmt, version=version))  # type: ignore[arg-type]
    asset_uri = dataset_asset_uri(source)
    store: ObjectStore = open_store(object_store, endpoint_url=endpoint_url)
    key = version_key(asset_uri, version)
    try:
        before = PublishedVersion.model_validate_json(store.get_bytes(key))
    except ObjectNotFoundError:
        before = None
    if before is not None:
        if before.dataset.digest != ref.digest:
            raise VersionConflict(f"dataset {asset_uri} version {version} was published with digest "
                                  f"{before.dataset.digest[:12]}…, the data now has {ref.digest[:12]}…; "
                                  "publish it under a new version tag")
        return before
    record = PublishedVersion(asset_uri=asset_uri, dataset=ref, published_at=now or dt.datetime.now(dt.UTC),
                              record_uri=store.key_uri(key))
    store.put_bytes(key, record.model_dump_json(indent=2).encode())
    return record
