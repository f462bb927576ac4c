"""torchrun job for test_objects.py: every rank calls `broadcast_from_rank0` twice — rank 0's
`make` succeeding, then raising — and prints what it got or raised, one JSON line each."""

from __future__ import annotations

import json

import torch.distributed as dist

from worker.distributed.objects import broadcast_from_rank0


def make(fail: bool) -> str:
    if fail:
        raise FileNotFoundError("no jsonl shards under file:///nowhere")
    return "the manifest"


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for fail in (False, True):
        try:
            got = ["value", broadcast_from_rank0(lambda fail=fail: make(fail))]
        except Exception as e:  # noqa: BLE001 - reported to the test
            got = [type(e).__name__, str(e)]
        print("RESULT " + json.dumps([rank, fail, *got]), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
