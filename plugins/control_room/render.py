"""Server-side HTML of the Trainyard view: one page per training run, one list of runs.

The pages are what Airflow shows in its "Trainyard" tab (an iframe) and what `trainyard
status` links to. Plain HTML with inline CSS and SVG (`charts`): no script, no build step,
nothing fetched from elsewhere — it works offline and inside Airflow's sandboxed iframe. A
page of a run that is still going keeps its progress and ranks current with one small script
and carries the Stop button (`live.py`).
Each part is a `<section>` with an `<h2>` (Plan, Placement, Progress, Checkpoints, Recovery
timeline): a person finds them by eye, a browser test by role.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape

from trainyard.plugins.control_room import charts, fmt
from trainyard.plugins.control_room import live as live_part
from trainyard.plugins.control_room.model import (
    AttemptView,
    CheckpointRow,
    Live,
    PlacementView,
    PlanView,
    RunView,
)
from trainyard.plugins.recovery.model import FINAL_KINDS
from trainyard.plugins.recovery.outcome import RunOutcome

FINAL_STATES = ("completed", "failed", "cancelled")

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 20px; color: #1d1d1f; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 8px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; } th, td { padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
th { color: #555; font-weight: 600; } td.n, th.n { text-align: right; }
.state { display: inline-block; padding: 1px 8px; border-radius: 10px; color: #fff; font-size: 12px; }
.s-completed { background: #3a8a3a; } .s-failed { background: #c43b3b; } .s-cancelled { background: #888; }
.s-running, .s-starting, .s-scheduling, .s-pending { background: #3a6ea5; } .s-recovering { background: #c98a12; }
.muted { color: #666; } .warn { color: #b34700; } .ok { color: #2e7d32; } .bad { color: #c62828; }
.racks { display: flex; gap: 14px; flex-wrap: wrap; }
.rack { border: 1px solid #bbb; border-radius: 6px; padding: 6px 8px; }
.rack > .name, .node > .name { font-size: 12px; color: #444; margin-bottom: 4px; }
.nodes { display: flex; gap: 10px; flex-wrap: wrap; }
.node { border: 1px solid #ccc; border-radius: 4px; padding: 4px; background: #fafafa; }
.devices { display: flex; gap: 4px; }
.device { width: 74px; border: 1px solid #999; border-radius: 3px; font-size: 11px; background: #fff; }
.device.empty { border-style: dashed; color: #aaa; min-height: 48px; } .node.unused { background: #fff; opacity: .7; }
.device .band { height: 8px; } .device .label { padding: 2px 3px; }
.legend span { display: inline-block; margin-right: 12px; font-size: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
.kv td:first-child { color: #555; padding-right: 14px; }
.figures { display: flex; gap: 28px; align-items: flex-start; flex-wrap: wrap; }
.figure .v { font-size: 22px; font-weight: 600; } .figure .k { color: #666; font-size: 12px; }
code { font-size: 12px; } a { color: #1f5fa8; }
"""


TOP = 'target="_top"'
"""An Airflow link: the page is framed in Airflow's own UI (an external view's iframe), so a link
to another Airflow page replaces the whole tab, not the frame (which would nest the UI in itself)."""
NEW_TAB = 'target="_blank" rel="noopener noreferrer"'
"""An MLflow link: MLflow forbids framing (X-Frame-Options), so it opens in a tab of its own."""
LEAVE_FRAME_JS = (
    "<script>document.addEventListener('click',e=>{const a=e.target.closest('a[target]');"
    "if(!a||window.top===window)return;try{const d=window.top.document,o=d.createElement('a');"
    "o.href=a.href;o.target=a.target;o.rel=a.rel;d.body.appendChild(o);o.click();o.remove();"
    "e.preventDefault()}catch(_){}})</script>")
"""Why links need a script to leave the frame: Airflow 3.3 frames an external view with
`sandbox="allow-scripts allow-same-origin allow-forms allow-downloads"` — no
`allow-top-navigation`, no `allow-popups` — so the browser drops a click on a `_top` or `_blank`
link. The page is Airflow's own origin, so it makes the same link in the top document and
clicks it there, where no sandbox applies. Outside a frame (the page opened on its own) the
browser follows the link as it is."""


def page(title: str, body: str, *, script: str = "") -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{CSS}{live_part.CSS}</style></head><body>{body}{script}{LEAVE_FRAME_JS}</body></html>")


