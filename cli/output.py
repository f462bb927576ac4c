"""Shared output helpers: one rich console for humans, plain JSON for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Machine output: one JSON document on stdout, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
