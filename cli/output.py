"""Shared output helpers: one rich console for humans, plain JSON for scripts."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from rich.table import Table

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Machine output: one JSON document on stdout, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def table(title: str, columns: list[tuple[str, str]], *, wide: bool = False,
          wide_only: tuple[str, ...] = ()) -> tuple[Table, list[str]]:
    """A compact table (no vertical rules: three characters saved per column) with `columns`
    as (header, "left" | "right"); the headers in `wide_only` only with `--wide`. Returns the
    table and the headers shown, so rows can be filtered by `row(...)`. Long cells wrap inside
    their column (`overflow="fold"`) instead of pushing the table past the terminal."""
    from rich import box
    from rich.table import Table

    shown = [name for name, _ in columns if wide or name not in wide_only]
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
              collapse_padding=True)
    for name, justify in columns:
        if name in shown:
            t.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    return t, shown


def print_table(t: Table, *, wide: bool = False) -> None:
    """Print `t` on stdout; with `wide`, at its natural width even past the terminal's (for
    `less -S`, files and wide windows) instead of folding its cells."""
    from rich.measure import Measurement

    if not wide:
        console.print(t)
        return
    natural = Measurement.get(console, console.options.update(width=10_000), t).maximum
    if natural <= console.width:
        console.print(t)
        return
    # Console.print caps `width` at the console's own: a console of the table's width instead.
    Console(file=console.file, width=natural, highlight=False, soft_wrap=True,
            force_terminal=console.is_terminal, no_color=console.no_color).print(t)


def row(shown: list[str], cells: dict[str, str]) -> list[str]:
    """The cells of one row, in `shown` order (the headers `table` kept)."""
    return [cells[name] for name in shown]


def format_age(seconds: float | None) -> str:
    """One spelling of an age everywhere: `45s`, `1m57s`, `3h05m`, `2d04h` (None: `-`): the two
    largest units, so ages sort by eye and `2m` never sits beside `117s`."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


EXIT_CODES = {0: "success", 1: "the thing checked is not OK (see the command's own codes)",
              2: "usage error: a bad option, file or value", 130: "interrupted (Ctrl-C)"}
"""What every `trainyard` command returns; a command adds or refines its own (README: Exit codes)."""


def exit_codes_epilog(own: dict[int, str | None] | None = None) -> str:
    """The `exit codes:` block at the end of a command's `--help`: the common codes, refined
    by the command's own (a None removes a common code the command never returns)."""
    import textwrap

    merged: dict[int, str | None] = {**EXIT_CODES, **(own or {})}
    codes = {k: v for k, v in merged.items() if v is not None}
    return "exit codes:\n" + "\n".join(
        textwrap.fill(codes[code], width=78, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7)
        for code in sorted(codes))
