"""The "Training runs" list: filter by team, job and state; steps, final loss, duration and
cost beside each run's state and outcome; job names link to their runs (issue 57).

The lifecycle comes from the platform state; steps, final loss and cost from MLflow in one
search over the listed runs (MLflow down: those columns say "—" and the page says why). Plain
HTML like the rest of the view (`render.py`): the filter is a GET form, so a filtered list is a
link a person can share.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from trainyard.plugins.control_room import fmt
from trainyard.plugins.control_room.model import RunSummary
from trainyard.plugins.control_room.render import page, state_badge
from trainyard.plugins.recovery.model import FINAL_LIFECYCLE_STATES
from trainyard.plugins.recovery.outcome import RunOutcome
from trainyard.plugins.tracking.metrics import series_key

if TYPE_CHECKING:
    from trainyard.plugins.state.jobs import JobStateStore, RunInfo

log = logging.getLogger(__name__)

STATES = ("pending", "scheduling", "starting", "running", "recovering", "completed", "failed", "cancelled")
COST_METRIC = "total_cost_usd"


@dataclass(frozen=True)
class RunsFilter:
    """What the list shows: '' is any."""

    team: str = ""
    job: str = ""
    state: str = ""

    def __post_init__(self) -> None:
        if self.state and self.state not in STATES:
            raise ValueError(f"state {self.state[:40]!r} is not one of {', '.join(STATES)}")


def run_summaries(store: JobStateStore, flt: RunsFilter = RunsFilter(), *, now: datetime, tracking_uri: str = "",
                  limit: int = 50) -> tuple[list[RunSummary], str]:
    """The filtered list, newest first, and a note when MLflow's columns could not be read."""
    infos = store.list_runs(flt.job, limit=limit, team=flt.team, state=flt.state)
    metrics, note = _mlflow_figures([i.mlflow_run_id for i in infos if i.mlflow_run_id], tracking_uri)
    return [_summary(i, metrics.get(i.mlflow_run_id, {}), now) for i in infos], note


def _summary(info: RunInfo, figures: dict[str, Any], now: datetime) -> RunSummary:
    over = info.state in FINAL_LIFECYCLE_STATES
    end = info.updated_at if over else now
    return RunSummary(
        job=info.job, run=info.run, team=info.team, state=info.state, attempts=info.attempts,
        last_cause=info.last_cause, outcome=RunOutcome.of_run(info.state, info.final_reason).line if over else "",
        created_at=info.created_at, updated_at=info.updated_at,
        duration_s=max((end - info.created_at).total_seconds(), 0.0),
        steps=figures.get("steps"), final_loss=figures.get("loss"), cost_usd=figures.get(COST_METRIC),
        view_url=f"jobs/{quote(info.job, safe='')}/runs/{quote(info.run, safe='')}",
        job_url=f"dags/{quote(info.job, safe='')}")


def _mlflow_figures(run_ids: list[str], tracking_uri: str) -> tuple[dict[str, dict[str, Any]], str]:
    """MLflow run id → {loss, steps, total_cost_usd}: one search for every listed run."""
    if not run_ids or not tracking_uri:
        return {}, ""
    try:
        from trainyard.plugins.tracking.candidate import last_loss
        from trainyard.plugins.tracking.runs import client_for

        client = client_for(tracking_uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        quoted = ", ".join(f"'{r}'" for r in run_ids if r.isalnum())
        found = client.search_runs(experiments, filter_string=f"attributes.run_id IN ({quoted})",
                                   max_results=len(run_ids)) if quoted and experiments else []
        figures: dict[str, dict[str, Any]] = {}
        for run in found:
            m = run.data.metrics
            figures[run.info.run_id] = {"loss": m.get("loss"), COST_METRIC: m.get(series_key(COST_METRIC))}
            if "loss" in m:  # the last step of the loss series: one more read, only for runs that have one
                figures[run.info.run_id]["steps"] = last_loss(client, run.info.run_id)[0]
        return figures, ""
    except Exception as e:  # noqa: BLE001 - the list stands without MLflow's columns
        log.warning("runs list: MLflow's figures could not be read: %s", e)
        return {}, f"MLflow did not answer ({type(e).__name__}): steps, loss and cost are not shown"


def runs_page(runs: Sequence[RunSummary], *, title: str, now: datetime, base: str = "",
              flt: RunsFilter = RunsFilter(), note: str = "", fixed_job: bool = False) -> str:
    """The runs list with its filter form; each run links to its page, each job to its runs."""
    form = _filter_form(flt, base, fixed_job)
    head = f"<h1>{escape(title)}</h1>{form}" + (f"<p class='warn'>{escape(note)}</p>" if note else "")
    if not runs:
        return page(title, f"{head}<p class='muted'>No training run{' matches' if _any(flt) else ' yet'}.</p>")
    rows = "".join(_row(r, base, now) for r in runs)
    columns = ("job", "run", "team", "state", "outcome", "n:attempts", "n:steps", "n:final loss", "n:duration",
               "n:cost", "last failure", "opened")
    heads = "".join(f"<th class='n'>{c[2:]}</th>" if c.startswith("n:") else f"<th>{c}</th>" for c in columns)
    table = f"<table id='runs'><thead><tr>{heads}</tr></thead><tbody>{rows}</tbody></table>"
    return page(title, head + table)


def _row(r: RunSummary, base: str, now: datetime) -> str:
    cells = [
        f"<a href=\"{escape(base + r.job_url)}\">{escape(r.job)}</a>",
        f"<a href=\"{escape(base + r.view_url)}\">{escape(r.run)}</a>",
        escape(r.team or fmt.DASH), state_badge(r.state), escape(r.outcome or fmt.DASH),
    ]
    numbers = [str(r.attempts), str(r.steps) if r.steps is not None else fmt.DASH, fmt.number(r.final_loss),
               fmt.seconds(r.duration_s), fmt.DASH if r.cost_usd is None else f"${r.cost_usd:,.2f}"]
    tail = [escape(r.last_cause or fmt.DASH), f"{fmt.clock(r.created_at)} ({fmt.age(r.created_at, now)})"]
    return ("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "".join(f"<td class='n'>{c}</td>" for c in numbers)
            + "".join(f"<td>{c}</td>" for c in tail) + "</tr>")


def _any(flt: RunsFilter) -> bool:
    return bool(flt.team or flt.job or flt.state)


def _filter_form(flt: RunsFilter, base: str, fixed_job: bool) -> str:
    """A GET form (team, job, state) that reloads this list filtered."""
    options = "".join(f"<option value='{s}'{' selected' if s == flt.state else ''}>{s or 'any state'}</option>"
                      for s in ("", *STATES))
    job = "" if fixed_job else (f"<label>job <input name='job' value=\"{escape(flt.job)}\" size='18'></label> ")
    clear = (f" <a href=\"{escape(base if not fixed_job else base + 'dags/' + quote(flt.job, safe=''))}\">clear</a>"
             if (flt.team or flt.state or (flt.job and not fixed_job)) else "")
    return (f"<form id='filter' method='get' class='muted'><label>team <input name='team' "
            f"value=\"{escape(flt.team)}\" size='12'></label> {job}<label>state <select name='state'>{options}"
            f"</select></label> <button type='submit'>filter</button>{clear}</form>")

