"""Pipeline-style ranks for the checkpoint tests (torchrun, gloo): each rank holds *different*
parameters, as pipeline stages do, with its own learning rate. Saved collectively, restored
into fresh stages with other learning rates; everything must come back per rank, bit for bit.

    stages_job.py ROOT JOB STAGING
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from trainyard.plugins.checkpoint.manager import CheckpointManager


class Stage(nn.Module):
    """Stage r owns `layers.<r>` — the FQNs of a pipeline-split model."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(rank): nn.Linear(8, 8)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return next(iter(self.layers.values()))(x)


def build(rank: int, lr: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = Stage(rank)
    return model, torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.8 + rank / 100, 0.99))


def main() -> int:
    root, job, staging = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model, optimizer = build(rank, lr=0.01 * (rank + 1))
    for _ in range(3):
        model(torch.randn(4, 8)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_optim = optimizer.state_dict()
    with CheckpointManager(checkpoint_uri=root, job=job, rank=rank, world_size=world,
                           staging_dir=staging / f"rank{rank}") as manager:
        manager.save_sync(3, model=model, optimizer=optimizer)
        fresh_model, fresh_optim = build(rank, lr=0.5)
        manifest = manager.restore(model=fresh_model, optimizer=fresh_optim)
    assert manifest is not None and manifest.step == 3
    problems = [k for k, v in fresh_model.state_dict().items() if not torch.equal(v, saved_model[k])]
    got = fresh_optim.state_dict()
    for key in ("lr", "betas", "weight_decay"):
        if got["param_groups"][0][key] != saved_optim["param_groups"][0][key]:
            problems.append(f"param_groups.{key}: {got['param_groups'][0][key]} != "
                            f"{saved_optim['param_groups'][0][key]}")
    for pid, state in saved_optim["state"].items():
        for name, value in state.items():
            if not torch.equal(got["state"][pid][name], value):
                problems.append(f"state.{pid}.{name}")
    if problems:
        raise SystemExit(f"rank {rank}: restored state differs: {problems}")
    print(f"STAGE_MATCH rank={rank} lr={got['param_groups'][0]['lr']}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
