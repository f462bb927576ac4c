"""Recovery benchmark (DESIGN §5): how long the tiny 2-rank job is down after a failure, on each
path, against what the same job costs to restart bare, in the same run.

    .venv/bin/python benchmarks/recovery.py [--kill-at 25] [--interval 10]

Four measurements of the demo job (`config/jobs/demo-tiny-lm.yaml`: the tiny Llama, DDP over
2 CPU processes, gloo; a copy that checkpoints every `--interval` steps), each in a temporary
Trainyard home with the demo dataset:

1. **fast path** — the platform's `LocalLauncher` with torchrun's in-place restart (the spec's
   `faultTolerance.inPlaceRestarts`); once rank 0 reached step `--kill-at`, rank 1's process
   is SIGKILLed from here. `fast_path_mttr_s` = from the kill to the first step the restarted
   workers complete (their first `train` heartbeat). The restarted rank 0 logs how long its
   (verified) restore took: `restore_s`. `fast_path_phases_s` says where the time went, from
   the run's own records: `teardown` (the killed incarnation's last rank exits), `torchrun_restart`
   (→ the new rank-0 wrapper starts), `fork_and_process_group` (the rank forked from the attempt's
   warm starter, `rank_zygote`, up to its process group), `build_model`, `restore`, `first_step`.
2. **bare restart** — the fair competitor: `torchrun --max-restarts 1` (the same c10d rendezvous
   the launcher's agents use; no launcher, no rank wrapper, no warm starter, no control plane)
   running `bare_rank`, a plain DDP script of the same model that `dcp.load`s the very checkpoint
   the fast path resumed from (unverified) and trains; rank 1 is SIGKILLed the same way.
   `bare_restart_restore_s` = from the kill to the first step after torchrun's restart, `dcp_load_s`
   its load, `bare_phases_s` its parts (`import_torch` is the fresh interpreter's), and
   `torchrun_restart_s` = from the kill to its new process group (nothing restored yet).
   Target (issue 58): `fast_path_vs_bare` = fast path / bare restart ≤ 0.5 (`fast_path_vs_bare_target`).
3. **control plane** — a real embedded Airflow (`tests/e2e/airflow_stack.py`) with one real
   node agent per local node (`tests/support/node_agents.py`, fault injection on); the job's
   DAG is triggered, and once rank 0 reached `--kill-at` a GPU of the gang's node is marked
   failed through its agent (Xid 79). `control_plane_mttr_s` = from that call to the first
   step of the next attempt, placed elsewhere: detection by the health watch, stop, classify,
   cordon, release, the hand-over to the next DAG run, placement, launch, restore, one step.
   Target < 20 s (issue 58; `control_plane_vs_target`). `control_plane_phases_s`, from the
   attempt's `FailureReport`: `detect` (→ the health watch stopped the gang), `to_next_launch`
   (→ the next attempt's gang started: classify, cordon, release, the next DAG run, placement,
   launch) and `launch_to_first_step` (the new ranks' start, restore and first step).
4. **hang detection** — in the same stack, a second training run whose rank 1 stops making
   progress at step `--kill-at` (the trigger form's hang fault) under a `hangTimeout` of
   `--hang-timeout-s`: `hang_detect_s` = the job state's time to detect (last progress → the
   watcher's verdict), `hang_detect_over_timeout_s` = how much of it is beyond the timeout
   itself (the watcher's poll, the triggerer's scheduling). Tests assert only that a hang is
   declared no sooner than the timeout; this is where its latency is measured.

With `--cluster kube-sim` the job runs on the simulated Kubernetes of the tests
(`tests/support/kube`: an emulated API server with a minimal Volcano, three nodes that are
network namespaces running the pods as real processes) through a real embedded Airflow whose
launcher is the Volcano one; `"launcher": "kubernetes"`. Two failures in one run:
- once rank 0 reached `--kill-at`, rank 1's process inside its pod is SIGKILLed: torchrun's
  in-place restart on both pods (c10d rendezvous across the namespaces): `fast_path_mttr_s` =
  from the kill to the first step of the restarted workers, `fast_path_vs_bare` against the
  local bare restart + `dcp.load` (2.);
- once a checkpoint after that is committed, the link of a gang node goes down:
  `node_lost_mttr_s` = from the link going down to the first step of the next attempt, placed on
  the spare node (the health watch's missed polls or Kubernetes' NotReady, stop, classify,
  cordon, the hand-over, placement, a new Volcano Job, rendezvous across the namespaces,
  restore, one step). Kubernetes' own timings (`NODE_GRACE_S` 50 s to NotReady, `EVICTION_S`
  300 s to eviction) and a link that drops what is sent to the node — its kubelet and its node
  agent keep running behind it, unreachable — so the detectors race as on a real cluster:
  `node_lost_detector` says which ended the attempt (`health_watch`: its agent missed the
  polls; `kubernetes`: the node NotReady, its pod evicted) and `node_lost_detect_s` when.
`torchrun_restart_s`, `bare_restart_restore_s`, `restore_s` and `local_fast_path_mttr_s` are
the local runs' (1. and 2. still run); the local control-plane run is skipped.

With `--cluster kube-real` only a lost node is measured, on the REAL control plane
(`tests/support/kube/real_harness.py`: kube-apiserver, kube-controller-manager with its default
node-monitor grace and eviction, kube-scheduler, Kueue; three nodes, node agents behind their
links) with the Kueue launch path and the control plane's own token — driven in this process by
the health watch's loop, the stop (which fences the lost node: out-of-service taint once
Kubernetes marks it NotReady, then the pod GC) and the next attempt on the spare, not through
Airflow, and with the tiny all-reduce job (no checkpoint, so no restore) (`kube_real`):
`node_lost_mttr_s`, `node_lost_detector`, `node_lost_detect_s`, `kubernetes_not_ready_s` and
`node_lost_phases_s` (detect, stop_and_fence, next_attempt_first_step); then the same on a fresh
harness with the administrator's opt-out (`fence_lost_nodes: false`: the lost pods forced away),
`forced` and `fenced_vs_forced_mttr` (`--skip-forced`: not).

`steps_lost` is per path: the last step completed before the failure minus the step the
recovery resumed from; target ≤ `checkpoint_interval_steps`. (On the control-plane path the
injected GPU failure leaves the ranks running until the health watch stops them, and the
stop's SIGTERM commits an emergency checkpoint: usually nothing is lost there. A real Xid 79
kills the ranks on that GPU, and then up to one interval is.) Prints one JSON line, with
`cpu_count`, the 1-minute load average at the start (`load_1m`) and at the end (`load_avg_1m`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEMO = REPO / "config" / "jobs" / "demo-tiny-lm.yaml"
JOB = "recovery-bench"
RESTORED = re.compile(r"resumed from step (\d+) .* in ([0-9.]+)s")
RESTORED_FROM = re.compile(r"restored checkpoint step \d+ from file://(\S+)/MANIFEST\.json")


FAST_PATH_TARGET = 0.5
"""Issue 58: the fast path within half a bare torchrun restart + `dcp.load` of the same checkpoint."""
CONTROL_PLANE_TARGET_S = 20.0
"""Issue 58: through the recovery decision and a new attempt in under 20 s."""


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--bare-rank":  # one rank of the bare competitor
        return bare_rank(sys.argv[2])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kill-at", type=int, default=25, help="fail once rank 0 completed this step")
    p.add_argument("--interval", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--steps", type=int, default=50, help="max steps of each run")
    p.add_argument("--skip-control-plane", action="store_true", help="only the fast path and the bare restart")
    p.add_argument("--hang-timeout-s", type=int, default=10, help="the hang run's faultTolerance.hangTimeout")
    p.add_argument("--cluster", choices=("local", "kube-sim", "kube-real"), default="local",
                   help="kube-sim: a rank killed inside its pod, then a lost node, on the simulated Kubernetes; "
                        "kube-real: a lost node on the real control plane (both need root)")
    p.add_argument("--skip-forced", action="store_true",
                   help="kube-real: only the fenced stop, not also the opt-out's forced deletion")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out: dict[str, Any] = {"checkpoint_interval_steps": args.interval, "kill_at_step": args.kill_at}
    out.update(launcher="local", cpu_count=os.cpu_count(), load_1m=round(os.getloadavg()[0], 2))
    if args.cluster == "kube-real":
        with tempfile.TemporaryDirectory(prefix="bench-recovery-", dir="/var/tmp") as tmp:
            out = {"cluster": "kube-real", "launcher": "kubernetes", "queueing": "kueue",
                   "cpu_count": os.cpu_count(), "load_1m": out["load_1m"], **kube_real(Path(tmp) / "fenced")}
        if not args.skip_forced:
            with tempfile.TemporaryDirectory(prefix="bench-recovery-", dir="/var/tmp") as tmp:
                forced = kube_real(Path(tmp) / "forced", fence=False)
            out["forced"] = {k: forced[k] for k in ("node_lost_mttr_s", "node_lost_detect_s", "node_lost_phases_s")}
            out["fenced_vs_forced_mttr"] = round(out["node_lost_mttr_s"] / forced["node_lost_mttr_s"], 2)
        out["load_avg_1m"] = round(os.getloadavg()[0], 2)
        print(json.dumps(out))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        fast = fast_path(Path(tmp) / "fast", args)
        bare = bare_restart(Path(tmp) / "bare", args, fast["checkpoint"], fast["resumed_step"])
        out.update(restore_s=round(fast["restore_s"], 3), torchrun_restart_s=round(bare["to_process_group_s"], 2),
                   bare_restart_restore_s=round(bare["mttr_s"], 2), dcp_load_s=round(bare["dcp_load_s"], 3),
                   bare_phases_s=rounded(bare["phases"]), fast_path_phases_s=rounded(fast["phases"]))
        if args.cluster == "kube-sim":
            kube = kubernetes(Path(tmp) / "kube", args)
            out.update(launcher="kubernetes", nodes=kube["nodes"], fast_path_mttr_s=round(kube["fast_mttr_s"], 2),
                       fast_path_restore_s=round(kube["fast_restore_s"], 3),
                       fast_path_vs_bare=round(kube["fast_mttr_s"] / bare["mttr_s"], 2),
                       node_lost_mttr_s=round(kube["node_lost_mttr_s"], 2),
                       node_lost_detector=kube["node_lost_detector"],
                       node_lost_detect_s=round(kube["node_lost_detect_s"], 2),
                       node_grace_s=NODE_GRACE_S, eviction_s=EVICTION_S,
                       local_fast_path_mttr_s=round(fast["mttr_s"], 2),
                       steps_lost={"fast_path": kube["fast_steps_lost"], "node_lost": kube["node_steps_lost"]},
                       replaced_node=kube["replaced"])
            print(json.dumps(out))
            return 0
        control = None if args.skip_control_plane else control_plane(Path(tmp) / "control", args)
    out.update(fast_path_mttr_s=round(fast["mttr_s"], 2),
               control_plane_mttr_s=round(control["mttr_s"], 2) if control else None,
               control_plane_phases_s=rounded(control["phases"]) if control else None,
               hang_timeout_s=args.hang_timeout_s,
               hang_detect_s=round(control["hang_detect_s"], 2) if control else None,
               hang_detect_over_timeout_s=round(control["hang_detect_s"] - args.hang_timeout_s, 2)
               if control else None,
               steps_lost={"fast_path": fast["steps_lost"], "control_plane": control["steps_lost"] if control else None})
    out["fast_path_vs_bare"] = round(fast["mttr_s"] / bare["mttr_s"], 2)
    out["fast_path_vs_bare_target"] = FAST_PATH_TARGET
    out["control_plane_target_s"] = CONTROL_PLANE_TARGET_S
    out["control_plane_vs_target"] = round(control["mttr_s"] / CONTROL_PLANE_TARGET_S, 2) if control else None
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))
    return 0


def rounded(figures: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else round(v, 3) for k, v in figures.items()}


# --- common -----------------------------------------------------------------------------------


def spec(args: argparse.Namespace, *, checkpoints: bool = True) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(DEMO.read_text())
    data["metadata"]["name"] = JOB
    data["spec"]["training"]["maxSteps"] = args.steps
    data["spec"]["checkpoint"] = ({"intervalSteps": args.interval, "maxKeep": 100} if checkpoints else
                                  {"intervalSteps": None, "intervalMinutes": None, "maxKeep": 100})
    data["spec"]["faultTolerance"] = {"maxRestarts": 3, "inPlaceRestarts": 1, "hangTimeout": "2m"}
    return data


def use_home(home: Path) -> None:
    """Point this process (and its children) at a fresh Trainyard home with the demo dataset."""
    from trainyard.config.settings import Settings
    from trainyard.plugins.storage.store import open_store
    from trainyard.worker.demo_data import DEMO_PREFIX, prepare_demo_dataset

    home.mkdir(parents=True)
    os.environ["TRAINYARD_HOME"] = str(home)
    prepare_demo_dataset(open_store(Settings(home=home).object_store).child(DEMO_PREFIX.rstrip("/")))


def beat(heartbeat_dir: Path, rank: int) -> Any:
    from trainyard.plugins.run.heartbeat import Heartbeat, heartbeat_path

    try:
        return Heartbeat.model_validate_json(heartbeat_path(heartbeat_dir, rank).read_text())
    except (OSError, ValueError):
        return None


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 600, poll_s: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll_s)
    raise TimeoutError(f"benchmarks/recovery.py: no {what} after {timeout_s:g}s")


def live_handle(state: Any, attempt: int) -> Any:
    """The run handle of the benchmark job's live attempt `attempt`, once it is launched."""
    for info in state.list_runs(JOB):
        found = state.live_attempt(JOB, info.run)
        if found is not None and found.attempt == attempt and found.run_handle is not None:
            return found.run_handle
    return None