def state_badge(state: str) -> str:
    return f'<span class="state s-{escape(state)}">{escape(state)}</span>'


def run_page(view: RunView, now: datetime, *, base: str = "") -> str:
    """The whole page of one training run; `base` is the app's root as the browser reaches it
    (where a live page polls and stops)."""
    links = []
    if view.mlflow_url:
        links.append(f'<a href="{escape(view.mlflow_url)}" {NEW_TAB}>MLflow run {escape(view.mlflow_run_id[:12])}</a>')
    head = (f"<h1>{escape(view.job)} · run {escape(view.run)} {state_badge(view.state)}</h1>"
            f'<div class="muted">team {escape(view.team or fmt.DASH)} · project {escape(view.project or fmt.DASH)} · '
            f"opened {fmt.clock(view.created_at)} · <span data-live=\"since\">{escape(view.state)} since "
            f"{fmt.age(view.updated_at, now)}</span>"
            f"{' · ' + ' · '.join(links) if links else ''}</div>")
    outcome = RunOutcome.of_run(view.state, view.final_reason)  # the one line every surface shows
    if outcome.over:
        head += f'<p id="outcome"{"" if outcome.succeeded else " class=warn"}>{escape(outcome.line)}</p>'
    going = view.state not in FINAL_STATES
    body = "".join([
        head,
        live_part.stop_control(view.run) if going else "",
        _section("live", "Progress", _live(view.live, now)),
        _section("ranks", "Ranks", live_part.waiting_line(view.waiting)
                 + f'<div id="ranks-body">{live_part.ranks_table(view.ranks)}</div>') if going else "",
        _section("plan", "Plan", _plan(view.plan)),
        _section("placement", "Placement", _placement(view.placement)),
        _section("checkpoints", "Checkpoints", _checkpoints(view.checkpoints, view.checkpoint_root, now)),
        _section("recovery", "Recovery timeline", _recovery(view.attempts, now)),
        _notes(view.notes),
    ])
    from urllib.parse import quote

    own = f"{base}jobs/{quote(view.job, safe='')}/runs/{quote(view.run, safe='')}"
    return page(f"{view.job} run {view.run} · Trainyard", body,
                script=live_part.script(f"{own}/live.json", f"{own}/stop") if going else "")


def message_page(title: str, text: str) -> str:
    return page(title, f"<h1>{escape(title)}</h1><p>{escape(text)}</p>")


# -- sections -----------------------------------------------------------------------------------

def _section(anchor: str, title: str, content: str) -> str:
    return f'<section id="{anchor}" aria-labelledby="h-{anchor}"><h2 id="h-{anchor}">{title}</h2>{content}</section>'


def _figure(key: str, value: str, live_key: str = "") -> str:
    """One big figure; `live_key` names it for the live script (`data-live`)."""
    attr = f' data-live="{live_key}"' if live_key else ""
    return f'<div class="figure"><div class="v"{attr}>{value}</div><div class="k">{escape(key)}</div></div>'


def _live(live: Live, now: datetime) -> str:
    step = fmt.DASH if live.step is None else f"{live.step}" + (f" / {live.max_steps}" if live.max_steps else "")
    where = ("heartbeats of the live attempt" + (f" ({live.ranks_reporting} rank(s))" if live.ranks_reporting else "")
             if live.source == "heartbeats" else "MLflow's latest metrics" if live.source == "mlflow" else "")
    figures = "".join([_figure("step", step, "step"), _figure("loss", fmt.number(live.loss), "loss"),
                       _figure("tokens/s", fmt.number(live.tokens_per_s, 5), "tokens_per_s"),
                       _figure("MFU", fmt.percent(live.mfu))])
    said = f"from {where}, {fmt.age(live.updated_at, now)}" if where else "No progress recorded yet."
    return (f'<div class="figures">{figures}<div>{charts.sparkline(live.loss_curve)}</div></div>'
            f'<p class="muted"><span data-live="source">{said}</span> <span data-live="polled"></span></p>')


