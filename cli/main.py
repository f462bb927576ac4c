"""`trainyard`: the same engines the DAGs use, for people and scripts.

Each subcommand lives in its own module under `cli/` with a `register(subparsers)` function;
modules import their engines inside the handler so `trainyard --help` stays instant.
Exit codes: 0 success, 1 the thing checked is not OK (invalid spec, plan does not fit, …),
2 usage errors (argparse's convention).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: tuple[str, ...] = (
    "cli.validate",
    "cli.data",
    "cli.plan",
    "cli.checkpoints",
    "cli.place",
    "cli.launch",
    "cli.jobs",
    "cli.render",
    "cli.models",
    "cli.cost",
)
"""Modules that each add one subcommand; keep the list sorted by how people discover them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainyard",
        description="Validate, plan, place, launch and track parallel PyTorch training jobs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `trainyard … | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