def kill_and_time_next_step(heartbeats: Callable[[], Path], kill_at: int) -> tuple[float, dict[str, Any]]:
    """SIGKILL rank 1 once rank 0 completed `kill_at`; (kill time, the first train heartbeat of
    a new rank-0 process after it, and when that process first wrote each phase: `start` once
    its process group is up, `restore` once its model is built)."""
    first = wait_for(f"rank 0 at step {kill_at}",
                     lambda: (b := beat(heartbeats(), 0)) is not None and b.step >= kill_at and b)
    victim = wait_for("rank 1's heartbeat", lambda: beat(heartbeats(), 1))
    last_step = (beat(heartbeats(), 0) or first).step
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    phases: dict[str, float] = {}

    def restarted() -> Any:
        b = beat(heartbeats(), 0)
        if b is None or b.pid == first.pid or b.time <= killed_at:
            return None
        phases.setdefault(b.phase, b.time)
        return b if b.phase == "train" else None

    nxt = wait_for("a step after the restart", restarted, poll_s=0.01)
    return killed_at, {"last_step": max(last_step, first.step), "next": nxt, "phases": phases}


# --- 1. fast path ---------------------------------------------------------------------------------


def fast_path(home: Path, args: argparse.Namespace) -> dict[str, Any]:
    from trainyard.config.cluster import cluster_for
    from trainyard.config.settings import Settings
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plans import plan_for_job
    from trainyard.plugins.attempt.conf import in_place_restarts
    from trainyard.plugins.attempt.reserve import place_and_reserve
    from trainyard.plugins.launch.environment import build_worker_env
    from trainyard.plugins.launch.local import LocalLauncher
    from trainyard.plugins.recovery.model import AttemptConf
    from trainyard.plugins.state.reservations import open_state

    use_home(home)
    settings = Settings(home=home)
    job = TrainingJob.model_validate(spec(args))
    cluster = cluster_for("cpu", "local")
    plan, _ = plan_for_job(job, cluster, memory_fraction=settings.memory_fraction)
    placement = place_and_reserve(job, plan, cluster, open_state(settings.state_db), run="bench-fast", attempt=0)
    env = build_worker_env(job, plan, settings, run="bench-fast", attempt=0, resume_from="", mlflow_run_id="")
    launcher = LocalLauncher(settings.runs_dir, source_dir=REPO,
                             max_restarts=in_place_restarts(job, AttemptConf(run="bench-fast")))
    handle = launcher.submit(job, plan, placement, env, attempt=0)
    killed_at, seen = kill_and_time_next_step(lambda: Path(handle.heartbeat_dir), args.kill_at)
    wait_for("the end of the run", lambda: launcher.poll(handle).finished, poll_s=0.5)
    status = launcher.poll(handle)
    if status.state != "succeeded":
        raise RuntimeError(f"fast-path run ended {status.state}: {status.message} (logs: {handle.run_dir})")
    run_dir = Path(handle.run_dir)
    log = (run_dir / "ranks" / "rank-00000.log").read_text()
    restored = RESTORED.findall(log)
    if not restored:
        raise RuntimeError(f"the restarted rank 0 logged no restore ({handle.run_dir}/ranks/rank-00000.log)")
    resumed_step, restore_s = int(restored[-1][0]), float(restored[-1][1])
    folders = RESTORED_FROM.findall(log)
    if not folders:
        raise RuntimeError(f"the restarted rank 0 named no local checkpoint folder ({run_dir}/ranks/rank-00000.log)")
    return {"mttr_s": seen["next"].time - killed_at, "restore_s": restore_s,
            "steps_lost": seen["last_step"] - resumed_step, "resumed_step": resumed_step,
            "checkpoint": Path(folders[-1]),
            "phases": fast_phases(run_dir, killed_at, seen, restore_s)}