def _plan(plan: PlanView | None) -> str:
    if plan is None:
        return "<p class='muted'>No attempt has been planned and placed yet.</p>"
    d = plan.layout
    sharding = "FSDP (ZeRO-3)" if plan.fsdp else f"ZeRO-{plan.zero_stage}" + (" (DDP)" if plan.zero_stage == 0 else "")
    rows = [("layout", f"<code>{escape(plan.label)}</code>"),
            ("tensor · pipeline · data parallel", f"TP {d.tp} · PP {d.pp} · DP {d.dp}"
             + (f" · CP {d.cp}" if d.cp > 1 else "")),
            ("sharding", sharding),
            ("micro-batches", f"{plan.num_micro_batches} × {plan.micro_batch_size} sequence(s)"
             + (f", global batch {plan.global_batch_size}" if plan.global_batch_size else "")
             + (f", {plan.sequence_length} tokens each" if plan.sequence_length else "")),
            ("recompute", escape(plan.recompute))]
    table = "<table class='kv'>" + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows) + "</table>"
    return table + _memory(plan) + _timing(plan)


def _memory(plan: PlanView) -> str:
    m = plan.memory
    if m.total_bytes is None and m.capacity_bytes is None:
        return ""
    verdict = ""
    if m.total_bytes is not None and m.budget_bytes is not None:
        verdict = (f" <span class='bad'>over the budget by {fmt.size(m.total_bytes - m.budget_bytes)}</span>"
                   if m.over_budget else f" <span class='ok'>{fmt.size(m.budget_bytes - m.total_bytes)} under the "
                   "budget</span>")
    legend = "".join(f'<span><i style="background:{charts.colour(i)}"></i>{escape(k)} {fmt.size(v)}</span>'
                     for i, (k, v) in enumerate(m.items.items()))
    return (f"<h3>Memory per device</h3><p>{fmt.size(m.total_bytes)} estimated · budget {fmt.size(m.budget_bytes)}"
            f" · capacity {fmt.size(m.capacity_bytes)}{verdict}</p>{charts.memory_bar(m)}"
            f'<div class="legend">{legend}<span>┆ budget</span></div>')


def _timing(plan: PlanView) -> str:
    if not plan.step_time_s:
        return ""
    legend = "".join(f'<span><i style="background:{charts.colour(i + 2)}"></i>{escape(k)} {fmt.seconds(v)}</span>'
                     for i, (k, v) in enumerate(plan.step_split.items()))
    extra = f" · {fmt.number(plan.tokens_per_s, 5)} tokens/s · MFU {fmt.percent(plan.mfu)}" if plan.tokens_per_s else ""
    return (f"<h3>Step time (estimate)</h3><p>{fmt.seconds(plan.step_time_s)} per step{extra}</p>"
            f'{charts.split_bar(plan.step_split)}<div class="legend">{legend}</div>')


def _placement(placement: PlacementView | None) -> str:
    if placement is None:
        return "<p class='muted'>Not placed yet.</p>"
    kinds = [k for k in ("tp", "pp", "dp", "cp") if placement.group_sizes.get(k, 1) > 1] or ["dp"]
    racks = []
    for rack in placement.racks:
        nodes = "".join(_node(node, kinds) for node in rack.nodes)
        more = f'<div class="muted">+ {rack.more_nodes} more node(s)</div>' if rack.more_nodes else ""
        racks.append(f'<div class="rack" data-rack="{escape(rack.name)}"><div class="name">rack '
                     f'{escape(rack.name)}</div><div class="nodes">{nodes}{more}</div></div>')
    legend = " ".join(f"<span>band {i + 1}: {k.upper()} group (degree {placement.group_sizes.get(k, 1)})</span>"
                      for i, k in enumerate(kinds))
    strategy = f" · strategy {escape(placement.strategy)}" if placement.strategy else ""
    return (f"<p class='muted'>attempt {placement.attempt} · {escape(placement.gpu_type)}{strategy} · "
            f"each device: its rank and a coloured band per process group — one colour, one group</p>"
            f'<div class="racks">{"".join(racks)}</div><div class="legend">{legend}</div>')


