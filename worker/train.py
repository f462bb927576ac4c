"""Example entrypoint: a byte-level Llama language model on Python's documentation text,
trained with whatever parallelism the advisor planned. Copy it as the start of your own script.

Launched by the platform as `torchrun … worker/train.py` with the `TRAINYARD_*`
contract in the environment; for debugging, standalone:

    trainyard data prepare-demo
    torchrun --nproc-per-node 2 worker/train.py --spec config/jobs/demo-tiny-lm.yaml

(plain DDP over the processes, the configured object store; `--plan FILE|JSON` for another
plan). The session (`trainyard.worker.session`) restores, checkpoints, writes heartbeats, watches for
divergence and streams metrics; this file only builds the model, the data and the loop.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch

from trainyard.config.loader import load_spec_file
from trainyard.plugins.advisor.plan import Plan
from trainyard.worker.data import open_streaming_data
from trainyard.worker.distributed.mesh import build_mesh
from trainyard.worker.distributed.parallelize import parallelize
from trainyard.worker.models.llama import Llama, LlamaConfig
from trainyard.worker.session import SessionConfig, TrainingSession
from trainyard.worker.step import train_step
from trainyard.worker.summary import write_summary

log = logging.getLogger("train")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", type=Path, help="TrainingJob YAML (default: TRAINYARD_SPEC)")
    p.add_argument("--plan", help="Plan JSON, or a file holding it (default: TRAINYARD_PLAN, "
                                  "else DDP over all processes)")
    p.add_argument("--lr", type=float, help="peak learning rate (default: the spec's learningRate)")
    p.add_argument("--summary", type=Path, help="write final step, losses and a digest of the "
                                                "trained parameters here (JSON, rank 0)")
    return p.parse_args(argv)


def warmup_cosine(optimizer: torch.optim.Optimizer, max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over 10 % of the steps, then cosine decay to 10 % of the peak."""
    warmup = max(1, max_steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {os.environ.get('RANK', 0)}] "
                                                   "%(name)s: %(message)s")
    plan = None
    if args.plan:
        text = Path(args.plan).read_text() if not args.plan.lstrip().startswith("{") else args.plan
        plan = Plan.model_validate_json(text)
    config = SessionConfig.from_env(spec=load_spec_file(args.spec) if args.spec else None, plan=plan,
                                    world_size=int(os.environ.get("WORLD_SIZE", "1")))
    job, plan = config.spec.spec, config.plan
    hints = job.parallelism.hints
    if hints is None or job.dataset is None or job.training.max_steps is None:
        raise ValueError("Trainyard's worker needs the spec's parallelism.hints (the model), dataset and "
                         "training.maxSteps (`trainyard validate` says which are missing)")
    with TrainingSession(config) as session:
        torch.manual_seed(job.training.seed)  # the same initial weights on every rank
        mesh = build_mesh(plan, session.device.type)
        model = parallelize(Llama(LlamaConfig.from_hints(hints)), plan, mesh, precision=hints.mixed_precision)
        lr = args.lr or job.training.learning_rate or 3e-4
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
        scheduler = warmup_cosine(optimizer, job.training.max_steps)
        batch = plan.micro_batch_size * plan.num_micro_batches  # sequences per replica
        data = open_streaming_data(job.dataset.source, object_store=config.object_store,
                                   seq_len=hints.sequence_length, batch_size=batch,
                                   dp_rank=mesh["dp"].get_local_rank(), dp_size=plan.layout.dp,
                                   seed=job.training.seed, fmt=job.dataset.format,
                                   text_field=job.dataset.quality.text_field,
                                   tokenizer=job.dataset.tokenizer, stripes=job.dataset.stripes,
                                   endpoint_url=config.endpoint_url)
        session.attach(model=model.state_module, optimizer=optimizer,
                       extra={"scheduler": scheduler, "sampler": data})
        losses: dict[int, float] = {}
        for step in range(session.restore(), job.training.max_steps + 1):
            session.before_step(step)
            t0 = time.perf_counter()
            inputs, targets = data.next_batch()
            stall = time.perf_counter() - t0
            step_lr = optimizer.param_groups[0]["lr"]
            with session.stop_on_oom():  # exit_codes.OOM: the control plane re-plans
                stats = train_step(model, optimizer, scheduler, inputs, targets, flags=session.flags())
            losses[step] = stats.loss
            session.step_end(step, loss=stats.loss, grad_norm=stats.grad_norm, lr=step_lr,
                             tokens=batch * plan.layout.dp * hints.sequence_length, data_stall_s=stall,
                             data_metrics=data.metrics(), flags=stats.flags)
            if session.rank == 0 and (step % 10 == 0 or step == 1):
                log.info("step %d loss %.4f grad_norm %.3f lr %.2e", step, stats.loss,
                         stats.grad_norm, step_lr)
        session.finish(job.training.max_steps)
        data.close()
        if args.summary:
            write_summary(args.summary, model, step=job.training.max_steps, losses=losses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