def fast_phases(run_dir: Path, killed_at: float, seen: dict[str, Any], restore_s: float) -> dict[str, float | None]:
    """Where the fast path's time goes, from the run's own records: the old gang's teardown
    (kill → the last rank of the killed incarnation exited, `exits.jsonl`), torchrun's restart
    (→ the new rank-0 wrapper started, its `RankRecord`), the forked rank's start (→ its process
    group up: the `start` beat), the model build (→ `restore` beat), the restore itself (its log)
    and the first step after it. None where a beat was too short-lived to be seen."""
    exits = [json.loads(line) for line in (run_dir / "exits.jsonl").read_text().splitlines() if line.strip()]
    torn_down = max(e["ended_at"] for e in exits if e.get("restart") == 0)
    wrapper = json.loads((run_dir / "ranks" / "rank-00000.json").read_text())["started_at"]
    start, built = seen["phases"].get("start"), seen["phases"].get("restore")
    return {"teardown": torn_down - killed_at, "torchrun_restart": wrapper - torn_down,
            "fork_and_process_group": start - wrapper if start else None,
            "build_model": built - start if built and start else None,
            "restore": restore_s,
            "first_step": seen["next"].time - built - restore_s if built else None}


# --- 2. bare torchrun + dcp.load ------------------------------------------------------------------


