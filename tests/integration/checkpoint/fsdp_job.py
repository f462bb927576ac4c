"""A tiny FSDP2 training job for the checkpoint integration tests (run under torchrun, gloo).

    train   — train `--steps` steps, saving every `--save-every` (async) and dumping the full,
              gathered model + optimizer + scheduler + sampler state of each saved step to
              `--ref-dir` as the reference; optionally SIGKILL one rank in the middle of a save.
    resume  — restore (latest valid, or `--manifest`), compare everything with the reference of
              the restored step (bit for bit), then optionally train on to `--steps` and compare
              with that step's reference: an interrupted run must end exactly where an
              uninterrupted one did.

Prints marker lines (`RESTORED step=…`, `MATCH_RESTORE …`, `MATCH_CONTINUE …`) the tests assert.
Batches come from the global torch RNG and the model has dropout, so the RNG states must be
restored too for the continued run to match.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from trainyard.plugins.checkpoint.manager import CheckpointManager


class Sampler:
    """Stands in for the platform sampler: a position that must survive a restart."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "epoch": (0, "tuple-survives")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["epoch"] != (0, "tuple-survives"):
            raise ValueError(f"extra state came back changed: {state}")
        self.position = state["position"]


def build(world: int) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(1234)  # same initial weights on every rank, as a real job would have
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 32),
                          nn.GELU(), nn.Linear(32, 8))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + 0.1 * s))
    return model, optimizer, scheduler


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
               sampler: Sampler) -> None:
    batch = torch.randn(8, 16)
    sampler.position += batch.shape[0]
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
               sampler: Sampler) -> dict[str, Any]:
    """Everything gathered to full tensors (collective), keyed by FQN: comparable across
    world sizes."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)
    return {"model": model_sd, "optim": optim_sd, "sched": scheduler.state_dict(),
            "sampler": sampler.position}


def compare(got: Any, want: Any, where: str = "") -> list[str]:
    if isinstance(want, dict):
        if set(got) != set(want):
            return [f"{where}: keys {sorted(map(str, got))} != {sorted(map(str, want))}"]
        return [d for k in want for d in compare(got[k], want[k], f"{where}.{k}")]
    if isinstance(want, list | tuple):
        if len(got) != len(want):
            return [f"{where}: length {len(got)} != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in compare(g, w, f"{where}[{i}]")]
    if isinstance(want, torch.Tensor):
        ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
        return [] if ok else [f"{where}: tensors differ"]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


def kill_during_upload(manager: CheckpointManager, step: int) -> None:
    """Make this rank die by SIGKILL in the middle of the save of `step`: after rank 0 has
    uploaded its shard (we wait to see it in the store), before this rank uploads its own."""
    import trainyard.plugins.checkpoint.manager as manager_module

    real_upload = manager_module.upload_file

    def upload_then_die(store: Any, folder: str, rel: str, path: Path, **kwargs: Any) -> Any:
        if folder.endswith(f"{step:08d}"):
            deadline = time.monotonic() + 60
            while not manager.store.exists(f"{folder}/__0_0.distcp") and time.monotonic() < deadline:
                time.sleep(0.05)
            print(f"KILLING rank {manager.rank} during the save of step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return real_upload(store, folder, rel, path, **kwargs)

    manager_module.upload_file = upload_then_die  # type: ignore[assignment]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "resume"])
    parser.add_argument("--root", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--ref-dir", type=Path, required=True)
    parser.add_argument("--staging", type=Path, required=True)
    parser.add_argument("--manifest", default=None)
    parser.add_argument("--endpoint-url", default=None)
    parser.add_argument("--compression", default="none")
    parser.add_argument("--continue", dest="keep_training", action="store_true")
    parser.add_argument("--kill-rank", type=int, default=None)
    parser.add_argument("--kill-at-step", type=int, default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer, scheduler = build(world)
    sampler = Sampler()
    manager = CheckpointManager(checkpoint_uri=args.root, job=args.job, rank=rank,
                                world_size=world, staging_dir=args.staging / f"rank{rank}",
                                compression=args.compression, endpoint_url=args.endpoint_url,
                                plan_json=json.dumps({"dp": world}))
    extra = {"scheduler": scheduler, "sampler": sampler}
    torch.manual_seed(100 + rank)  # each rank draws different batches
    first = 1
    if args.mode == "resume":
        manifest = manager.restore(model=model, optimizer=optimizer, extra=extra,
                                   manifest_uri=args.manifest)
        if manifest is None:
            raise SystemExit("nothing to restore")
        print(f"RESTORED step={manifest.step} world={world} saved_by={manifest.world_size}",
              flush=True)
        want = torch.load(args.ref_dir / f"step-{manifest.step}.pt", weights_only=True)
        diffs = compare(full_state(model, optimizer, scheduler, sampler), want)
        if rank == 0:  # the gathered full state lives on rank 0
            if diffs:
                raise SystemExit("restored state differs from the saved one:\n"
                                 + "\n".join(diffs[:20]))
            print(f"MATCH_RESTORE step={manifest.step}", flush=True)
        if not args.keep_training:
            manager.close()
            dist.destroy_process_group()
            return 0
        first = manifest.step + 1
    elif args.kill_rank == rank and args.kill_at_step:
        kill_during_upload(manager, args.kill_at_step)

    for step in range(first, args.steps + 1):
        train_step(model, optimizer, scheduler, sampler)
        if args.mode == "train" and step % args.save_every == 0:
            result = manager.save(step, model=model, optimizer=optimizer, extra=extra,
                                  metrics={"loss": 1.0 / step})
            if result.previous is not None and not result.previous.committed:
                raise SystemExit(f"save of step {result.previous.step} failed")
            ref = full_state(model, optimizer, scheduler, sampler)
            if rank == 0:
                args.ref_dir.mkdir(parents=True, exist_ok=True)
                torch.save(ref, args.ref_dir / f"step-{step}.pt")
    if args.mode == "train":
        final = manager.wait()
        print(f"TRAINED steps={args.steps} last_commit={final.step if final else None}", flush=True)
    else:
        want = torch.load(args.ref_dir / f"step-{args.steps}.pt", weights_only=True)
        diffs = compare(full_state(model, optimizer, scheduler, sampler), want)
        if rank == 0:
            if diffs:
                raise SystemExit("continued run differs from the uninterrupted one:\n"
                                 + "\n".join(diffs[:20]))
            print(f"MATCH_CONTINUE step={args.steps}", flush=True)
    manager.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
