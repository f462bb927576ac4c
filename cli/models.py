"""`trainyard models --dataset URI[@VERSION]`: which registered model versions saw this data?

An erasure request that must reach models becomes a query. The dataset is given as
the spec writes it — a URI (`s3://datasets/wiki/`) or a prefix in the object store
(`datasets/wiki/`) — optionally with `@version` (`datasets/wiki/@v3`) or `--digest`.
Human output is a table; `--json` prints a list of model versions with their lineage.
Exit 0 whether or not versions were found, 2 on usage errors.
"""

from __future__ import annotations

import argparse

EXIT_CODES: dict[int, str] = {0: "success, whether or not a version was found"}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="registered model versions and their lineage (by dataset)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, metavar="URI[@VERSION]",
                   help="dataset URI or object-store prefix, optionally @version (e.g. datasets/wiki/@v3)")
    p.add_argument("--digest", help="only versions trained on exactly this content digest")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: TRAINYARD_MLFLOW_TRACKING_URI)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--wide", action="store_true", help="every column, whatever the terminal's width")
    p.set_defaults(func=run)


def split_dataset_arg(text: str) -> tuple[str, str | None]:
    """`uri@v3` → (`uri`, `v3`); an `@` inside the URI's authority (`s3://a@b/`) is left alone."""
    head, sep, tail = text.rpartition("@")
    if sep and head and tail and "/" not in tail and ":" not in tail:
        return head, tail
    return text, None


def run(args: argparse.Namespace) -> int:
    from trainyard.config.settings import get_settings
    from trainyard.plugins.data.datasets import canonical_dataset_uri
    from trainyard.plugins.tracking.registry import models_trained_on, trained_datasets

    settings = get_settings()
    source, version = split_dataset_arg(args.dataset)
    try:
        uri = canonical_dataset_uri(source, settings)
    except ValueError as e:
        from trainyard.cli.output import err_console

        err_console.print(f"trainyard models: error: {e}")
        return 2
    tracking_uri = args.tracking_uri or settings.mlflow_tracking_uri
    versions = models_trained_on(uri, version, tracking_uri=tracking_uri, digest=args.digest)
    if args.json:
        from trainyard.cli.output import print_json

        print_json([v.model_dump() for v in versions])
        return 0
    _print_table(versions, uri, version, wide=args.wide)
    if not versions:
        _print_known(trained_datasets(tracking_uri=tracking_uri))
    return 0


def _print_known(known: dict[str, list[str]], limit: int = 10) -> None:
    """What the registry does hold, so a query that found nothing (a prefix written another way,
    a version never trained on) shows what to ask instead."""
    from rich.markup import escape

    from trainyard.cli.output import console

    if not known:
        console.print("no registered model version records a dataset yet")
        return
    console.print("registered model versions were trained on:")
    for uri, versions in list(known.items())[:limit]:
        console.print(f"  {escape(uri)}" + (f"  (versions: {escape(', '.join(versions))})" if versions else ""))
    if len(known) > limit:
        console.print(f"  … and {len(known) - limit} more datasets")


def _print_table(versions: list, uri: str, version: str | None, *, wide: bool = False) -> None:
    from rich.markup import escape

    from trainyard.cli.output import console, print_table, row, table

    label = escape(uri + (f"@{version}" if version else ""))
    if not versions:
        console.print(f"no registered model version was trained on {label}")
        return
    # Ids are cut to 8 characters (as git does) and dates to the minute; --wide shows the job,
    # the checkpoint's and the data's digests.
    t, shown = table(f"Model versions trained on\n{label}", [
        ("model", "left"), ("ver", "right"), ("aliases", "left"), ("job", "left"), ("run", "left"),
        ("step", "right"), ("checkpoint sha256", "left"), ("data", "left"), ("data digest", "left"),
        ("created (UTC)", "left")], wide=wide, wide_only=("job", "checkpoint sha256", "data digest"))
    for v in versions:
        t.add_row(*row(shown, {
            "model": escape(v.name), "ver": v.version, "aliases": escape(",".join(v.aliases)),
            "job": escape(v.job or ""), "run": (v.run_id or "")[:8],
            "step": "" if v.checkpoint_step is None else str(v.checkpoint_step),
            "checkpoint sha256": (v.checkpoint_sha256 or "")[:12], "data": escape(v.dataset_version or ""),
            "data digest": (v.dataset_digest or "")[:12], "created (UTC)": v.created_at[:16].replace("T", " ")}))
    print_table(t, wide=wide)
