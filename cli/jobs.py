"""`trainyard jobs`, `trainyard status JOB`, `trainyard stop JOB`, `trainyard nodes …`: the job
state of the platform (`plugins/state/jobs.py`), for people.

- `jobs`: training runs, newest first — job, run, lifecycle state, attempts, last failure cause;
- `status JOB [--run R] [--evidence]`: one run (its newest by default): its lifecycle and every
  attempt with its outcome, action, step and timings — a live attempt's step read from its
  ranks' heartbeats (the files, else the node agents), not from what the control plane last
  recorded — then each attempt's reason, the action's reason and (`--evidence`) the facts
  the verdict rests on; every line fits 80 columns;
- `stop JOB [--run R]`: stop the live attempt's gang through its stored launcher handle
  (SIGTERM, emergency checkpoint, SIGKILL after `--grace-s`) and mark the run cancelled;
- `nodes list | cordon NODE --reason … | uncordon NODE`: the cluster's nodes and which are out
  of service.

Presentation only: the state, the stop and the cordons are the recovery engine's. `--json`
prints the records for scripts. Exit 0 done, 1 no such run / node, 2 usage errors.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.plugins.state.jobs import AttemptInfo, JobStateStore, RunInfo

STATE_STYLE = {"completed": "green", "failed": "red", "cancelled": "yellow", "recovering": "magenta",
               "running": "cyan", "starting": "cyan", "scheduling": "blue", "pending": "blue"}


EXIT_CODES: dict[int, str] = {
    1: "no such job, run or node, or nothing to stop (the message says which)",
}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="list training runs, newest first", description=__doc__.split("\n\n")[0])
    p.add_argument("--job", default="", help="only this job's runs")
    p.add_argument("--limit", type=int, default=30, help="at most this many runs (default 30)")
    p.add_argument("--json", action="store_true", help="print the runs as JSON")
    p.set_defaults(func=run_jobs)

    p = sub.add_parser("status", help="one training run: lifecycle and every attempt")
    p.add_argument("job", metavar="JOB", help="job name (metadata.name of its spec)")
    p.add_argument("--run", default="", help="run id (default: the job's newest run)")
    p.add_argument("--evidence", action="store_true", help="also list the facts behind each verdict")
    p.add_argument("--json", action="store_true", help="print the run and its attempts as JSON")
    p.set_defaults(func=run_status)

    p = sub.add_parser("stop", help="stop a training run (its live attempt) and mark it cancelled")
    p.add_argument("job", metavar="JOB", help="job name (metadata.name of its spec)")
    p.add_argument("--run", default="", help="run id (default: the job's newest run)")
    p.add_argument("--grace-s", type=float, default=30.0, help="SIGTERM → SIGKILL grace (default 30)")
    p.set_defaults(func=run_stop)

    p = sub.add_parser("nodes", help="the cluster's nodes and cordons (nodes out of service)")
    nodes = p.add_subparsers(dest="nodes_command", metavar="ACTION", required=True)
    q = nodes.add_parser("list", help="nodes, with their cordons")
    q.add_argument("--json", action="store_true", help="print the nodes as JSON")
    q.set_defaults(func=run_nodes_list)
    q = nodes.add_parser("cordon", help="take a node out of service (no new placements)")
    q.add_argument("node", metavar="NODE", help="node name (as in the cluster file)")
    q.add_argument("--reason", required=True, help="why (shown by `nodes list` and kept with the cordon)")
    q.set_defaults(func=run_cordon)
    q = nodes.add_parser("uncordon", help="put a node back in service")
    q.add_argument("node", metavar="NODE", help="node name (as in the cluster file)")
    q.set_defaults(func=run_uncordon)


def _view_url(info: RunInfo) -> str:
    from trainyard.config.settings import get_settings
    from trainyard.plugins.tracking.ui_links import view_url

    return view_url(get_settings().airflow_url, info.job, info.run)


def _store() -> JobStateStore:
    from trainyard.config.settings import get_settings
    from trainyard.plugins.state.jobs import open_job_state

    return open_job_state(get_settings().state_db)


def _ago(when: datetime | None, now: datetime | None = None) -> str:
    if when is None:
        return "—"
    seconds = ((now or datetime.now(UTC)) - when).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{max(seconds, 0):.0f}s ago"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "running"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 60:.1f}m" if seconds >= 120 else f"{seconds:.0f}s"


def _state(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def _not_found(e: Exception) -> int:
    from trainyard.cli.output import err_console

    err_console.print(f"[red]{e}[/]")
    return 1


# --- jobs ---------------------------------------------------------------------------------------


def run_jobs(args: argparse.Namespace) -> int:
    from rich.table import Table

    from trainyard.cli.output import console, print_json

    runs = _store().list_runs(args.job, limit=args.limit)
    if args.json:
        print_json([r.model_dump(mode="json") for r in runs])
        return 0
    if not runs:
        console.print("no training runs yet" + (f" of {args.job}" if args.job else ""))
        return 0
    table = Table(box=None, pad_edge=False)
    for name, justify in (("job", "left"), ("run", "left"), ("state", "left"), ("att.", "right"),
                          ("last cause", "left"), ("started", "right")):
        # a long job name or cause wraps onto more lines of its cell (folded mid-word), never cut
        table.add_column(name, justify=justify, no_wrap=name in ("run", "state"),
                         overflow="ellipsis" if name in ("run", "state") else "fold")
    for r in runs:
        table.add_row(r.job, r.run, _state(r.state), str(r.attempts), r.last_cause or "—", _ago(r.created_at))
    console.print(table)
    return 0


# --- status -------------------------------------------------------------------------------------


def run_status(args: argparse.Namespace) -> int:
    from trainyard.cli.output import print_json
    from trainyard.plugins.state.jobs import RunNotFound

    store = _store()
    try:
        info = store.get_run(args.job, args.run)
    except RunNotFound as e:
        return _not_found(e)
    attempts = store.attempts(info.job, info.run)
    if args.json:
        from trainyard.plugins.recovery.outcome import RunOutcome

        print_json({"run": info.model_dump(mode="json"),
                    "outcome": RunOutcome.of_run(info.state, info.final_reason).model_dump(mode="json"),
                    "attempts": [a.model_dump(mode="json", exclude={"handle", "report"}) |
                                 {"evidence": a.failure_report.evidence if a.failure_report else []}
                                 for a in attempts]})
        return 0
    show_status(info, attempts, evidence=args.evidence)
    return 0


def show_status(info: RunInfo, attempts: list[AttemptInfo], *, evidence: bool = False,
                settings: Settings | None = None) -> None:
    """The run's header, a compact attempt table, a live attempt's progress from its ranks'
    heartbeats, then each attempt's why — every line within 80 columns (long ones wrap)."""
    from rich.markup import escape
    from rich.padding import Padding
    from rich.table import Table

    from trainyard.cli.output import console
    from trainyard.plugins.recovery.outcome import RunOutcome

    console.print(f"[bold]{escape(info.job)}[/] run [bold]{info.run}[/]  {_state(info.state)}", soft_wrap=False)
    console.print(f"[dim]team {escape(info.team or '—')} · project {escape(info.project or '—')}[/]", soft_wrap=False)
    console.print(f"started {info.created_at:%Y-%m-%d %H:%M:%S}Z · updated {_ago(info.updated_at)}", soft_wrap=False)
    if info.mlflow_run_id:
        console.print(f"MLflow run {info.mlflow_run_id}", soft_wrap=False)
    console.print(f"[dim]view:[/]\n{_view_url(info)}", soft_wrap=True)  # the Trainyard view in Airflow
    outcome = RunOutcome.of_run(info.state, info.final_reason)  # the one line every surface shows
    if outcome.over:
        console.print(f"[dim]outcome:[/] {escape(outcome.line)}", soft_wrap=False)
    if not attempts:
        console.print("no attempt started yet")
        return
    live = {a.attempt: progress for a in attempts if a.ended_at is None
            and (progress := live_progress(a, settings)) is not None}
    table = Table(box=None, pad_edge=False)
    for name, justify in (("#", "right"), ("outcome", "left"), ("action", "left"), ("step", "right"),
                          ("started", "right"), ("took", "right"), ("restarts", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for a in attempts:
        step = a.step if a.step is not None else live[a.attempt].step if a.attempt in live else None
        table.add_row(str(a.attempt), a.outcome or _state("running"), a.action or "—",
                      "—" if step is None else str(step), f"{a.started_at:%H:%M:%S}",
                      _duration(a.duration_s), str(a.restarts_in_place))
    console.print(table)
    for number, progress in sorted(live.items()):
        console.print(f"[bold]attempt {number}[/] [dim]live:[/] {escape(progress.describe())}", soft_wrap=False)
    for a in attempts:  # wrapped at the terminal's width, continuation lines indented
        if a.reason or a.action_reason:
            console.print(f"[bold]attempt {a.attempt}[/] {escape(a.reason or '')}", soft_wrap=False)
            if a.action_reason:
                console.print(Padding(f"[dim]→ {a.action}:[/] {escape(a.action_reason)}", (0, 0, 0, 2)),
                              soft_wrap=False)
        report = a.failure_report if evidence else None
        for fact in report.evidence if report else []:
            console.print(Padding(f"[dim]· {escape(fact)}[/]", (0, 0, 0, 4)), soft_wrap=False)


@dataclass(frozen=True)
class LiveProgress:
    """A live attempt as its ranks' heartbeats say, whatever the control plane last recorded."""

    step: int | None
    """The slowest rank's last step (None: a plain script, whose ranks do not say)."""
    ranks: int
    """Ranks heard from."""
    world_size: int
    beat_at: datetime
    """The newest heartbeat."""
    finished: bool
    """Every rank of the gang says it is done: training ended, the control plane has not
    recorded it yet (its watcher may be down)."""
    source: str
    signal: str = "steps"
    """What watches the attempt for a hang (`RunStatus.hang_signal`)."""

    def describe(self) -> str:
        heard = f"{self.ranks} of {self.world_size} ranks" if self.ranks < self.world_size else f"{self.ranks} ranks"
        if self.finished:
            return (f"the workers finished at step {self.step} ({_ago(self.beat_at)}); not "
                    f"recorded by the control plane yet ({self.source})")
        if self.signal == "activity":
            return (f"a plain script: hang watch on its ranks' CPU time and I/O, last active "
                    f"{_ago(self.beat_at)} ({heard}, {self.source})")
        return (f"step {self.step} (slowest of {heard}), heartbeat {_ago(self.beat_at)} ({self.source}); "
                "hang watch on its steps")


def live_progress(attempt: AttemptInfo, settings: Settings | None = None) -> LiveProgress | None:
    """The progress of a live attempt from its ranks' heartbeats: the files where this machine
    can read them (the local launcher's run folder), else the node agents' reports of its ranks
    (`TRAINYARD_NODE_AGENTS`); None when neither says anything."""
    from pathlib import Path

    from trainyard.plugins.run.rules import FINISHED_PHASES

    handle = attempt.run_handle
    if handle is None:
        return None
    beats: list[tuple[int, float, str, str]] = []
    source = "heartbeat files"
    if handle.heartbeat_dir and Path(handle.heartbeat_dir).is_dir():
        from trainyard.plugins.run.heartbeat import read_heartbeats

        beats = [(b.step, b.time, b.phase, b.signal)
                 for b in read_heartbeats(handle.heartbeat_dir, range(handle.world_size)).values()]
    if not beats:
        beats, source = _agent_beats(attempt, settings), "node agents"
    if not beats:
        return None
    finished = len(beats) == handle.world_size and all(phase in FINISHED_PHASES for _, _, phase, _ in beats)
    stepped = [step for step, _, _, signal in beats if signal == "steps"]
    return LiveProgress(step=min(stepped) if stepped else None, ranks=len(beats), world_size=handle.world_size,
                        beat_at=datetime.fromtimestamp(max(t for _, t, _, _ in beats), UTC), finished=finished,
                        source=source, signal="steps" if stepped else "activity")


def _agent_beats(attempt: AttemptInfo, settings: Settings | None) -> list[tuple[int, float, str, str]]:
    """(step, time, phase, signal) of the attempt's ranks as the node agents report them (2 s each)."""
    from trainyard.config.settings import get_settings
    from trainyard.node_agent.client import NodeAgentError, fetch_health

    agents = (settings or get_settings()).node_agents
    handle = attempt.run_handle
    nodes = set(handle.gang_nodes) if handle else set()
    found: dict[int, tuple[int, float, str, str]] = {}
    for node, url in sorted(agents.items()):
        if nodes and node not in nodes:
            continue
        try:
            health = fetch_health(url, timeout=2.0)
        except NodeAgentError:
            continue
        for r in health.ranks:
            if (r.job, r.run, r.attempt) == (attempt.job, attempt.run, attempt.attempt):
                found[r.rank] = (r.step, r.time, r.phase, r.signal)
    return list(found.values())


# --- stop ---------------------------------------------------------------------------------------


def run_stop(args: argparse.Namespace) -> int:
    from trainyard.cli.output import console
    from trainyard.config.settings import get_settings
    from trainyard.plugins.attempt.launchers import Runtime
    from trainyard.plugins.attempt.stop import stop_run
    from trainyard.plugins.state.jobs import RunNotFound

    store = _store()
    try:
        info = store.get_run(args.job, args.run)
        result = stop_run(store, info.job, Runtime(get_settings()), info.run, grace_s=args.grace_s)
    except RunNotFound as e:
        return _not_found(e)
    if result.already_final:
        console.print(f"run {result.run.run} of {result.run.job} is already {_state(result.run.state)}")
        return 0
    stopped = f"attempt {result.attempt}: {result.status.state}" if result.status else "no live attempt"
    console.print(f"run {result.run.run} of {result.run.job} {_state(result.run.state)} ({stopped})")
    return 0


# --- nodes --------------------------------------------------------------------------------------


def run_nodes_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from trainyard.cli.output import console, print_json
    from trainyard.config.cluster import load_cluster
    from trainyard.config.settings import get_settings

    cordons = _store().cordoned()
    nodes: list[Any] = list(load_cluster(get_settings().cluster).nodes)
    names = [n.name for n in nodes] + sorted(set(cordons) - {n.name for n in nodes})
    if args.json:
        print_json([{"node": name, "cordoned": name in cordons,
                     **({"reason": cordons[name].reason, "since": cordons[name].since.isoformat(),
                         "by": cordons[name].by} if name in cordons else {})} for name in names])
        return 0
    table = Table(box=None, pad_edge=False)
    for column in ("node", "devices", "state", "since", "reason"):
        table.add_column(column, no_wrap=column != "reason")
    by_name = {n.name: n for n in nodes}
    for name in names:
        node = by_name.get(name)
        devices = f"{node.gpus}× {node.gpu_type}" if node is not None else "(not in cluster)"
        c = cordons.get(name)
        table.add_row(name, devices, "[red]cordoned[/]" if c else "[green]ready[/]",
                      _ago(c.since) if c else "", c.reason if c else "")
    console.print(table)
    return 0


def run_cordon(args: argparse.Namespace) -> int:
    import getpass

    from trainyard.cli.output import console

    c = _store().cordon(args.node, args.reason, by=f"trainyard nodes cordon ({getpass.getuser()})")
    console.print(f"{c.node} [red]cordoned[/] since {c.since:%Y-%m-%d %H:%M:%S}Z: {c.reason}")
    return 0


def run_uncordon(args: argparse.Namespace) -> int:
    from trainyard.cli.output import console, err_console

    if not _store().uncordon(args.node):
        err_console.print(f"{args.node} was not cordoned (`trainyard nodes list` shows the cordons)")
        return 1
    console.print(f"{args.node} [green]back in service[/]")
    return 0
