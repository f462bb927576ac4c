"""`trainyard validate FILE...`: every problem in every spec, before anything is allocated.

Human output lists each problem as `path: message (hint)`; `--json` prints a list of
`{"file","code","severity","path","message","hint"}`. Exit 0 when all files are valid (warnings
allowed), 1 when any has an error, 2 on usage errors. Bad input never gives a traceback.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.config.problems import Problem


EXIT_CODES: dict[int, str] = {1: "a spec has an error (warnings alone exit 0)"}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="validate TrainingJob specs (schema, rules, dry run)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="spec files (YAML)")
    p.add_argument("--cluster", help="cluster name or file to run on (default: TRAINYARD_CLUSTER — a spec "
                                     "whose devices are on another cluster is refused, naming it)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--offline", action="store_true",
                   help="check only the spec and the cluster (no object store, quota or memory model)")
    p.add_argument("--data", action="store_true",
                   help="also run data-quality checks (Great Expectations) on the dataset's shards")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainyard.config.cluster import load_cluster
    from trainyard.config.loader import read_spec_file
    from trainyard.config.settings import get_settings

    settings = get_settings()
    try:
        cluster = load_cluster(args.cluster or settings.cluster)
    except (FileNotFoundError, ValueError) as e:
        _usage_error(str(e))
        return 2

    results: list[tuple[Path, list[Problem]]] = []
    for path in args.files:
        job, problems = read_spec_file(path)
        if job is not None:  # as an attempt is opened
            from trainyard.plugins.attempt.launchers import all_problems, entrypoint_problems

            problems = entrypoint_problems(job, cluster) + all_problems(
                job, cluster, settings, offline=args.offline, data_quality=args.data)
        results.append((path, problems))

    if args.json:
        from trainyard.cli.output import print_json

        print_json([{"file": str(path), **_as_dict(p)} for path, problems in results for p in problems])
    else:
        _print_human(results)
    return 1 if any(p.severity == "error" for _, problems in results for p in problems) else 0


def _as_dict(p: Problem) -> dict[str, str]:
    return {"code": p.code.value, "severity": p.severity, "path": p.path, "message": p.message,
            "hint": p.hint}


def _print_human(results: list[tuple[Path, list[Problem]]]) -> None:
    from rich.markup import escape

    from trainyard.cli.output import console

    for path, problems in results:
        errors = [p for p in problems if p.severity == "error"]
        warnings = [p for p in problems if p.severity == "warning"]
        if not errors:
            note = f" ({len(warnings)} warning(s))" if warnings else ""
            console.print(f"[green]✓[/] {escape(str(path))}: valid{note}")
        else:
            console.print(f"[red]✗[/] {escape(str(path))}: {len(errors)} error(s)"
                          + (f", {len(warnings)} warning(s)" if warnings else ""))
        for p in errors + warnings:
            style = "red" if p.severity == "error" else "yellow"
            hint = f" [dim]({escape(p.hint)})[/]" if p.hint else ""
            console.print(f"  [{style}]{p.code.value}[/] {escape(p.path)}: {escape(p.message)}{hint}")


def _usage_error(message: str) -> None:
    from trainyard.cli.output import err_console

    err_console.print(f"trainyard validate: error: {message}")