def bare_restart(home: Path, args: argparse.Namespace, checkpoint: Path, resumed_step: int) -> dict[str, Any]:
    """The fair competitor: `torchrun --max-restarts 1` (the same c10d rendezvous and restart
    the launcher's agents use) running `bare_rank` — a plain script that imports torch and the
    same model, builds DDP and AdamW, `dcp.load`s the very checkpoint the fast path resumed from
    (no verification, no Trainyard session) and trains. Both incarnations load it; rank 1 is
    SIGKILLed 5 steps after the resume, and the restarted gang's first step is timed."""
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.launch.environment import TORCHRUN_ENV
    from trainyard.worker.models.llama import LlamaConfig

    home.mkdir(parents=True)
    hints = TrainingJob.model_validate(spec(args)).spec.parallelism.hints
    if hints is None:
        raise ValueError(f"{DEMO} has no parallelism.hints: the bare script needs the model's shape")
    model = dataclasses.asdict(LlamaConfig.from_hints(hints))
    heartbeats = home / "heartbeats"
    conf = {"model": model, "checkpoint": str(checkpoint), "heartbeats": str(heartbeats),
            "batch": hints.global_batch_size // 2, "seq_len": hints.sequence_length, "steps": resumed_step + 30}
    with socket_port() as port:
        pass  # free again for torchrun's rendezvous store
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr", "127.0.0.1",
           str(Path(__file__).resolve()), "--bare-rank", json.dumps(conf)]
    # Without TORCHRUN_ENV torchrun's own restart fails here (pytorch/pytorch#135712); both
    # launchers set it too.
    env = {**os.environ, **TORCHRUN_ENV}
    with (home / "torchrun.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        killed_at, seen = kill_and_time_next_step(lambda: heartbeats, resumed_step + 5)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"bare torchrun exited {proc.returncode} (log: {home / 'torchrun.log'})")
    timings = json.loads((heartbeats / "bare-rank0-restart1.json").read_text())
    phases = {"to_torch_imported": timings["imported_at"] - killed_at,
              "import_torch": timings["imported_at"] - timings["started_at"],
              "process_group": timings["pg_at"] - timings["imported_at"],
              "build_model": timings["built_at"] - timings["pg_at"],
              "dcp_load": timings["load_s"],
              "first_step": seen["next"].time - timings["loaded_at"]}
    return {"mttr_s": seen["next"].time - killed_at, "dcp_load_s": timings["load_s"],
            "to_process_group_s": timings["pg_at"] - killed_at, "phases": phases}


def bare_rank(conf_json: str) -> int:
    """One rank of the bare competitor (torchrun runs this file with `--bare-rank CONF`): what a
    user's own DCP script does, timed. Heartbeats in Trainyard's file format, so the same poller
    times both; synthetic batches of the demo's shape (the data stream is not what is compared)."""
    started_at = time.time()
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn.functional as F
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )
    from torch.nn.parallel import DistributedDataParallel

    from trainyard.worker.models.llama import Llama, LlamaConfig

    imported_at = time.time()
    conf = json.loads(conf_json)
    dist.init_process_group("gloo")
    rank, restart = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    heartbeats = Path(conf["heartbeats"])
    heartbeats.mkdir(parents=True, exist_ok=True)

    def write_beat(step: int, phase: str) -> None:
        path = heartbeats / f"rank-{rank:05d}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"job": JOB, "rank": rank, "pid": os.getpid(), "step": step,
                                   "time": time.time(), "phase": phase}))
        os.replace(tmp, path)

    pg_at = time.time()
    write_beat(0, "start")
    torch.manual_seed(42)
    model = DistributedDataParallel(Llama(LlamaConfig(**conf["model"])))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    built_at = time.time()
    write_beat(0, "restore")
    t0 = time.perf_counter()
    options = StateDictOptions(flatten_optimizer_state_dict=True)  # how the checkpoint was saved
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=conf["checkpoint"])
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=options)
    load_s, loaded_at = time.perf_counter() - t0, time.time()
    start = int(Path(conf["checkpoint"]).name.split("-")[-1]) + 1
    vocab = conf["model"]["vocab_size"]
    for step in range(start, conf["steps"] + 1):
        tokens = torch.randint(0, vocab, (conf["batch"], conf["seq_len"] + 1))
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        write_beat(step, "train")
        if step == start and rank == 0:
            (heartbeats / f"bare-rank0-restart{restart}.json").write_text(json.dumps({
                "started_at": started_at, "imported_at": imported_at, "pg_at": pg_at, "built_at": built_at,
                "load_s": load_s, "loaded_at": loaded_at}))
    dist.destroy_process_group()
    return 0


