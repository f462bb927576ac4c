"""`classify(evidence) -> FailureReport`: how one attempt ended, with the facts behind it.

One failure often shows several symptoms at once: a node that loses a GPU makes its ranks
crash (or hang, or produce NaNs), and the launcher's stop after a hang kills every rank with
SIGTERM. So the classes are tried in a fixed order and the first that holds wins; the
symptoms of the others still appear in the report's evidence lines.

Precedence (first match wins):

1. **completed** — every rank exited 0. Work done is done, whatever happens to a node after.
2. **cancelled** — the gang was stopped on purpose: `stop-reason.json` says `requested` or
   `timeout`, or the launcher was stopped with no reason recorded (`trainyard stop`, Ctrl-C).
   A person's stop wins over any failure: never restart what a user stopped.
3. **preempted** (by the platform) — the control plane stopped it because its reservation
   lease was lost (`lease_lost`), or evicted it for a higher-priority gang (`preempted`, after
   SIGTERM gave it an emergency checkpoint): not the job's fault. Likewise a gang the cluster's
   queue took back (`RunStatus.evicted`: Kueue's preemption or a stopped queue, its cause in
   Kueue's words, `KUEUE_REQUEUED`) — a Workload a person deactivated is *cancelled* instead, one
   Kueue evicted for a failed node *node_lost*, and one whose pods were not ready in Kueue's
   time (or that Kueue gave up requeuing) a *worker_crash* that counts against the budget.
4. **node_lost** — a node of the gang has a fatal verdict (`gpu_failed`, `node_unhealthy`),
   its agent missed `MISSED_HEARTBEATS_LOST` heartbeats, or the health watcher stopped the
   gang (`node_lost`, with the nodes it names). Above every rank-level class: their symptoms are its effects.
5. **checkpoint_corrupt** — exit `CHECKPOINT_CORRUPT`, the worker's record, or a restore
   verification error in the failing rank's log: the attempt never trained, restarting the
   same way fails the same way.
6. **oom** — exit `OOM`, or an out-of-memory line in a failed rank's log.
7. **diverged** — exit `DIVERGED` (the onset from `diverged.json`).
8. **preempted** — exit `PREEMPTED` / `PREEMPTED_NO_CHECKPOINT` without a stop by a user: a
   SIGTERM from outside (a spot notice, a node drain).
9. **hang** — the hang watcher stopped the gang (`hang`), or a rank is flagged `hung`; the
   report blames the ranks `hung_ranks` names (the frozen or lagging ones), not the
   whole gang that stalled behind them.
10. **user_error** — the script failed before training, the same way on every failed rank: a
    start-up error line (`STARTUP_ERROR`: ModuleNotFoundError, SyntaxError, a missing
    file, an argument its parser refuses), a plain exit code (no signal), no step reached. Not
    retried: restarting the same code on the same inputs cannot help.
11. **worker_crash** — any other failure (non-zero exit, a signal, a torchrun agent that died).

A stop that came *after* a rank had already failed only cleaned up (the launcher reports the
run `failed`, not `stopped`): then the rank's failure is the cause (rules 8–10), except for a
user's stop (rule 2).

Every rule lives in this file, the readings of the evidence they rest on included (what a stop
means, which node verdicts are fatal, which log lines mean OOM, a corrupt restore or a start-up
error, the first failure, the in-place restarts, a hang's culprits): `Evidence` only holds the
observations. The health watcher (`plugins/attempt/watching.py`) judges nodes with the same
`node_fatal_reasons`. Pure: no files, no network, no database.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

from trainyard.plugins.errors import FatalError
from trainyard.plugins.recovery.evidence import Evidence, NodeObservation
from trainyard.plugins.recovery.model import LOG_TAIL_SHOWN, FailureReport, Outcome
from trainyard.plugins.run import exit_codes
from trainyard.plugins.run.exit_codes import describe
from trainyard.plugins.run.heartbeat import FROZEN_AFTER
from trainyard.plugins.run.model import stillness
from trainyard.plugins.run.records import RankRecord
from trainyard.plugins.run.rules import MISSED_HEARTBEATS_LOST, hang_culprits, stalled_ranks

PREEMPTED_CODES = (exit_codes.PREEMPTED, exit_codes.PREEMPTED_NO_CHECKPOINT)

OOM_PATTERNS = (re.compile(r"torch\.OutOfMemoryError"), re.compile(r"CUDA out of memory"),
                re.compile(r"torch\.cuda\.OutOfMemoryError"))
"""Log lines that mean the device ran out of memory (a rank may die of it without reaching
the worker's `stop_on_oom`, e.g. during restore or in user code outside the loop)."""

CORRUPT_PATTERNS = (re.compile(r"NoValidCheckpointError"), re.compile(r"does not verify"))
"""Log lines that mean a restore target failed verification."""

STARTUP_ERROR = re.compile(
    r"\b(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|NameError|FileNotFoundError): "
    r"|: error: (unrecognized arguments|the following arguments are required|argument )")
"""A failure of the script itself before it trains: a missing module, a syntax error, a missing
input file, arguments its parser refuses. The same code and inputs fail the same way again."""

_ERROR_LINE = re.compile(r"(Error|Exception|error:|Traceback|Killed|out of memory)", re.I)

STOP_CAUSES_CANCEL = ("requested", "timeout")
"""`StopReason.reason`s that end the run on purpose: nothing to recover. (A stop without a
`stop-reason.json` counts as `requested`.)"""

FATAL_VERDICTS = ("gpu_failed", "node_unhealthy")
"""Node-agent verdicts that lose the node for this attempt (a thermal warning does not)."""


class AttemptStillRunning(FatalError):
    """`classify` was asked about an attempt that is still running and shows no failure."""


def classify(ev: Evidence) -> FailureReport:
    """The verdict on one attempt (see the module docstring for the order of the rules)."""
    status = ev.status
    facts = _facts(ev)
    stop_cause = stop_cause_of(ev)
    why_stopped = ev.stop_reason.detail if ev.stop_reason is not None else ""
    stopped = status.state == "stopped"
    first = _first_failed(ev)
    code = first[1] if first else status.exit_code
    tail = ev.log_tails.get(first[0], "") if first else ""

    def report(outcome: Outcome, reason: str, **extra: object) -> FailureReport:
        fields: dict = {"rank": first[0] if first else None, "node": _node_of(ev, first[0]) if first else None,
                        "exit_code": code, "log_line": telling_line(tail) if tail else "",
                        "log_tail": [ln[:500] for ln in tail.rstrip().splitlines()[-LOG_TAIL_SHOWN:]] if tail else [],
                        "step": status.step if status.step is not None else _min_step(ev),
                        "restarts_in_place": restarts_in_place(ev), "started_at": ev.started_at,
                        "ended_at": ev.ended_at or _ended(ev), **_timing(ev, outcome, first), **extra}
        return FailureReport(job=ev.job, run=ev.run, attempt=ev.attempt, outcome=outcome, reason=reason,
                             evidence=facts, **fields)

    if status.state == "succeeded":
        return report("completed", status.message or "every rank completed")
    if stop_cause in STOP_CAUSES_CANCEL:
        return report("cancelled", f"stopped on request ({why_stopped or stop_cause})")
    if stop_cause == "lease_lost":
        return report("preempted", f"stopped by the platform, its reservation lost: {why_stopped}")
    if stop_cause == "preempted":
        codes = {r.exit_code for r in status.ranks}
        saved = ("emergency checkpoint committed" if exit_codes.PREEMPTED in codes
                 else "no emergency checkpoint: resumes from the newest one")
        return report("preempted", f"preempted by the platform: {why_stopped} ({saved})")
    eviction = kueue_eviction(status.evicted)
    if eviction == "requeued":
        codes = {r.exit_code for r in status.ranks}
        saved = ("emergency checkpoint committed" if exit_codes.PREEMPTED in codes
                 else "no emergency checkpoint: resumes from the newest one"
                 if exit_codes.PREEMPTED_NO_CHECKPOINT in codes else "resumes from the run's newest checkpoint")
        return report("preempted", f"preempted by Kueue: {status.evicted} ({saved})")
    if eviction == "deactivated":
        return report("cancelled", f"stopped in Kueue, its Workload deactivated: {status.evicted}")

    lost = {o.node: node_fatal_reasons(o) for o in ev.nodes if o.node in ev.gang_nodes or not ev.gang_nodes}
    lost = {node: why for node, why in lost.items() if why}
    # Kubernetes saw it first: a pod of the gang on a node that is not Ready (evicted by the
    # NoExecute taint, or gone with its node) — the node is lost, whatever the rank's exit says
    not_ready = sorted({a.node for a in status.agents if a.node and a.node_ready is False and not stopped})
    if lost or stop_cause == "node_lost" or not_ready or eviction == "node_failures":
        why = ("; ".join(r for rs in lost.values() for r in rs) or why_stopped
               or (f"Kueue evicted the gang: {status.evicted}" if eviction == "node_failures" else "")
               or f"node(s) not Ready: {', '.join(not_ready)} ({status.message})")
        named = ev.stop_reason.nodes if ev.stop_reason is not None and stop_cause == "node_lost" else []
        return report("node_lost", f"node lost: {why}", failed_nodes=sorted({*lost, *named, *not_ready}))

    # before the ranks' exits: Kueue's SIGTERM gives them exit 43, which alone reads as a preemption —
    # requeued outside the budget, a gang that never gets ready would come back for ever
    if eviction == "not_started":
        return report("worker_crash", f"the gang did not start: Kueue evicted it: {status.evicted}")
    if not status.finished and not _hung(ev):
        raise AttemptStillRunning(f"attempt {ev.attempt} of {ev.job} is {status.state} "
                                  f"({status.message}): nothing to classify yet")

    corrupt_line = find_line(tail, CORRUPT_PATTERNS) if tail else ""
    if code == exit_codes.CHECKPOINT_CORRUPT or ev.checkpoint_corrupt is not None or corrupt_line:
        record = ev.checkpoint_corrupt
        uri = (record.resume_from if record else "") or ev.resume_from
        why = (record.reason if record else "") or corrupt_line or "the checkpoint to restore does not verify"
        return report("checkpoint_corrupt", f"restore failed: {why}", corrupt_checkpoint=uri)

    oom_line = next((line for t in ev.log_tails.values() if (line := find_line(t, OOM_PATTERNS))), "")
    if code == exit_codes.OOM or oom_line:
        return report("oom", f"{_who(ev, first)} ran out of device memory"
                             f"{_at(ev)}: {oom_line or describe(code)}", log_line=oom_line or telling_line(tail))

    if code == exit_codes.DIVERGED or (ev.diverged is not None and ev.diverged.attempt == ev.attempt):
        d = ev.diverged
        if d is None:
            return report("diverged", f"{_who(ev, first)} exited diverged, but no diverged.json says "
                                      "where the divergence began")
        return report("diverged", f"diverged: {d.message or d.reason} (onset step {d.onset_step})",
                      onset_step=d.onset_step, step=d.step)

    if code in PREEMPTED_CODES and not stopped:
        saved = "emergency checkpoint committed" if code == exit_codes.PREEMPTED else "no emergency checkpoint"
        return report("preempted", f"{_who(ev, first)} got SIGTERM from outside the platform ({saved})")

    hung = [r for r in status.ranks if r.hung]
    if (stopped and stop_cause == "hang") or (hung and first is None):
        ranks = hung_ranks(ev)  # the ones to blame, not every rank that waited for them
        blamed = next((r for r in hung if r.rank in ranks), hung[0] if hung else None)
        if stop_cause == "hang" and why_stopped:
            detail = why_stopped
        elif blamed is not None:
            detail = f"rank {blamed.rank} {stillness(blamed.signal)} for {blamed.heartbeat_age_s or 0:.0f} s"
        else:
            detail = "the hang watcher stopped the gang"
        rank = ranks[0] if ranks else None
        return report("hang", f"hang: {detail}" + (f" (hung ranks {ranks})" if ranks else ""),
                      rank=rank, node=_node_of(ev, rank) if rank is not None else None)

    if stopped:  # a platform stop with a cause this engine does not know: report it, as a crash
        return report("worker_crash", f"stopped by the platform ({stop_cause}): {why_stopped}")
    startup = _startup_error(ev, first, tail)
    if startup:
        return report("user_error", f"{_who(ev, first)} failed before training: {startup}", log_line=startup)
    return report("worker_crash", _crash_reason(ev, first, tail))


# --- readings of the evidence -----------------------------------------------------------------


KUEUE_REQUEUED = ("Preempted", "ClusterQueueStopped", "LocalQueueStopped", "AdmissionCheck",
                  "EvictedOnManagerCluster")
"""Kueue's eviction reasons (its `Evicted` condition's, `kueue.x-k8s.io/v1beta2` v0.17) that take a
running gang back for the cluster's sake — a higher priority, a queue an administrator stopped, an
admission check withdrawn, MultiKueue's manager: requeued outside the restart budget, to wait in
its queue (with Kueue's reason) until it is admitted again."""
KUEUE_DEACTIVATED = "Deactivated"
"""The Workload's `spec.active` set false by a person — Kueue's documented way to stop a workload:
never restarted. Kueue's own deactivations carry a cause (`DeactivatedDueToRequeuingLimitExceeded`:
the gang failed to start too often) and are a failure to start, as `PodsReadyTimeout` is."""
KUEUE_NOT_STARTED = ("PodsReadyTimeout", f"{KUEUE_DEACTIVATED}DueTo")
KUEUE_NODE_FAILURES = "NodeFailures"
"""Topology-aware scheduling's eviction of a gang on a failed node: the node is lost."""


def kueue_eviction(cause: str | None) -> str:
    """What Kueue's eviction (`RunStatus.evicted`: its reason first, as `kueue_queues.eviction_cause`
    words it) means for the attempt: `requeued` (the cluster took it back), `deactivated` (a person
    stopped it), `not_started` (its pods were not ready in time, or Kueue gave up requeuing it),
    `node_failures`, or '' (no eviction). A reason Kueue adds later reads as `requeued` — the
    cluster's doing — and says its name in the reason."""
    if not cause:
        return ""
    reason = re.split(r"[\s:(]", cause, maxsplit=1)[0]
    if reason == KUEUE_DEACTIVATED:
        return "deactivated"
    if reason.startswith(KUEUE_NOT_STARTED):
        return "not_started"
    if reason == KUEUE_NODE_FAILURES:
        return "node_failures"
    return "requeued"


def stop_cause_of(ev: Evidence) -> str | None:
    """None when nobody stopped the gang; else `StopReason.reason` (`requested` when the
    launcher was stopped without a recorded reason: a person's stop, a Ctrl-C). A stop with
    no reason on an attempt that had already failed is the launcher's clean-up of the
    failed gang (`LocalLauncher.settle`), not a request: None."""
    if ev.stop_reason is not None:
        return ev.stop_reason.reason
    return "requested" if ev.stop is not None and ev.status.state == "stopped" else None


def restarts_in_place(ev: Evidence) -> int:
    """torchrun's restarts inside this attempt that ran the script again (the fast path): the
    highest restart count any rank reached, leaving out incarnations that only replayed a
    control-plane exit (`RankRecord.replayed`). On Kubernetes a stopped Job takes its pods'
    exit records with it; the ranks' heartbeats, served by the node agents, still say."""
    replayed = {e.restart for e in ev.exits if e.replayed}
    counts = ([r.restart for r in ev.status.ranks] + [e.restart for e in ev.exits]
              + [b.restart for b in ev.served_beats])
    return max((c for c in counts if c not in replayed), default=0)


def hung_ranks(ev: Evidence) -> list[int]:
    """The ranks a hang blames. A hang stop names them (`stop-reason.json`, judged when the
    watcher stopped the gang). Else, of the ranks the launcher flags `hung` (every rank of a
    gang stalls once one does), those `trainyard.plugins.run.rules.hang_culprits` blames: the
    frozen ones, judged at the status's time, else the laggards."""
    if ev.stop_reason is not None and ev.stop_reason.reason == "hang" and ev.stop_reason.ranks:
        return list(ev.stop_reason.ranks)
    at, timeout = ev.status.updated_at.timestamp(), ev.hang_timeout_s
    frozen = {} if timeout is None else {rank: at - alive > FROZEN_AFTER * timeout
                                         for rank, alive in ev.last_alive.items()}
    return hang_culprits(stalled_ranks(ev.status.ranks, frozen))


def first_failure(ev: Evidence) -> RankRecord | None:
    """The earliest non-zero exit of the attempt's last incarnation (torchrun restarts
    before it were recovered in place)."""
    last = restarts_in_place(ev)
    failed = [e for e in ev.exits if e.exit_code not in (None, 0) and e.restart == last]
    return min(failed, key=lambda e: e.ended_at or 0.0) if failed else None


def node_fatal_reasons(observation: NodeObservation, *, max_misses: int = MISSED_HEARTBEATS_LOST) -> list[str]:
    """Why this node is lost, one line each; empty when it is fine. The health watcher stops a
    gang on the same judgement (`plugins/attempt/watching.py`)."""
    o = observation
    reasons = []
    if o.missed_heartbeats >= max_misses:
        detail = f": {o.error}" if o.error else ""
        reasons.append(f"node agent on {o.node} missed {o.missed_heartbeats} heartbeats{detail}")
    if o.health is not None:
        for v in o.health.verdicts:
            if v.kind in FATAL_VERDICTS:
                gpu = f" GPU {v.gpu}" if v.gpu is not None else ""
                xid = f" (Xid {v.xid})" if v.xid is not None else ""
                reasons.append(f"{o.node}{gpu}: {v.kind}{xid}: {v.reason}")
    return reasons


def find_line(text: str, patterns: Iterable[re.Pattern[str]]) -> str:
    """The last line of `text` that matches one of `patterns`, stripped ('' when none)."""
    for line in reversed(text.splitlines()):
        if any(p.search(line) for p in patterns):
            return line.strip()
    return ""


def telling_line(text: str) -> str:
    """The line a person should read first: the last error-looking line ('' when none — the
    last ordinary line of a killed rank says nothing about why it died)."""
    return find_line(text, (_ERROR_LINE,))


# --- helpers ----------------------------------------------------------------------------------


def _startup_error(ev: Evidence, first: tuple[int, int | None] | None, tail: str) -> str:
    """The start-up error line every failed rank ended with ('' when it is not one): the first
    failure exited with a plain code (a signal is the world's doing), no rank reached a step, and
    each rank that exited with a plain code and whose log was read ends with the same start-up
    error. A rank the agent's clean-up ended with a signal before it got that far (the first
    rank's error came first) failed no other way: its log is not asked."""
    if first is None or first[1] is None or not _plain_exit(first[1]):
        return ""
    if (ev.status.step or 0) > 0 or (_min_step(ev) or 0) > 0:
        return ""
    line = _unprefixed(find_line(tail, (STARTUP_ERROR,)))
    plain = {r.rank for r in ev.status.ranks if _plain_exit(r.exit_code)}
    others = {_unprefixed(find_line(t, (STARTUP_ERROR,))) for rank, t in ev.log_tails.items() if t and rank in plain}
    return line if line and others <= {line} else ""


def _plain_exit(code: int | None) -> bool:
    """An exit code the process chose (1–127), not a signal's."""
    return code is not None and 0 < code < 128


def _unprefixed(line: str) -> str:
    """`[rank1]: ModuleNotFoundError: …` → `ModuleNotFoundError: …` (torchrun's per-rank prefix)."""
    return re.sub(r"^\[(default)?(rank)?\d+\]:\s*", "", line)


def _first_failed(ev: Evidence) -> tuple[int, int | None] | None:
    """(rank, exit code) of the first rank that failed for good; None when none did."""
    status = ev.status
    if status.failed_rank is not None:
        rank = next((r for r in status.ranks if r.rank == status.failed_rank), None)
        return status.failed_rank, rank.exit_code if rank else status.exit_code
    first = first_failure(ev)
    if first is not None:
        return first.rank, first.exit_code
    failed = [r for r in status.ranks if r.exit_code not in (None, 0)]
    return (failed[0].rank, failed[0].exit_code) if failed else None


def _node_of(ev: Evidence, rank: int) -> str | None:
    found = next((r.node for r in ev.status.ranks if r.rank == rank and r.node), "")
    found = found or next((e.node for e in reversed(ev.exits) if e.rank == rank and e.node), "")
    return found or None


def _who(ev: Evidence, first: tuple[int, int | None] | None) -> str:
    if first is None:
        return "the job"
    node = _node_of(ev, first[0])
    return f"rank {first[0]}" + (f" on {node}" if node else "")


def _at(ev: Evidence) -> str:
    step = ev.status.step if ev.status.step is not None else _min_step(ev)
    return f" at step {step}" if step is not None else ""


def _crash_reason(ev: Evidence, first: tuple[int, int | None] | None, tail: str) -> str:
    """`rank 1 on local-1 was killed by SIGKILL at step 120` / `… exited with code 1 at step 3:
    ValueError: …`."""
    if first is None:
        return ev.status.message or f"the attempt {ev.status.state}"
    code = first[1]
    how = describe(code) if code is not None else ""
    if not how:
        how = "failed"
    elif "killed" in how:
        how = f"was {how}"
    else:
        how = f"exited with code {code}"
    line = telling_line(tail) if tail else ""
    return f"{_who(ev, first)} {how}{_at(ev)}" + (f": {line}" if line else "")


def _timing(ev: Evidence, outcome: str, first: tuple[int, int | None] | None) -> dict[str, datetime]:
    """`failed_at` (when it broke, as the evidence dates it) and `detected_at` (the control
    plane's stop of the gang; else when the launcher saw the last rank exit)."""
    failed: float | None = None
    if outcome == "node_lost":
        since = [v.since for o in ev.nodes if o.health is not None for v in o.health.verdicts
                 if v.kind in FATAL_VERDICTS]
        if ev.stop_reason is not None and ev.stop_reason.since is not None:  # lost to silence: its last answer
            since.append(ev.stop_reason.since)
        failed = min(since) if since else None
    elif outcome == "hang":
        beats = [ev.last_beats[r] for r in hung_ranks(ev) if r in ev.last_beats]
        failed = min(beats) if beats else None
    elif first is not None:
        failure = first_failure(ev)
        ends = [e.ended_at for e in ev.exits if e.rank == first[0] and e.ended_at]
        failed = (failure.ended_at if failure is not None else None) or (max(ends) if ends else None)
    out: dict[str, datetime] = {}
    if (at := utc_from_s(failed)) is not None:
        out["failed_at"] = at
    detected = ev.stop_reason.at if ev.stop_reason is not None else None
    if detected is None:
        ends = [e.ended_at for e in ev.exits if e.ended_at]
        detected = max(ends) if ends else None
    if (at := utc_from_s(detected)) is not None:
        out["detected_at"] = at
    return out


def _min_step(ev: Evidence) -> int | None:
    """The last step every rank reached: the launcher's, else (a stopped Kubernetes Job took its
    pods' records) the heartbeats the node agents still serve — the lost node's ranks are not
    among them, but a synchronous gang's ranks are never a step apart."""
    steps = [r.step for r in ev.status.ranks if r.step is not None] or \
        [b.step for b in ev.served_beats if b.signal == "steps"]
    return min(steps) if steps else None


def _hung(ev: Evidence) -> bool:
    return any(r.hung for r in ev.status.ranks)


def utc_from_s(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds else None


def _ended(ev: Evidence) -> datetime | None:
    ends = [e.ended_at for e in ev.exits if e.ended_at]
    return utc_from_s(max(ends)) if ends else None


def _facts(ev: Evidence) -> list[str]:
    """The evidence lines a person reads: the status, each failed rank, the records, the nodes."""
    s = ev.status
    facts = [f"launcher: {s.state}" + (f" — {s.message}" if s.message else "")]
    for r in s.ranks:
        if r.exit_code not in (None, 0) or r.hung:
            where = f" on {r.node}" if r.node else ""
            what = r.outcome or ("hung" if r.hung else "")
            if r.exit_code is not None and not what.startswith("exit"):
                what += f" (exit code {r.exit_code})"
            age = f", heartbeat {r.heartbeat_age_s:.0f} s old" if r.hung and r.heartbeat_age_s is not None else ""
            at = f" at step {r.step}" if r.step is not None or r.signal != "activity" else " (watched by its activity)"
            facts.append(f"rank {r.rank}{where}: {what}{at}{age}"
                         + (f", restart {r.restart}" if r.restart else ""))
    if restarts := restarts_in_place(ev):
        facts.append(f"torchrun restarted the workers in place {restarts} time(s) "
                     f"(of {ev.max_restarts_in_place})")
    if ev.stop_reason is not None:
        facts.append(f"stop-reason.json: {ev.stop_reason.reason}: {ev.stop_reason.detail}")
    elif ev.stop is not None:
        facts.append("stopped.json: stopped on request (no reason recorded)")
    if ev.diverged is not None:
        facts.append(f"diverged.json: {ev.diverged.message or ev.diverged.reason} "
                     f"(onset {ev.diverged.onset_step}, last checkpoint {ev.diverged.last_checkpoint_step})")
    if ev.checkpoint_corrupt is not None:
        facts.append(f"checkpoint_corrupt.json: {ev.checkpoint_corrupt.reason}")
    for rank, tail in sorted(ev.log_tails.items()):
        line = telling_line(tail)
        if line:
            facts.append(f"rank {rank} log: {line}")
    for o in ev.nodes:
        reasons = node_fatal_reasons(o)
        if reasons:
            facts.extend(reasons)
        elif o.missed_heartbeats:
            facts.append(f"node agent on {o.node} missed {o.missed_heartbeats} heartbeat(s)")
        elif o.health is not None and o.health.verdicts:
            facts.extend(f"{o.node}: {v.kind}: {v.reason}" for v in o.health.verdicts if v.kind != "no_gpu")
    return facts
