"""Worker overhead benchmark: the demo model's training loop with the platform callback against
the same loop with no platform at all, in the same processes of the same run.

    .venv/bin/python benchmarks/worker_overhead.py [--nproc 2] [--rounds 12] [--block-s 5] [--budget-s 150]

Starts `torchrun --nproc-per-node N` on itself with the demo job (`config/jobs/demo-tiny-lm.yaml`:
the tiny Llama, DDP over N CPU processes, gloo), the demo dataset in a temporary object store
and a real MLflow run (SQLite store, in the process: the tracking work a rank does itself when
the tracking URI is a database, as on the embedded stack). The script creates its own process
group, model, optimizer and data; then each round runs a block of steps in each mode — as many
steps as the bare loop runs in `--block-s` seconds (from the warm-up), the same in both modes:

- **bare**: data + `train_step`, nothing else — no `TrainingSession` exists during the block,
  so no thread of the platform runs in it;
- **platform**: the loop of `worker/train.py` — a `TrainingSession` opened before the block (its
  threads started, its MLflow client ready: once per run, not per step), `before_step`, the
  session's stop/save flags carried by the step's loss all-reduce (`train_step(flags=...)`),
  `step_end` after every step (heartbeat, metrics, divergence and data-stall checks, the
  stop/checkpoint decision; no checkpoint falls in the window), and at the end of the block
  `session.flush()` — the newest heartbeat on disk, the block's metrics in MLflow — *inside* the
  timed block, so the block pays for all of its own background work and none of it spills into
  a bare block. The session is closed after.

A block lasts about as long as the MLflow streamer's batching interval (5 s), so the one batch
a block's flush forces is about what a steady run sends in that time. Rounds alternate which
mode goes first (ABBA). Figures, one JSON line:
- `overhead` = 1 − the median over rounds of (platform steps/s ÷ bare steps/s in the same
  round); `overhead_pct` the same in percent beside `target_overhead_pct` (1 %), with the
  spread of the per-round figure (`overhead_pct_q1`/`_q3`): under load from other processes a
  block's wall time moves by more than the target, so read the spread too;
- `overhead_cpu_pct`: the same from the CPU time the ranks' processes spent per step (every
  thread: the platform's background threads count), which load from *other* processes barely
  moves — the steadier figure on a shared machine; it leaves out waiting (a collective's latency);
  `bare_cpu_ms_per_step` and `platform_cpu_ms_per_step` are its totals (all ranks);
- `hot_path_ms`: median milliseconds per call, on rank 0, of each part of `step_end` that ran
  (the training thread's share of the overhead; `agree_allreduce` runs only for a loop that
  passes no flags), `step_end_ms_median` the whole call, and `hot_path_pct` = that median over
  the bare step's median time;
- `background_cpu_ms_per_step`: CPU time of the threads the session started (heartbeat writer,
  MLflow streamer), per step, on rank 0; `step_end_cpu_ms_mean` the training thread's CPU time in
  `step_end`; `overhead_cpu_est_pct` = their sum over rank 0's CPU time per bare step — what
  the platform costs rank 0 (the rank that streams metrics, so the one every other rank waits
  for at the next collective), read from thread clocks, which other processes' load moves least;
- `bare_steps_s`, `platform_steps_s`, `overhead_of_totals` (from the summed block times),
  `mlflow_points` (the `loss` points the platform blocks logged), `cpu_count`, `load_avg_1m`
  (at the end; `load_avg_1m_start` at the start), the run's shape.

The rounds stop at `--rounds`, or before a round that would end past `--budget-s` seconds from
the start (decided by rank 0 between rounds, so all ranks stop together; at least 2 rounds): the
benchmark keeps to its time on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TARGET_OVERHEAD_PCT = 1.0

COMPONENTS: dict[str, tuple[str, str]] = {
    "heartbeat": ("session", "beat"),
    "metrics": ("session", "_log_metrics"),
    "divergence": ("divergence", "update"),
    "data_stall": ("stalls", "update"),
    "agree_allreduce": ("session", "_agree"),
    "checkpoint_due": ("session", "_time_due"),
    "flags": ("session", "flags"),
}
"""The parts of `TrainingSession.step_end` timed on rank 0 (name → owner, method)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block-s", type=float, default=5.0, help="seconds of bare steps per block")
    parser.add_argument("--block", type=int, default=0, help="steps per mode per round (0: from --block-s)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="start no round that would end later than this after the start")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    return launch(args)


def launch(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO))
    from mlflow import MlflowClient

    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    load_start, deadline = os.getloadavg()[0], time.time() + args.budget_s
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
               "--rounds", str(args.rounds), "--block", str(args.block), "--warmup", str(args.warmup),
               "--block-s", str(args.block_s), "--deadline", str(deadline)]
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-5000:] + done.stderr[-5000:])
            return done.returncode
        result = json.loads(out.read_text())
        result["mlflow_points"] = len(client.get_metric_history(run_id, "loss"))
    result |= {"cpu_count": os.cpu_count(), "load_avg_1m_start": round(load_start, 2),
               "load_avg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(result))
    return 0


def worker(args: argparse.Namespace) -> int:
    import dataclasses

    import torch
    import torch.distributed as dist

    from trainyard.config.loader import load_spec_file
    from trainyard.worker.data import open_dataset_windows
    from trainyard.worker.distributed.mesh import build_mesh
    from trainyard.worker.distributed.parallelize import parallelize
    from trainyard.worker.models.llama import Llama, LlamaConfig
    from trainyard.worker.sampler import ResumableSampler
    from trainyard.worker.session import SessionConfig, TrainingSession
    from trainyard.worker.step import train_step
    from trainyard.worker.train import warmup_cosine

    dist.init_process_group("gloo")  # the script's own group: the bare loop needs no session
    rank = dist.get_rank()
    spec = load_spec_file(REPO / "config/jobs/demo-tiny-lm.yaml")
    config = SessionConfig.from_env(spec=spec, world_size=dist.get_world_size())
    hints, plan = spec.spec.parallelism.hints, config.plan
    if hints is None:
        raise ValueError("the demo spec has no parallelism.hints")
    # No checkpoint inside the measured window: the benchmark is about the per-step callback.
    config = dataclasses.replace(config, checkpoint_interval_steps=None, checkpoint_interval_s=None)
    torch.manual_seed(spec.spec.training.seed)
    model = parallelize(Llama(LlamaConfig.from_hints(hints)), plan, build_mesh(plan, "cpu"),
                        precision=hints.mixed_precision)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.spec.training.learning_rate)
    scheduler = warmup_cosine(optimizer, spec.spec.training.max_steps)
    data = open_dataset_windows(spec.spec.dataset.source, object_store=config.object_store,
                                seq_len=hints.sequence_length)
    sampler = ResumableSampler(len(data), rank=rank, world_size=plan.layout.dp, seed=spec.spec.training.seed)
    batch = plan.micro_batch_size * plan.num_micro_batches
    tokens = batch * plan.layout.dp * hints.sequence_length
    step = 0
    step_end_s: list[float] = []
    step_end_cpu_s: list[float] = []
    parts: dict[str, list[float]] = {name: [] for name in COMPONENTS}
    background: dict[str, float] = {}
    """CPU seconds of the session's threads inside the timed blocks, by thread name (rank 0)."""

    def train(session: TrainingSession | None) -> None:
        nonlocal step
        step += 1
        if session is not None:
            session.before_step(step)
        t0 = time.perf_counter()
        inputs, targets = data.batch(sampler.next_batch(batch))
        stall = time.perf_counter() - t0
        lr = optimizer.param_groups[0]["lr"]
        if session is None:
            train_step(model, optimizer, scheduler, inputs, targets)
            return
        stats = train_step(model, optimizer, scheduler, inputs, targets, flags=session.flags())
        c1, t1 = time.thread_time(), time.perf_counter()
        session.step_end(step, loss=stats.loss, grad_norm=stats.grad_norm, lr=lr, tokens=tokens,
                         data_stall_s=stall, flags=stats.flags)
        step_end_s.append(time.perf_counter() - t1)
        step_end_cpu_s.append(time.thread_time() - c1)

    def timed(body: Callable[[], None]) -> tuple[float, float]:
        """(wall s, this process's CPU s) of `body`, between barriers (the slowest rank's time)."""
        dist.barrier()
        cpu, wall = time.process_time(), time.perf_counter()
        body()
        dist.barrier()
        return time.perf_counter() - wall, time.process_time() - cpu

    def bare(steps: int) -> tuple[float, float]:
        return timed(lambda: [train(None) for _ in range(steps)])

    def platform(steps: int) -> tuple[float, float]:
        before = set(threading.enumerate())
        session = TrainingSession(config)  # opened untimed: its start is once per run
        session.attach(model=model.state_module, optimizer=optimizer,
                       extra={"scheduler": scheduler, "sampler": sampler})
        session.flush()  # its threads and MLflow client are up before the clock starts
        threads = [t for t in threading.enumerate() if t not in before]
        if rank == 0:
            instrument(session, parts)

        def body() -> None:
            cpu = thread_cpu(threads)
            session.reset_step_timer()
            for _ in range(steps):
                train(session)
            session.flush()  # the block's own background work, paid inside the block
            for name, seconds in thread_cpu(threads).items():
                background[name] = background.get(name, 0.0) + seconds - cpu.get(name, 0.0)

        try:
            return timed(body)
        finally:
            session.close()

    # Warm-up, both modes: the first session's start imports mlflow and opens the store (~2 s
    # of CPU in its thread), which is not per-step cost.
    warm = time.perf_counter()
    warm_bare_s, _ = bare(args.warmup)
    platform(args.warmup)
    warmup_s = time.perf_counter() - warm
    block = torch.tensor([args.block or max(3, round(args.block_s * args.warmup / warm_bare_s))])
    dist.broadcast(block, src=0)  # rank 0's count for all: every rank runs the same steps
    steps_per_block = int(block.item())
    step_end_s.clear()
    step_end_cpu_s.clear()
    background.clear()
    for samples in parts.values():
        samples.clear()
    ratios, cpu_ratios, spent, bare_step_s = [], [], {False: 0.0, True: 0.0}, []
    cpu_total = torch.zeros(2, dtype=torch.float64)
    own_bare_cpu_s = 0.0
    start = time.perf_counter()
    for r in range(args.rounds):
        round_began = time.time()
        order = (False, True) if r % 2 == 0 else (True, False)
        wall, cpu = {}, {}
        for with_platform in order:
            wall[with_platform], cpu[with_platform] = (platform if with_platform else bare)(steps_per_block)
        own_bare_cpu_s += cpu[False]
        cpu_pair = torch.tensor([cpu[False], cpu[True]], dtype=torch.float64)
        dist.all_reduce(cpu_pair)  # every rank's CPU time, summed
        ratios.append(wall[False] / wall[True])  # platform steps/s over bare steps/s
        cpu_ratios.append(float(cpu_pair[1] / cpu_pair[0]))
        cpu_total += cpu_pair
        bare_step_s.append(wall[False] / steps_per_block)
        for with_platform, seconds in wall.items():
            spent[with_platform] += seconds
        go_on = torch.tensor([int(r + 1 < 2 or time.time() + (time.time() - round_began) < args.deadline)])
        dist.broadcast(go_on, src=0)
        if not go_on.item():
            break
    rounds = len(ratios)
    steps = rounds * steps_per_block
    bare_rate, platform_rate = steps / spent[False], steps / spent[True]
    overheads = sorted(100 * (1 - x) for x in ratios)
    q1, _, q3 = statistics.quantiles(overheads, n=4) if rounds > 1 else (overheads[0],) * 3
    bare_step_ms = 1e3 * statistics.median(bare_step_s)
    step_end_ms = 1e3 * statistics.median(step_end_s)
    background_ms = {name: 1e3 * seconds / steps for name, seconds in sorted(background.items())}
    step_end_cpu_ms = 1e3 * statistics.fmean(step_end_cpu_s)
    own_bare_cpu_ms = 1e3 * own_bare_cpu_s / steps
    if rank == 0:
        args.out.write_text(json.dumps({
            "bare_steps_s": round(bare_rate, 3), "platform_steps_s": round(platform_rate, 3),
            "overhead": round(1 - statistics.median(ratios), 4),
            "overhead_of_totals": round(1 - platform_rate / bare_rate, 4),
            "overhead_pct": round(100 * (1 - statistics.median(ratios)), 2),
            "overhead_pct_q1": round(q1, 2), "overhead_pct_q3": round(q3, 2),
            "overhead_cpu_pct": round(100 * (statistics.median(cpu_ratios) - 1), 2),
            "bare_cpu_ms_per_step": round(1e3 * float(cpu_total[0]) / steps, 2),
            "platform_cpu_ms_per_step": round(1e3 * float(cpu_total[1]) / steps, 2),
            "target_overhead_pct": TARGET_OVERHEAD_PCT,
            "bare_step_ms_median": round(bare_step_ms, 2),
            "step_end_ms_median": round(step_end_ms, 3),
            "hot_path_pct": round(100 * step_end_ms / bare_step_ms, 3),
            "hot_path_ms": {name: round(1e3 * statistics.median(s), 4) for name, s in parts.items() if s},
            "step_end_cpu_ms_mean": round(step_end_cpu_ms, 4),
            "background_cpu_ms_per_step": {name: round(ms, 4) for name, ms in background_ms.items()},
            "rank0_bare_cpu_ms_per_step": round(own_bare_cpu_ms, 2),
            "overhead_cpu_est_pct": round(100 * (step_end_cpu_ms + sum(background_ms.values())) / own_bare_cpu_ms, 3),
            "rounds": rounds, "steps_per_block": steps_per_block, "steps_per_mode": steps, "warmup_s": round(warmup_s, 2),
            "measure_s": round(time.perf_counter() - start, 1),
            "world_size": dist.get_world_size(), "plan": plan.describe(),
            "model": "demo-tiny-lm (803,968 params, seq 128, global batch 16)"}))
    dist.destroy_process_group()
    return 0


def thread_cpu(threads: list[threading.Thread]) -> dict[str, float]:
    """CPU seconds so far of each live thread, by name (numbers dropped: one name per role)."""
    seconds: dict[str, float] = {}
    for t in threads:
        if t.ident is None or not t.is_alive():
            continue
        try:
            used = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, ProcessLookupError):  # ended between the check and the read
            continue
        name = t.name.split("-")[0] + ("-" + t.name.split("-")[1] if "-" in t.name else "")
        seconds[name] = seconds.get(name, 0.0) + used
    return seconds


def instrument(session: Any, samples: dict[str, list[float]]) -> None:
    """Time each part of `step_end` (`COMPONENTS`) on this session: wrap the bound methods."""
    owners = {"session": session, "divergence": session.divergence, "stalls": session._stalls}
    for name, (owner, method) in COMPONENTS.items():
        target = owners[owner]
        original = getattr(target, method)

        def wrapped(*a: Any, _f: Callable[..., Any] = original, _s: list[float] = samples[name],
                    **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                _s.append(time.perf_counter() - t)

        setattr(target, method, wrapped)


if __name__ == "__main__":
    sys.exit(main())
