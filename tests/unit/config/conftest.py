from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

JOBS = Path(__file__).resolve().parents[3] / "config" / "jobs"
EXAMPLES = JOBS.parent / "examples"


@pytest.fixture
def demo_doc() -> dict[str, Any]:
    """The demo spec as a plain dict, to mutate."""
    return yaml.safe_load((JOBS / "demo-tiny-lm.yaml").read_text())


@pytest.fixture
def h100_doc() -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load((EXAMPLES / "llama-7b-finetune.yaml").read_text()))
