"""`trainyard data prepare-demo [--object-store URI] [--shards N] [--json]`: write the demo
dataset (Python's `pydoc_data.topics`, ~465 kB) as JSONL shards into the object store.
`trainyard data publish SOURCE --version V`: record a dataset version and announce it to Airflow
(the asset event that starts every DAG whose spec says `retrain.onAsset` for it).

The shards go to `datasets/pydoc-topics/shard-NNNNN.jsonl` (`{"text": …}` rows of a few KB)
with a `_manifest.json` of row counts and SHA-256 digests, under `--object-store` or the
configured store (TRAINYARD_OBJECT_STORE, default `.trainyard/objects`). Running it twice
writes the same bytes. Exit 0 on success, 1 when the store cannot be written, 2 on usage errors.
"""

from __future__ import annotations

import argparse


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


EXIT_CODES: dict[int, str] = {1: "the object store cannot be written, or the dataset has no shards",
                              3: "publish: the version is recorded but Airflow did not take the asset event"}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="prepare datasets in the object store",
                       description="Prepare datasets in the object store.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    demo = actions.add_parser("prepare-demo", help="write the demo dataset (pydoc topics) as JSONL shards",
                              description=__doc__.split("\n\n")[0])
    demo.add_argument("--object-store", help="object store root URI (default: the configured store)")
    demo.add_argument("--endpoint-url", help="S3 endpoint (default: TRAINYARD_S3_ENDPOINT_URL)")
    demo.add_argument("--shards", type=_positive, default=8, help="number of shard files (default 8)")
    demo.add_argument("--json", action="store_true", help="machine-readable output")
    demo.set_defaults(func=prepare_demo)
    pub = actions.add_parser("publish", help="record a dataset version and emit its Airflow asset event",
                             description="Record a dataset version (its digest, shards, bytes) in the object store "
                                         "and emit the dataset's asset event through Airflow's REST API, so every "
                                         "DAG scheduled on it (retrain.onAsset) starts a run.")
    pub.add_argument("source", help="the dataset: a prefix in the object store (datasets/<name>/) or a URI")
    pub.add_argument("--version", required=True, help="version tag, e.g. v3 (one tag names one set of bytes)")
    pub.add_argument("--format", default="jsonl", choices=("jsonl", "parquet", "text"), help="shard format (default jsonl)")
    pub.add_argument("--object-store", help="object store root URI (default: the configured store)")
    pub.add_argument("--endpoint-url", help="S3 endpoint (default: TRAINYARD_S3_ENDPOINT_URL)")
    pub.add_argument("--airflow-url", help="Airflow's URL (default: TRAINYARD_AIRFLOW_URL, else the embedded stack's)")
    pub.add_argument("--no-event", action="store_true", help="record the version only")
    pub.add_argument("--json", action="store_true", help="machine-readable output")
    pub.set_defaults(func=publish)


def prepare_demo(args: argparse.Namespace) -> int:
    from trainyard.cli.output import console, err_console, print_json
    from trainyard.config.settings import get_settings
    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    settings = get_settings()
    root = args.object_store or settings.object_store
    endpoint = args.endpoint_url or settings.s3_endpoint_url
    try:
        store = open_store(root, endpoint_url=endpoint).child(DEMO_PREFIX.rstrip("/"))
        result = prepare_demo_dataset(store, shards=args.shards)
    except ValueError as e:
        err_console.print(f"[red]error:[/red] {e}")
        return 2
    except Exception as e:  # noqa: BLE001 - any store failure: say what and where, no traceback
        err_console.print(f"[red]error:[/red] could not write the demo dataset under {root}: "
                          f"{type(e).__name__}: {e}")
        return 1
    if args.json:
        print_json({"uri": result.uri, "rows": result.rows, "bytes": result.bytes,
                    "sha256": result.sha256, "shards": [s.__dict__ for s in result.shards]})
    else:
        console.print(f"wrote {result.rows} rows ({result.bytes / 1e3:.0f} kB) in "
                      f"{len(result.shards)} shards to {result.uri}  sha256 {result.sha256[:16]}…")
    return 0


def airflow_url(explicit: str | None) -> str:
    import os

    from trainyard.config.airflow import DEFAULT_PORT

    return explicit or os.environ.get("TRAINYARD_AIRFLOW_URL") or \
        f"http://127.0.0.1:{os.environ.get('TRAINYARD_AIRFLOW_PORT', DEFAULT_PORT)}"


def publish(args: argparse.Namespace) -> int:
    import os

    from trainyard.cli.output import console, err_console, print_json
    from trainyard.config.settings import get_settings
    from trainyard.plugins.airflow_api import (
        AirflowClient,
        AirflowRequestFailed,
        AirflowUnavailable,
    )
    from trainyard.plugins.data.publish import VersionConflict, publish_version

    settings = get_settings()
    try:
        record = publish_version(args.source, version=args.version, object_store=args.object_store or
                                 settings.object_store, fmt=args.format,
                                 endpoint_url=args.endpoint_url or settings.s3_endpoint_url)
    except (ValueError, VersionConflict) as e:
        err_console.print(f"[red]error:[/red] {e}")
        return 2
    except FileNotFoundError as e:
        err_console.print(f"[red]error:[/red] {e}; write the shards first (e.g. `trainyard data prepare-demo`)")
        return 1
    out: dict[str, object] = {"asset_uri": record.asset_uri, "version": args.version,
                              "digest": record.dataset.digest, "record": record.record_uri, "event": None}
    code = 0
    if not args.no_event:
        url = airflow_url(args.airflow_url)
        client = AirflowClient(url, token=os.environ.get("TRAINYARD_AIRFLOW_TOKEN", ""))
        try:
            asset = client.asset_by_uri(record.asset_uri)
            if asset is None:
                err_console.print(f"[yellow]no event:[/yellow] Airflow at {url} knows no asset {record.asset_uri}: "
                                  "no DAG schedules on it (a spec's retrain.onAsset) or emits it yet")
                code = 3
            else:
                event = client.create_asset_event(asset["id"], record.event_extra())
                out["event"] = {"id": event.get("id"), "asset_id": asset["id"], "timestamp": event.get("timestamp")}
        except (AirflowUnavailable, AirflowRequestFailed) as e:
            err_console.print(f"[yellow]no event:[/yellow] {e}. The version is recorded; run the same "
                              "command again once Airflow answers (publishing a version twice is safe).")
            code = 3
    if args.json:
        print_json(out)
    else:
        console.print(f"published {record.asset_uri} version {args.version} (digest {record.dataset.digest[:16]}…, "
                      f"{record.dataset.num_shards} shards) → {record.record_uri}")
        if out["event"]:
            console.print(f"asset event {out['event']['id']} emitted: DAGs scheduled on it start a run")  # type: ignore[index]
    return code
