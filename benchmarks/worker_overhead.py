"""Worker overhead benchmark: the example's steps/s with the platform callback against a bare
loop, in the same processes of the same run.

    .venv/bin/python benchmarks/worker_overhead.py [--nproc 2] [--rounds 16] [--block 10]

Starts `torchrun --nproc-per-node N` on itself with the demo job (`config/jobs/demo-tiny-lm.yaml`:
the tiny Llama, DDP over N CPU processes, gloo), the demo dataset in a temporary object store
and a real MLflow run (SQLite store). After a warm-up, each round runs `--block` steps bare
(data + `train_step` only) and `--block` steps through `TrainingSession.step_end`: a heartbeat
file per rank per step, the stop/checkpoint-flag all-reduce, divergence check, and rank 0's
metrics (loss, grad_norm, lr, tokens/s, step time, data stall, MFU) queued for the async
MLflow streamer — no checkpoint falls in the window. Rounds alternate which mode goes first
(ABBA), so a drift in machine load hits both modes alike.

Prints one JSON line: `bare_steps_s`, `platform_steps_s` (steps over the time spent in that
mode, summed over rounds), `overhead` = 1 − the median over rounds of (platform steps/s ÷ bare
steps/s in the same round) — robust to a burst of load from other processes landing in one
block — with `overhead_of_totals` = 1 − platform/bare beside it (target < 0.03), and the run's
shape. `step_end_ms_median` is the time one `step_end` call takes on rank 0 (the part of the
overhead on the training thread; the MLflow thread's work shows only in the ratio).
The warm-up lasts until the streamer has sent its first batch (its one-time start — importing
mlflow and opening the store, about 2 s of CPU in its own thread — would otherwise land in the
first rounds); `warmup_s` says how long that took.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--block", type=int, default=10, help="steps per mode per round")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    return launch(args)


def launch(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO))
    from mlflow import MlflowClient

    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    with tempfile.TemporaryDirectory(prefix="worker-overhead-") as tmp:
        root = Path(tmp)
        store = (root / "objects").as_uri()
        prepare_demo_dataset(open_store(store).child(DEMO_PREFIX.rstrip("/")))
        tracking = f"sqlite:///{root / 'mlflow.db'}"
        client = MlflowClient(tracking)
        run_id = client.create_run(client.create_experiment("worker-overhead")).info.run_id
        out = root / "result.json"
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TRAINYARD_HOME=str(root),
                   TRAINYARD_OBJECT_STORE=store, MLFLOW_TRACKING_URI=tracking, MLFLOW_RUN_ID=run_id)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.nproc}", __file__, "--worker", "--out", str(out),
               "--rounds", str(args.rounds), "--block", str(args.block), "--warmup", str(args.warmup)]
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-5000:] + done.stderr[-5000:])
            return done.returncode
        result = json.loads(out.read_text())
        result["mlflow_points"] = len(client.get_metric_history(run_id, "loss"))
    print(json.dumps(result))
    return 0


def worker(args: argparse.Namespace) -> int:
    import torch

    from trainyard.config.loader import load_spec_file
    from trainyard.worker.data import open_dataset_windows
    from trainyard.worker.distributed.mesh import build_mesh
    from trainyard.worker.distributed.parallelize import parallelize
    from trainyard.worker.models.llama import Llama, LlamaConfig
    from trainyard.worker.sampler import ResumableSampler
    from trainyard.worker.session import SessionConfig, TrainingSession
    from trainyard.worker.step import train_step
    from trainyard.worker.train import warmup_cosine

    spec = load_spec_file(REPO / "config/jobs/demo-tiny-lm.yaml")
    config = SessionConfig.from_env(spec=spec, world_size=int(os.environ["WORLD_SIZE"]))
    hints, plan = spec.spec.parallelism.hints, config.plan
    if hints is None:
        raise ValueError("the demo spec has no parallelism.hints")
    # No checkpoint inside the measured window: the benchmark is about the per-step callback.
    config = dataclasses.replace(config, checkpoint_interval_steps=None, checkpoint_interval_s=None)
    with TrainingSession(config) as session:
        torch.manual_seed(spec.spec.training.seed)
        model = parallelize(Llama(LlamaConfig.from_hints(hints)), plan, build_mesh(plan, "cpu"),
                            precision=hints.mixed_precision)
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec.spec.training.learning_rate)
        scheduler = warmup_cosine(optimizer, spec.spec.training.max_steps)
        data = open_dataset_windows(spec.spec.dataset.source, object_store=config.object_store,
                                    seq_len=hints.sequence_length)
        sampler = ResumableSampler(len(data), rank=session.rank, world_size=plan.layout.dp,
                                   seed=spec.spec.training.seed)
        session.attach(model=model.state_module, optimizer=optimizer,
                       extra={"scheduler": scheduler, "sampler": sampler})
        batch = plan.micro_batch_size * plan.num_micro_batches
        tokens = batch * plan.layout.dp * hints.sequence_length
        step = 0
        callback_s: list[float] = []

        def run_block(steps: int, platform: bool) -> float:
            nonlocal step
            torch.distributed.barrier()
            session.reset_step_timer()
            start = time.perf_counter()
            for _ in range(steps):
                step += 1
                t0 = time.perf_counter()
                inputs, targets = data.batch(sampler.next_batch(batch))
                stall = time.perf_counter() - t0
                lr = optimizer.param_groups[0]["lr"]
                stats = train_step(model, optimizer, scheduler, inputs, targets)
                if platform:
                    t1 = time.perf_counter()
                    session.step_end(step, loss=stats.loss, grad_norm=stats.grad_norm, lr=lr,
                                     tokens=tokens, data_stall_s=stall)
                    callback_s.append(time.perf_counter() - t1)
            torch.distributed.barrier()
            return time.perf_counter() - start

        # Warm-up, until the MLflow streamer has sent its first batch: its one-time start
        # (importing mlflow, opening the store: ~2 s of CPU in its thread) is not per-step cost.
        warmup_s = run_block(args.warmup, platform=True)
        t0 = time.perf_counter()
        session.flush_metrics()
        warmup_s += time.perf_counter() - t0
        ratios, spent = [], {False: 0.0, True: 0.0}
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            times = {platform: run_block(args.block, platform) for platform in order}
            ratios.append(times[False] / times[True])  # platform steps/s over bare steps/s
            for platform, seconds in times.items():
                spent[platform] += seconds
        steps = args.rounds * args.block
        bare, platform = steps / spent[False], steps / spent[True]
        if session.rank == 0:
            args.out.write_text(json.dumps({
                "bare_steps_s": round(bare, 3), "platform_steps_s": round(platform, 3),
                "overhead": round(1 - statistics.median(ratios), 4),
                "overhead_of_totals": round(1 - platform / bare, 4), "steps_per_mode": steps,
                "warmup_s": round(warmup_s, 2),
                "step_end_ms_median": round(1e3 * statistics.median(callback_s), 3),
                "world_size": session.world_size, "plan": plan.describe(),
                "model": "demo-tiny-lm (803,968 params, seq 128, global batch 16)"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