def _node(node: object, kinds: list[str]) -> str:
    devices = []
    for cell in node.devices:  # type: ignore[attr-defined]
        bands = "".join(f'<div class="band" style="background:{charts.colour(cell.groups.get(k, 0))}" '
                        f'title="{k.upper()} group {cell.groups.get(k, 0)}"></div>' for k in kinds)
        groups = " ".join(f"{k}{cell.groups.get(k, 0)}" for k in kinds)
        step = f"<br>step {cell.step}" if cell.step is not None else ""
        devices.append(f'<div class="device" data-rank="{cell.rank}">{bands}<div class="label">dev {cell.index} · '
                       f"<b>rank {cell.rank}</b><br>{groups}{step}</div></div>")
    empty = node.capacity - len(node.devices)  # type: ignore[attr-defined]
    devices += ['<div class="device empty"><div class="label">not this job</div></div>'] * max(0, empty)
    used = node.used  # type: ignore[attr-defined]
    return (f'<div class="node{"" if used else " unused"}" data-node="{escape(node.name)}"><div class="name">'
            f'{escape(node.name)}{"" if used else " (not used)"}</div>'  # type: ignore[attr-defined]
            f'<div class="devices">{"".join(devices)}</div></div>')


def _checkpoints(rows: Sequence[CheckpointRow], root: str, now: datetime) -> str:
    where = f"<p class='muted'>under <code>{escape(root)}</code></p>" if root else ""
    if not rows:
        return where + "<p class='muted'>No checkpoint committed yet.</p>"
    body = []
    for r in rows:
        files = ("<span class='ok'>all present</span>" if r.files_ok else
                 f"<span class='bad'>{escape((r.quarantined and 'quarantined: ' + r.quarantined) or r.problem)}</span>")
        body.append(f"<tr><td class='n'>{r.step}</td><td>{files}</td>"
                    f"<td>{'✓ SHA-256 at commit' if r.verified_at_commit else fmt.DASH}</td>"
                    f"<td class='n'>{fmt.size(r.size_bytes)}</td><td>{fmt.age(r.created_at, now)}</td>"
                    f"<td>{'<b>← a resume takes this one</b>' if r.resume_pick else ''}</td></tr>")
    return (where + "<table><thead><tr><th class='n'>step</th><th>files</th><th>verified</th><th class='n'>size</th>"
            f"<th>age</th><th></th></tr></thead><tbody>{''.join(body)}</tbody></table>")


def _recovery(attempts: Sequence[AttemptView], now: datetime) -> str:
    if not attempts:
        return "<p class='muted'>No attempt yet.</p>"
    rows = []
    for a in attempts:
        t = a.timing
        link = f'<a href="{escape(a.dag_run_url)}" {TOP}>{escape(a.dag_run_id)}</a>' if a.dag_run_url else escape(
            a.dag_run_id or fmt.DASH)
        outcome = escape(a.outcome or a.state) + (f" at step {a.step}" if a.step is not None else "")
        if a.restarts_in_place:
            outcome += f" <span class='warn'>(torchrun restarted it in place {a.restarts_in_place}×)</span>"
        action = escape(a.action) + (f" from step {a.resume_step}" if a.resume_step is not None and a.action
                                     not in FINAL_KINDS else "")
        rows.append(
            f"<tr><td class='n'>{a.attempt}</td><td>{outcome}<div class='muted'>{escape(a.reason)}</div></td>"
            f"<td>{action or fmt.DASH}</td><td class='n'>{fmt.seconds(t.detect_s if t else None)}</td>"
            f"<td class='n'>{fmt.seconds(t.restart_s if t else None)}</td>"
            f"<td class='n'>{fmt.seconds(t.time_to_train_again_s if t else None)}</td>"
            f"<td class='n'>{fmt.DASH if not t or t.steps_lost is None else t.steps_lost}</td>"
            f"<td class='n'>{fmt.number(t.device_hours_lost if t else None, 3)}</td>"
            f"<td>{', '.join(escape(n) for n in a.nodes) or fmt.DASH}</td><td>{link}</td></tr>")
    table = ("<table><thead><tr><th class='n'>attempt</th><th>outcome</th><th>action</th><th class='n'>detection</th>"
             "<th class='n'>restart</th><th class='n'>time to train again</th><th class='n'>steps lost</th>"
             "<th class='n'>device-hours lost</th><th>nodes</th><th>DAG run</th></tr></thead>"
             f"<tbody>{''.join(rows)}</tbody></table>")
    return charts.timeline(attempts, now) + table


def _notes(notes: Sequence[str]) -> str:
    if not notes:
        return ""
    items = "".join(f"<li>{escape(n)}</li>" for n in notes)
    return f'<section id="notes"><h2>Not shown</h2><ul class="muted">{items}</ul></section>'
