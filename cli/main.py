"""`trainyard`: the same engines the DAGs use, for people and scripts.

Each subcommand lives in its own module under `cli/` with a `register(subparsers)` function;
modules import their engines inside the handler so `trainyard --help` stays instant.
Exit codes: 0 success, 1 the thing checked is not OK (invalid spec, plan does not fit, …),
2 usage errors (argparse's convention), 130 interrupted; each command lists its own in its
`--help` (a module's `EXIT_CODES`) and the README lists them all.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: tuple[str, ...] = (
    "trainyard.cli.validate",
    "trainyard.cli.data",
    "trainyard.cli.plan",
    "trainyard.cli.checkpoints",
    "trainyard.cli.place",
    "trainyard.cli.launch",
    "trainyard.cli.submit",
    "trainyard.cli.jobs",
    "trainyard.cli.logs",
    "trainyard.cli.render",
    "trainyard.cli.models",
    "trainyard.cli.cost",
)
"""Modules that each add one subcommand; keep the list sorted by how people discover them."""


def build_parser() -> argparse.ArgumentParser:
    from trainyard.cli.output import exit_codes_epilog

    parser = argparse.ArgumentParser(
        prog="trainyard",
        description="Validate, plan, place, launch and track parallel PyTorch training jobs.",
        epilog=exit_codes_epilog(), formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(name)
        before = set(sub.choices)
        module.register(sub)
        for added in set(sub.choices) - before:
            _add_exit_codes(sub.choices[added], exit_codes_epilog(getattr(module, "EXIT_CODES", {})))
    return parser


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter (descriptions filled to the terminal) that keeps the exit-code
    table's own layout."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("exit codes:\n"):
            return text
        return super()._fill_text(text, width, indent)


def _add_exit_codes(parser: argparse.ArgumentParser, epilog: str) -> None:
    """The command's exit codes at the end of its --help and of each of its actions'."""
    parser.epilog = epilog
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                _add_exit_codes(child, epilog)


def version() -> str:
    """The installed distribution's version (`trainyard.__version__`)."""
    from trainyard import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the net under every command, for input an engine refused
        code = refused_input_exit_code(e)
        if code is None:
            raise
        from trainyard.config.problems import preview

        print(f"trainyard {args.command}: error: {preview(str(e), 2000)}", file=sys.stderr)
        return code
    except BrokenPipeError:  # `trainyard … | head`
        sys.stderr.close()
        return 0


def refused_input_exit_code(error: BaseException) -> int | None:
    """A command that lets an engine's refusal of its input through still ends in one line:
    2 for a bad file or argument (a cluster file, a URI outside the job's area), 1 for anything
    else an engine raised on purpose (`FatalError`, or a `TransientError` such as a database
    that is not running); None for a bug (its traceback stays)."""
    from trainyard.config.cluster import ClusterFileError
    from trainyard.plugins.errors import TrainyardError
    from trainyard.plugins.storage.errors import UnsafeKeyError

    if isinstance(error, ClusterFileError | UnsafeKeyError | FileNotFoundError | IsADirectoryError):
        return 2
    if isinstance(error, TrainyardError):
        return 1
    return None


if __name__ == "__main__":
    sys.exit(main())
