"""torchrun job for test_worker_parallel.py: trains the same tiny Llama on the same batches with
several plans, plus a single-process reference on every rank, and writes the loss
trajectories (rank 0) to the JSON file named on the command line.

Run as `torchrun --nproc-per-node 2 equivalence_job.py OUT.json [--layers=N] PLAN_NAME...`;
`--layers` changes the model's depth (5 layers on PP2 exercise the uneven pipeline split).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch
import torch.distributed as dist

from trainyard.plugins.advisor.plan import Plan
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.worker.distributed.mesh import build_mesh
from trainyard.worker.distributed.parallelize import parallelize
from trainyard.worker.models.llama import Llama, LlamaConfig, cross_entropy_loss
from trainyard.worker.step import train_step

CONFIG = LlamaConfig(vocab_size=256, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                     ffn_hidden_size=128, max_seq_len=32)
GLOBAL_BATCH, SEQ, STEPS, LR = 8, 32, 20, 3e-3

PLANS: dict[str, Plan] = {
    "ddp": Plan(layout=RankLayout(dp=2), micro_batch_size=4),
    "ddp_accumulate": Plan(layout=RankLayout(dp=2), micro_batch_size=2, num_micro_batches=2),
    "fsdp": Plan(layout=RankLayout(dp=2), zero_stage=3, micro_batch_size=4),
    "fsdp_zero2_selective_ac": Plan(layout=RankLayout(dp=2), zero_stage=2, micro_batch_size=4,
                                    activation_checkpointing="selective"),
    "tp": Plan(layout=RankLayout(tp=2), micro_batch_size=8),
    "tp_sp_full_ac": Plan(layout=RankLayout(tp=2), micro_batch_size=8, sequence_parallel=True,
                          activation_checkpointing="full"),
    "pp_1f1b": Plan(layout=RankLayout(pp=2), micro_batch_size=2, num_micro_batches=4),
    "pp_interleaved": Plan(layout=RankLayout(pp=2), vpp=2, micro_batch_size=2, num_micro_batches=4),
}
"""Plans for 2 processes."""

PLANS_2D: dict[str, Plan] = {
    "fsdp_x_tp": Plan(layout=RankLayout(dp=2, tp=2), zero_stage=3, micro_batch_size=4, sequence_parallel=True),
    "ddp_x_tp": Plan(layout=RankLayout(dp=2, tp=2), micro_batch_size=4),
    "pp_x_ddp": Plan(layout=RankLayout(pp=2, dp=2), micro_batch_size=2, num_micro_batches=2),
    "pp_x_fsdp": Plan(layout=RankLayout(pp=2, dp=2), zero_stage=3, micro_batch_size=2, num_micro_batches=2),
    "pp_x_tp": Plan(layout=RankLayout(pp=2, tp=2), micro_batch_size=4, num_micro_batches=2, sequence_parallel=True),
}
"""Two-dimensional plans, for 4 processes."""

PLANS_UNEVEN: dict[str, Plan] = {
    "pp_uneven_1f1b": Plan(layout=RankLayout(pp=2), micro_batch_size=2, num_micro_batches=4),
    "pp_uneven_interleaved": Plan(layout=RankLayout(pp=2), vpp=2, micro_batch_size=2, num_micro_batches=4),
}
"""Pipelines whose stages do not divide the layers, for 2 processes and `--layers=5`
(stages of 3 + 2 layers; interleaved: 1, 2, 1, 1)."""


def batches() -> torch.Tensor:
    """STEPS global batches of real text (Python's docs), so the loss visibly falls."""
    from pydoc_data.topics import topics

    text = "".join(topics[k] for k in sorted(topics)).encode()
    need = STEPS * GLOBAL_BATCH * (SEQ + 1)
    tokens = torch.frombuffer(bytearray(text[:need]), dtype=torch.uint8).long()
    return tokens.view(STEPS, GLOBAL_BATCH, SEQ + 1)


def reference(data: torch.Tensor, config: LlamaConfig = CONFIG) -> list[float]:
    """One process, the whole global batch, no torch.distributed involved."""
    torch.manual_seed(1)
    model = Llama(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        loss = cross_entropy_loss(model(data[step, :, :-1]), data[step, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def parallel(plan: Plan, data: torch.Tensor, config: LlamaConfig = CONFIG) -> list[float]:
    torch.manual_seed(1)
    mesh = build_mesh(plan, "cpu")
    model = parallelize(Llama(config), plan, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    dp_rank, per_replica = mesh["dp"].get_local_rank(), GLOBAL_BATCH // plan.layout.dp
    losses = []
    for step in range(STEPS):
        mine = data[step, dp_rank * per_replica:(dp_rank + 1) * per_replica]
        losses.append(train_step(model, optimizer, None, mine[:, :-1], mine[:, 1:]).loss)
    return losses


def main() -> None:
    out, names = sys.argv[1], sys.argv[2:]
    config = CONFIG
    if names and names[0].startswith("--layers="):
        config = replace(CONFIG, num_layers=int(names.pop(0).split("=", 1)[1]))
    dist.init_process_group("gloo")
    data = batches()
    results = {"reference": reference(data, config)}
    for name in names:
        results[name] = parallel({**PLANS, **PLANS_2D, **PLANS_UNEVEN}[name], data, config)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