class socket_port:
    """A free local port (closed again before torchrun takes it)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


# --- 3. control plane ----------------------------------------------------------------------------


def control_plane(home: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tests.e2e.airflow_stack import running_stack
    from tests.support.node_agents import node_agents
    from trainyard.node_agent.client import inject_fault
    from trainyard.node_agent.models import FaultRequest
    from trainyard.plugins.state.jobs import JobStateStore

    with node_agents(("local-0", "local-1"), home / "runs", home.parent / "agents") as agents, \
            running_stack(home, agents=agents) as stack:
        stack.add_jobs({JOB: spec(args)}, timeout_s=180)
        first = stack.client.trigger(JOB, {})["dag_run_id"]
        state = JobStateStore(stack.settings.state_db)

        handle = wait_for("attempt 0's gang", lambda: live_handle(state, 0), poll_s=0.5)
        beats0 = Path(handle.heartbeat_dir)
        wait_for(f"rank 0 at step {args.kill_at}",
                 lambda: (b := beat(beats0, 0)) is not None and b.step >= args.kill_at and b)
        last_step = beat(beats0, 0).step
        failed_at = time.time()
        inject_fault(agents[handle.nodes[0]], FaultRequest(gpu=0, xid=79, reason="benchmarks/recovery.py"))
        handle1 = wait_for("attempt 1's gang", lambda: live_handle(state, 1), poll_s=0.2)
        beats1 = Path(handle1.heartbeat_dir)
        nxt = wait_for("attempt 1's first step",
                       lambda: (b := beat(beats1, 0)) is not None and b.phase == "train" and b)
        report = state.attempts(JOB, handle.run)[0].failure_report
        from trainyard.plugins.airflow_api import follow_training_run

        follow_training_run(stack.client, JOB, first, timeout_s=600)
        # The injected fault does not kill the ranks (a real Xid 79 would): they train on
        # until the health watch stops the gang, and that stop's SIGTERM commits an emergency
        # checkpoint. So the steps lost are the job state's (last step reached − resume step).
        if report is None or report.steps_lost is None:
            raise RuntimeError(f"attempt 0 of run {handle.run} recorded no steps lost: {report}")
        resumed_at = report.resumed_at.timestamp() if report.resumed_at else None
        phases = {"detect": report.detected_at.timestamp() - failed_at,
                  "to_next_launch": resumed_at - report.detected_at.timestamp() if resumed_at else None,
                  "launch_to_first_step": nxt.time - resumed_at if resumed_at else None}
        return {"mttr_s": nxt.time - failed_at, "steps_lost": report.steps_lost, "phases": phases,
                "failed_at_step": last_step, "resumed_from_step": report.resume_step,
                "hang_detect_s": hang_detection(stack, args)}


def hang_detection(stack: Any, args: argparse.Namespace) -> float:
    """Seconds from the hung rank's last progress to the watcher's verdict (the job state's
    `time_to_detect_s` of the hang attempt)."""
    from trainyard.plugins.airflow_api import follow_training_run
    from trainyard.plugins.state.jobs import JobStateStore

    name = f"{JOB}-hang"
    doc = spec(args)
    doc["metadata"]["name"] = name
    doc["spec"]["faultTolerance"]["hangTimeout"] = f"{args.hang_timeout_s}s"
    stack.add_jobs({name: doc}, timeout_s=180)
    first = stack.client.trigger(name, {"fault_hang_rank": 1, "fault_hang_at_step": args.kill_at})["dag_run_id"]
    attempts = follow_training_run(stack.client, name, first, timeout_s=600)
    report = JobStateStore(stack.settings.state_db).attempts(name, attempts[0].run)[0].failure_report
    if report is None or report.outcome != "hang" or report.time_to_detect_s is None:
        raise RuntimeError(f"the hang run's first attempt was not a detected hang: {report}")
    return report.time_to_detect_s


# --- 5. Kubernetes (the simulated cluster) ---------------------------------------------------------


NODE_GRACE_S = 50.0
"""kube-controller-manager's `--node-monitor-grace-period` default (Kubernetes 1.37)."""
EVICTION_S = 300.0
"""The `not-ready`/`unreachable` tolerations DefaultTolerationSeconds gives every pod."""


