"""The data-preparation task of `dags/datasets.py`: write the demo dataset, record it as a
version (`plugins/data/publish.py`) and hand the version to the task's asset event, so every
retraining DAG scheduled on that dataset (`retrain.onAsset: datasets/pydoc-topics/`) starts.
A team's own preparation task does the same three things for its dataset."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.config.settings import Settings


def prepare_demo_version(version: str, *, outlet_events: Any = None, settings: Settings | None = None
                         ) -> dict[str, Any]:
    """Write the demo shards, publish them as `version`; the asset event (emitted by Airflow for
    the task's outlet) carries the version's identity as its `extra`."""
    from trainyard.config.settings import get_settings
    from trainyard.plugins.data.publish import publish_version
    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    s = settings or get_settings()
    prepare_demo_dataset(open_store(s.object_store, endpoint_url=s.s3_endpoint_url).child(DEMO_PREFIX.rstrip("/")))
    record = publish_version(DEMO_PREFIX, version=version, object_store=s.object_store,
                             endpoint_url=s.s3_endpoint_url)
    if outlet_events is not None:
        from airflow.sdk import Asset

        outlet_events[Asset(record.asset_uri)].extra = record.event_extra()
    return {"asset_uri": record.asset_uri, "version": version, "digest": record.dataset.digest,
            "record": record.record_uri}
