"""torchrun job for test_objects.py: every rank calls `broadcast_from_rank0` twice — rank 0's
`make` succeeding, then raising — and writes what it got or raised to `OUT_DIR/rank-N.json`
(a file per rank: the ranks' shared stdout interleaves their lines)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from trainyard.worker.distributed.objects import broadcast_from_rank0


def make(fail: bool) -> str:
    if fail:
        raise FileNotFoundError("no jsonl shards under file:///nowhere")
    return "the manifest"


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = []
    for fail in (False, True):
        try:
            results.append(["value", broadcast_from_rank0(lambda fail=fail: make(fail))])
        except Exception as e:  # noqa: BLE001 - reported to the test
            results.append([type(e).__name__, str(e)])
    (out / f"rank-{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
