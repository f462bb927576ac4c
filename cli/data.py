"""`trainyard data prepare-demo [--object-store URI] [--shards N] [--json]`: write the demo
dataset (Python's `pydoc_data.topics`, ~465 kB) as JSONL shards into the object store.

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


EXIT_CODES: dict[int, str] = {1: "the object store cannot be written"}
"""This command's exit codes beyond the common ones (`cli.output.EXIT_CODES`), for its --help."""


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


def prepare_demo(args: argparse.Namespace) -> int:
    from cli.output import console, err_console, print_json
    from config.settings import get_settings
    from plugins.storage.store import open_store
    from worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

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