def detector(report: Any) -> str:
    """Which detector ended the attempt of a lost node: the health watch (its agent missed
    `MISSED_HEARTBEATS_LOST` polls: the report says so) or Kubernetes (the node NotReady, its
    pod evicted)."""
    from trainyard.plugins.run.rules import MISSED_HEARTBEATS_LOST

    return "health_watch" if f"missed {MISSED_HEARTBEATS_LOST} heartbeats" in report.reason else "kubernetes"


def kubernetes(home: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A rank killed inside its pod once rank 0 reached `--kill-at` (torchrun's fast path on
    both pods), then a gang node's link down once a checkpoint after the restart is committed;
    the times are the ranks' heartbeats, which each node keeps in its own hostPath folder."""
    from tests.e2e.airflow_stack import running_stack
    from tests.support.kube.harness import NODES_WITH_SPARE, KubeHarness
    from trainyard.plugins.checkpoint.catalog import list_checkpoints
    from trainyard.plugins.launch.environment import checkpoint_uri
    from trainyard.plugins.launch.gang_pods import gang_pods, gang_tasks
    from trainyard.plugins.state.jobs import JobStateStore

    doc = spec(args)
    doc["spec"]["image"] = "registry.example.com/trainyard/demo:1"  # the nodes run this checkout's venv
    # long enough for the restart, a checkpoint after it, the lost node and a few steps after it
    doc["spec"]["training"]["maxSteps"] = max(args.steps, args.kill_at + 5 * args.interval)
    # Kubernetes' own timings (v1.37: a node is NotReady 50 s after its last status, its pods
    # evicted 300 s after that, the DefaultTolerationSeconds); the lost node's link drops what is
    # sent to it, its node agent still running behind it (`KubeHarness.lose_node`)
    with KubeHarness(home / "kube", NODES_WITH_SPARE, node_grace_s=NODE_GRACE_S, eviction_s=EVICTION_S) as kube, \
            running_stack(home / "home", overrides=kube.airflow_overrides(home), agents=kube.node_agents) as stack:
        stack.add_jobs({JOB: doc}, timeout_s=180)
        first = stack.client.trigger(JOB, {})["dag_run_id"]
        state = JobStateStore(stack.settings.state_db)
        handle = wait_for("attempt 0's Volcano Job", lambda: live_handle(state, 0), poll_s=0.5)
        # its pods in node-rank order (c10d's order of their DNS names, not their indexes)
        pods = gang_pods(handle.name, gang_tasks([handle.ranks_per_node] * len(handle.nodes)))

        def beat_of(attempt: int, rank: int) -> Any:
            found = [b for node in kube.nodes.values()
                     if (b := beat(Path(node.heartbeat_dir, JOB, handle.run, str(attempt)), rank)) is not None]
            return max(found, key=lambda b: b.time, default=None)

        # 1. the fast path: rank 1's process dies, both pods' torchrun start a new round
        before = wait_for(f"rank 0 at step {args.kill_at}",
                          lambda: (b := beat_of(0, 0)) is not None and b.step >= args.kill_at and b)
        killed_at = time.time()
        kube.kill_rank(pods[1 // handle.ranks_per_node])
        fast_last = max(b.step for rank in (0, 1) if (b := beat_of(0, rank)) is not None)
        restarted = wait_for("a step after the in-place restart",
                             lambda: (b := beat_of(0, 0)) is not None and b.pid != before.pid
                             and b.phase == "train" and b.time > killed_at and b)
        log = (kube.pod_dir(pods[0]) / "trainer.log").read_text(errors="replace")
        restored = RESTORED.findall(log)
        if not restored:
            raise RuntimeError(f"the restarted rank 0 logged no restore:\n{log[-3000:]}")
        # 2. the lost node, once a checkpoint after the restart is committed
        from trainyard.config.spec import TrainingJob

        root = checkpoint_uri(TrainingJob.model_validate(doc), stack.settings.object_store, handle.run)
        wait_for(f"a checkpoint after step {restarted.step}",
                 lambda: any(c.step > restarted.step for c in list_checkpoints(root)), poll_s=0.5)
        node = sorted(handle.nodes)[-1]
        lost_at = time.time()
        kube.lose_node(node)
        handle1 = wait_for("attempt 1's Volcano Job", lambda: live_handle(state, 1), poll_s=0.2)
        after = wait_for("attempt 1's first step", lambda: (b := beat_of(1, 0)) is not None and b.phase == "train" and b)
        from trainyard.plugins.airflow_api import follow_training_run

        attempts = follow_training_run(stack.client, JOB, first, timeout_s=600)
        if attempts[-1].outcome != "completed":
            raise RuntimeError(f"the Kubernetes run ended {attempts[-1]}\n{stack.logs()}")
        report = state.attempts(JOB, handle.run)[0].failure_report
        if report is None or report.resume_step is None:
            raise RuntimeError(f"attempt 0 of run {handle.run} recorded no resume step: {report}")
        if report.restarts_in_place < 1:
            raise RuntimeError(f"attempt 0 of run {handle.run} counted no in-place restart: {report}")
        # the report of a lost node has no step (no rank exited to say it): the ranks' heartbeats do
        reached = max(b.step for rank in (0, 1) if (b := beat_of(0, rank)) is not None)
        return {"nodes": len(NODES_WITH_SPARE), "fast_mttr_s": restarted.time - killed_at,
                "fast_restore_s": float(restored[-1][1]), "fast_steps_lost": fast_last - int(restored[-1][0]),
                "node_lost_mttr_s": after.time - lost_at, "node_steps_lost": reached - report.resume_step,
                "node_lost_detector": detector(report), "node_lost_detect_s": report.detected_at.timestamp() - lost_at,
                "replaced": [node, sorted(set(handle1.nodes) - set(handle.nodes))]}


# --- 6. a lost node on the real control plane ------------------------------------------------------


def kube_real(folder: Path, *, fence: bool = True) -> dict[str, Any]:
    """A lost node on `RealKubeHarness` (kube-apiserver, kube-controller-manager with its DEFAULT
    node-monitor grace and eviction, kube-scheduler, Kueue; three nodes, node agents behind their
    links), driven in this process by the control plane's own steps — Airflow is not wired to the
    real harness here: the health watch's loop (`HealthTrigger`'s: the launcher's status, then
    `watching.lost_nodes` every `poll_interval_s`), the stop (`KubernetesLauncher.stop`: its
    out-of-service fencing waits for Kubernetes' NotReady and the pod GC), the next attempt on
    the spare node (admitted by Kueue within the team's quota of one gang), its first step.

    The gang is `tests/integration/launch/tiny_job.py` (a gloo all-reduce a step, no checkpoint:
    no restore is in the figure). `node_lost_mttr_s` = from the link going down to the next
    attempt's first step (its rank 0's log line, polled every 0.2 s); `node_lost_detector` =
    which verdict came first: `health_watch` (its agent missed `MISSED_HEARTBEATS_LOST` polls) or
    `kubernetes` (the node's Ready condition left True: its `lastTransitionTime`). `fence=False`:
    the administrator's opt-out (`fence_lost_nodes: false`), the lost pods forced away at once —
    the same run's competitor, what fencing costs."""
    import inspect
    import shutil
    from datetime import datetime

    from tests.support.kube.harness import NODES_WITH_SPARE
    from tests.support.kube.jobs import placed, tiny_job
    from tests.support.kube.real_harness import RealKubeHarness
    from tests.support.kube.tenant import control_plane_launcher, trainer_log
    from trainyard.config.cluster import Cluster, load_cluster
    from trainyard.config.teams import Team, Teams
    from trainyard.plugins.attempt import watching
    from trainyard.sensors.triggers import HealthTrigger

    poll_s = inspect.signature(HealthTrigger).parameters["poll_interval_s"].default
    teams, namespace, run = Teams(teams={"demo": Team(share=1.0, quota_gpus=2)}), "team-demo", "r-bench"
    data: dict[str, Any] = load_cluster("kube-sim").model_dump(by_alias=True, exclude_none=True)
    data["spec"]["racks"][0]["nodes"][0]["count"] = len(NODES_WITH_SPARE)
    cluster, spare = Cluster.model_validate(data), NODES_WITH_SPARE[-1]
    folder.mkdir(parents=True)
    folder.parent.chmod(0o711)
    folder.chmod(0o711)  # the pods (uid 1000) reach their volumes under it
    with RealKubeHarness(folder / "kube", NODES_WITH_SPARE, node_agents=True) as kube:
        launcher = control_plane_launcher(kube, teams, delete_timeout_s=600)
        launcher.options = launcher.options.model_copy(update={"fence_lost_nodes": fence})

        def first_step(handle: Any, pod_name: Callable[[Any], str]) -> Any:
            status = launcher.poll(handle)
            return status if status.state == "running" and len(status.nodes) == 2 and all(
                "step 1" in trainer_log(kube, pod_name(a), namespace) for a in status.agents) else None

        parts = placed(tiny_job("bench-lost", ["--steps", "100000", "--sleep", "0.2"]), kube.root / "home", run=run,
                       cluster=cluster, exclude=frozenset({spare}))
        handle = launcher.submit(*parts.submit_args(), attempt=0)
        running = wait_for("attempt 0 training", lambda: first_step(handle, lambda a: a.pod), 180, 0.5)
        handle = handle.bound(running)
        node = sorted(running.nodes)[-1]
        time.sleep(2 * poll_s)  # the health watch has seen every agent answer
        lost_at = time.time()
        kube.lose_node(node)
        misses: dict[str, int] = {}
        answered: dict[str, float] = {}
        agents = launcher.node_agents(handle)  # the DaemonSet's pods, at their Nodes' addresses
        with kube.reaching_nodes():
            while True:  # HealthTrigger's loop
                started = time.monotonic()
                status = launcher.poll(handle)
                if status.finished:
                    raise RuntimeError(f"the gang ended before the health watch saw the lost node: {status.message}")
                lost = watching.lost_nodes(handle, agents, misses=misses, answered=answered)
                if lost:
                    break
                time.sleep(max(0.0, poll_s - (time.monotonic() - started)))
        detected_at = time.time()
        reason = watching.node_lost_stop(lost, misses=misses, answered=answered)
        stopped = launcher.stop(handle, grace_s=10, lost_nodes=reason.nodes)
        stopped_at = time.time()
        if stopped.processes_alive:
            raise RuntimeError(f"the stop did not end the gang: {stopped.message}\n{kube.diagnostics()}")
        ready = next(c for c in kube.rest().get("v1", "nodes", None, node)["status"]["conditions"]
                     if c["type"] == "Ready")
        not_ready_at = (datetime.fromisoformat(ready["lastTransitionTime"].replace("Z", "+00:00")).timestamp()
                        if ready["status"] != "True" else None)
        parts = placed(tiny_job("bench-lost", ["--steps", "100000", "--sleep", "0.2"]), kube.root / "home", run=run,
                       attempt=1, cluster=cluster, exclude=frozenset(reason.nodes))
        handle1 = launcher.submit(*parts.submit_args(), attempt=1)
        submitted_at = time.time()
        after = wait_for("attempt 1's first step", lambda: first_step(handle1, lambda a: a.pod), 300, 0.2)
        stepped_at = time.time()
        launcher.stop(handle1, grace_s=0)
        shutil.rmtree(kube.root / "home", ignore_errors=True)
    health_s = detected_at - lost_at
    kube_s = None if not_ready_at is None else not_ready_at - lost_at
    return {"nodes": len(NODES_WITH_SPARE), "node_lost_mttr_s": round(stepped_at - lost_at, 2),
            "node_lost_detector": "kubernetes" if kube_s is not None and kube_s < health_s else "health_watch",
            "node_lost_detect_s": round(health_s, 2),
            "kubernetes_not_ready_s": None if kube_s is None else round(kube_s, 2),
            "node_lost_phases_s": {"detect": round(health_s, 2), "stop_and_fence": round(stopped_at - detected_at, 2),
                                   "next_attempt_first_step": round(stepped_at - submitted_at, 2)},
            "stop_message": stopped.message, "health_poll_s": poll_s,
            "node_grace_s": NODE_GRACE_S, "eviction_s": EVICTION_S, "link": "down (drops every packet)",
            "replaced_node": [node, sorted(set(after.nodes) - set(running.nodes))]}


if __name__ == "__main__":
    sys.exit(main())
