"""A tiny distributed job for the launcher tests: a gloo all-reduce per step, a heartbeat per
step, SIGTERM answered with exit 43 (an "emergency checkpoint"), optional failure of one rank.
With `--checkpoint-dir`, the emergency checkpoint is a real file (`emergency.json`: the step the
ranks agreed to stop at, written by rank 0 before it exits, atomically), and a start that finds it
resumes after that step — what a preempted gang's next attempt does with the worker's DCP one.
With `--hold-while PATH`, the last step is not taken while PATH exists: a test ends the job when
it has seen what it waits for, however fast this machine trains.

Deliberately independent of `worker/train.py`: the launcher is tested on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from trainyard.config.worker_env import WorkerEnv
from trainyard.plugins.run.heartbeat import Heartbeat, write_heartbeat

TERMINATED = 43


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--exit-code", type=int, default=7)
    parser.add_argument("--checkpoint-dir", default="")
    parser.add_argument("--hold-while", default="")
    args = parser.parse_args()
    checkpoint = os.path.join(args.checkpoint_dir, "emergency.json") if args.checkpoint_dir else ""
    stop = {"requested": False}

    def on_sigterm(*_: object) -> None:
        # Like the worker runtime: note it, finish the step, "checkpoint", exit 43 — and ignore
        # repeats (torchrun sends SIGTERM more than once). The ranks agree on the step to stop
        # at (the flag rides on the step's all-reduce): the signal reaches them at different
        # times, and a rank that left alone would fail its peer's next collective.
        stop["requested"] = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    signal.signal(signal.SIGTERM, on_sigterm)
    env = WorkerEnv.from_env()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"hello rank={rank} world={world} job={env.job} attempt={env.attempt} "
          f"node={os.environ.get('TRAINYARD_NODE')} lr={os.environ.get('TRAINYARD_LEARNING_RATE')}", flush=True)
    first = 1
    if checkpoint and os.path.exists(checkpoint):
        with open(checkpoint) as f:
            first = int(json.load(f)["step"]) + 1
        print(f"rank {rank}: resumed from the emergency checkpoint of step {first - 1}", flush=True)
    for step in range(first, args.steps + 1):
        while step == args.steps and args.hold_while and os.path.exists(args.hold_while) and not stop["requested"]:
            time.sleep(0.2)
        value = torch.tensor([float(rank + 1), float(stop["requested"])])
        dist.all_reduce(value)
        write_heartbeat(env.heartbeat_dir, Heartbeat(
            job=env.job, run=env.run, attempt=env.attempt, rank=rank, node=os.environ.get("TRAINYARD_NODE", ""),
            pid=os.getpid(), step=step, time=time.time(), loss=1.0 / step,
            hang_timeout_s=env.hang_timeout_s))
        print(f"step {step} sum={value[0].item():.0f}", flush=True)
        if rank == args.fail_rank and step == args.steps:
            print(f"rank {rank} failing on purpose with {args.exit_code}", flush=True)
            # leave now: returning through the interpreter's shutdown while gloo's threads still
            # serve the peer can abort ("terminate called without an active exception", SIGABRT)
            sys.stderr.flush()
            os._exit(args.exit_code)
        if value[1].item() > 0:
            # a rank stopping for its peer's signal may meet its own on the way out: ignored
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print(f"rank {rank}: SIGTERM, emergency checkpoint at step {step}", flush=True)
            if checkpoint and rank == 0:
                with open(f"{checkpoint}.tmp", "w") as f:
                    json.dump({"step": step, "attempt": env.attempt}, f)
                os.replace(f"{checkpoint}.tmp", checkpoint)
            # both ranks finished this step's all-reduce: leave the group as the worker runtime
            # does (WorkerSession.close) — gloo's threads still alive at interpreter shutdown
            # can abort it (SIGABRT, exit -6: seen once in CI in the Kubernetes stop test)
            dist.destroy_process_group()
            return TERMINATED
        time.sleep(args.sleep)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
