"""The MLflow run's description: what a person reads first on the run page, with the way back to
Airflow and to the Trainyard view.

MLflow shows the run tag `mlflow.note.content` as the run's description (Markdown, editable in its
UI). We write it when the run opens and again when it ends, so it always says where the run is:
one outcome line, then links to every attempt's DAG run in Airflow and to the run's Trainyard
view. Once the run is over the line is its one outcome (`plugins/recovery/outcome.RunOutcome`,
what the note, `trainyard status` and the Trainyard view say too); while it goes on, `live_line`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

NOTE_TAG = "mlflow.note.content"
"""The tag MLflow's UI shows and edits as a run's description."""

_LIVE = {
    "pending": "Pending: waiting for its first attempt.",
    "running": "Running.",
    "recovering": "Recovering: an attempt failed and the next one is on its way.",
}


@dataclass(frozen=True)
class RunLinks:
    """Where else the run is shown: each attempt's DAG run (label, URL), the Trainyard view."""

    dag_runs: Sequence[tuple[str, str]] = field(default_factory=tuple)
    view_url: str = ""


def live_line(state: str, reason: str = "") -> str:
    """One sentence for a run that goes on: its lifecycle state and, where known, why."""
    line = _LIVE.get(state, f"{state.capitalize()}.")
    return f"{line[:-1]}: {reason.rstrip('.')}." if reason else line


def run_description(*, job: str, run: str, outcome: str, links: RunLinks) -> str:
    """The Markdown of the description: the outcome in bold, then the links, then who it is."""
    lines = [f"**{_md(outcome)}**", ""]
    if links.view_url:
        lines.append(f"- Trainyard view: [{_md(job)} run {_md(run)}]({links.view_url})")
    for label, url in links.dag_runs:
        lines.append(f"- Airflow: [{_md(label)}]({url})")
    lines += ["", f"Job `{job}` · training run `{run}`"]
    return "\n".join(lines)


def set_run_description(run_id: str, text: str, *, tracking_uri: str) -> None:
    """Replace the run's description."""
    from trainyard.plugins.tracking.runs import client_for

    client_for(tracking_uri).set_tag(run_id, NOTE_TAG, text)


def _md(text: str) -> str:
    """Text shown as is inside Markdown (link labels, bold): its markup characters escaped."""
    return "".join("\\" + c if c in "\\`*_[]()<>#|" else c for c in text)
