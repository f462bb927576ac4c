"""What a run keeps as files in MLflow, so the run page answers "what was this job?" alone.

Params hold the spec and the plan flattened, column by column, for comparing runs; the
artifacts hold the documents a person opens to understand one run. Every path that starts a
run (`make demo`, `trainyard launch --local`, the DAG's tasks) calls these functions, so every
run has the same files:

| artifact | written by | what |
|---|---|---|
| `spec/<job>.yaml` | `log_start_artifacts` | the TrainingJob as run (credential-like env redacted) |
| `plan/explanation.txt`, `plan/explanation.json` | `log_start_artifacts` | the plan in words and as JSON, with the advisor's alternatives and rejections |
| `data_quality/report.json`, `data_quality/report.html` | `log_start_artifacts` (given a report) | the data-quality checks and their failing rows |
| `plots/loss.png` | `log_end_artifacts` | `loss` by step from the run itself, `loss.replay` (steps a resumed attempt recomputed) dotted, a line at each recovery event |
| `recovery/timeline.json`, `recovery/timeline.txt` | `log_end_artifacts` | the recovery events the run recorded with what each cost (detection, restart, time to train again, steps and device-hours lost), and the caller's own timeline if it has one |

Logging the same artifact again replaces it (a retried task, a resumed attempt): each file is
the latest truth, never a duplicate. Nothing here raises for a missing optional part; an
artifact that cannot be built (no `loss` yet for a plot) is left out and said in the log.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.advisor.planner import PlanResult
    from trainyard.plugins.tracking.runs import RecoveryEvent
    from trainyard.plugins.validation.data_quality import DataQualityReport

log = logging.getLogger(__name__)

LOSS_PLOT = "plots/loss.png"
TIMELINE_JSON = "recovery/timeline.json"
TIMELINE_TEXT = "recovery/timeline.txt"
RANK_LOGS = "logs"
"""`logs/attempt-N/rank-NNNNN.log`: each attempt's rank output, attached when the run ends."""
MAX_LOG_BYTES = 8 << 20
"""A rank log longer than this is attached as its last 8 MiB (a first line says so)."""


class TimelineEntry(BaseModel):
    """One moment of a run as its caller saw it (`attempt 0 launched on local-0`)."""

    model_config = ConfigDict(frozen=True)

    at_s: float
    """Seconds since the run was submitted."""
    event: str


def log_start_artifacts(
    run_id: str,
    job: TrainingJob,
    plan: Plan,
    *,
    tracking_uri: str,
    advice: PlanResult | None = None,
    plan_source: str = "",
    quality: DataQualityReport | None = None,
) -> list[str]:
    """The spec, the plan's explanation and (given) the data-quality report; returns the paths.

    `advice` is the advisor's answer the attempt planned with (its alternatives and
    rejections): tracking explains what was searched, never searches again. Without it (a spec
    the advisor cannot plan, a manual plan) the explanation holds the plan alone."""
    import yaml

    from trainyard.plugins.advisor.explain import explanation_json, explanation_text
    from trainyard.plugins.tracking.params import redacted_spec
    from trainyard.plugins.tracking.runs import client_for

    client = client_for(tracking_uri)
    spec_path = f"spec/{job.name}.yaml"
    client.log_text(run_id, yaml.safe_dump(redacted_spec(job), sort_keys=False, allow_unicode=True), spec_path)
    client.log_text(run_id, explanation_text(plan, advice, source=plan_source), "plan/explanation.txt")
    client.log_dict(run_id, explanation_json(plan, advice), "plan/explanation.json")
    paths = [spec_path, "plan/explanation.txt", "plan/explanation.json"]
    if quality is not None:
        paths += log_data_quality(run_id, quality, tracking_uri=tracking_uri)
    return paths


def log_data_quality(run_id: str, report: DataQualityReport, *, tracking_uri: str) -> list[str]:
    """The report as JSON (with its tag and metrics, `log_report`) and as a page a browser shows
    in the MLflow UI's artifact view."""
    from trainyard.plugins.tracking.runs import client_for

    log_report(report, run_id, tracking_uri=tracking_uri)
    client_for(tracking_uri).log_text(run_id, data_quality_html(report), "data_quality/report.html")
    return ["data_quality/report.json", "data_quality/report.html"]


def log_end_artifacts(
    run_id: str, *, tracking_uri: str, timeline: Sequence[TimelineEntry | tuple[float, str]] = (),
    title: str | None = None,
) -> list[str]:
    """The loss plot and the recovery timeline, from what the run recorded; returns the paths."""
    from trainyard.plugins.tracking.recoveries import record_recovery_costs
    from trainyard.plugins.tracking.runs import client_for

    client = client_for(tracking_uri)
    events = record_recovery_costs(run_id, tracking_uri=tracking_uri)  # measured now the run has ended
    entries = [e if isinstance(e, TimelineEntry) else TimelineEntry(at_s=e[0], event=e[1]) for e in timeline]
    client.log_dict(run_id, {"recovery_events": [e.model_dump(exclude_none=True) for e in events],
                             "timeline": [e.model_dump() for e in entries]}, TIMELINE_JSON)
    client.log_text(run_id, timeline_text(events, entries), TIMELINE_TEXT)
    paths = [TIMELINE_JSON, TIMELINE_TEXT]
    with tempfile.TemporaryDirectory(prefix="trainyard-plot-") as tmp:
        png = loss_plot(client, run_id, Path(tmp) / "loss.png", events=events, title=title)
        if png is not None:
            client.log_artifact(run_id, str(png), LOSS_PLOT.rsplit("/", 1)[0])
            paths.append(LOSS_PLOT)
    return paths


def log_rank_logs(run_id: str, folders: Sequence[tuple[int, Path]], *, tracking_uri: str) -> list[str]:
    """Each attempt's rank logs (`(attempt, <run folder>/ranks)`, the local launcher's) under
    `logs/attempt-N/`: a plain script's only record of what it did, and a failed rank's
    traceback beside the run's charts. Returns the artifact paths."""
    from trainyard.plugins.tracking.runs import client_for

    client, paths = client_for(tracking_uri), []
    with tempfile.TemporaryDirectory(prefix="trainyard-logs-") as tmp:
        for attempt, folder in folders:
            logs = sorted(folder.glob("rank-*.log")) if folder.is_dir() else []
            if not logs:
                continue
            where = f"{RANK_LOGS}/attempt-{attempt}"
            staged = Path(tmp) / f"attempt-{attempt}"
            staged.mkdir()
            for log in logs:
                size = log.stat().st_size
                with log.open("rb") as src, (staged / log.name).open("wb") as out:
                    if size > MAX_LOG_BYTES:
                        src.seek(size - MAX_LOG_BYTES)
                        out.write(f"[the first {size - MAX_LOG_BYTES} bytes of {log.name} are left out; "
                                  f"the whole file: {log}]\n".encode())
                    shutil.copyfileobj(src, out)
                paths.append(f"{where}/{log.name}")
            client.log_artifacts(run_id, str(staged), where)
    return paths


def log_run_artifacts(
    run_id: str, job: TrainingJob, plan: Plan, *, tracking_uri: str, advice: PlanResult | None = None,
    quality: DataQualityReport | None = None, timeline: Sequence[TimelineEntry | tuple[float, str]] = (),
) -> list[str]:
    """Everything at once, for a caller that logs at the end only."""
    return (log_start_artifacts(run_id, job, plan, tracking_uri=tracking_uri, advice=advice, quality=quality)
            + log_end_artifacts(run_id, tracking_uri=tracking_uri, timeline=timeline, title=job.name))


# -- the documents ----------------------------------------------------------------------------------

def timeline_text(events: Sequence[RecoveryEvent], entries: Sequence[TimelineEntry] = ()) -> str:
    """Recovery events (what the run recorded) and the caller's timeline, one line each."""
    lines = [f"{len(events)} recovery event(s)"]
    for e in events:
        step = f" at step {e.step}" if e.step is not None else ""
        lines.append(f"  {e.at}  attempt {e.attempt}  {e.kind}{step}" + (f": {e.detail}" if e.detail else ""))
        if costs := recovery_costs_line(e):
            lines.append(f"      {costs}")
    if entries:
        lines += ["", "timeline (seconds since submission)"]
        lines += [f"  {e.at_s:8.1f}  {e.event}" for e in entries]
    return "\n".join(lines) + "\n"


def recovery_costs_line(e: RecoveryEvent) -> str:
    """`detected in 0.26 s · restarted in 20 s · trained again after 36.5 s · 19 steps lost ·
    0.013 device-hours` — the figures known, in the order they happen."""
    parts = []
    if e.detect_s is not None:
        parts.append(f"detected in {e.detect_s:.3g} s")
    if e.restart_s is not None:
        parts.append(f"restarted in {e.restart_s:.3g} s")
    if e.time_to_train_again_s is not None:
        parts.append(f"trained again after {e.time_to_train_again_s:.3g} s")
    if e.steps_lost is not None:
        parts.append(f"{e.steps_lost} step(s) lost")
    if e.device_hours_lost is not None:
        parts.append(f"{e.device_hours_lost:.3g} device-hours")
    return " · ".join(parts)


def data_quality_html(report: DataQualityReport) -> str:
    """A self-contained page (inline CSS, no script): every check, its rows, failing examples."""
    import html

    state = "skipped" if report.skipped else ("passed" if report.success else "FAILED")
    rows = []
    for o in report.outcomes:
        examples = "".join(f"<li><code>{html.escape(x)}</code></li>" for x in o.examples)
        rows.append(
            f"<tr class=\"{'ok' if o.success else 'fail'}\"><td>{'✓' if o.success else '✗'}</td>"
            f"<td>{html.escape(o.check)}</td><td><code>{html.escape(o.expectation)}</code></td>"
            f"<td class=\"n\">{o.failing_rows} / {o.rows_checked}</td><td>{html.escape(o.observed)}"
            f"{f'<ul>{examples}</ul>' if examples else ''}</td><td><code>{html.escape(o.setting)}</code></td></tr>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>data quality: {html.escape(report.dataset_uri)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }} th, td {{ padding: 4px 10px; border-bottom: 1px solid #ddd; vertical-align: top; }}
th {{ background: #f3f3f3; text-align: left; }} td.n {{ text-align: right; }}
tr.fail td:first-child {{ color: #b00; }} tr.ok td:first-child {{ color: #070; }}
</style></head>
<body><h1>Data quality {state}</h1>
<p>{html.escape(report.dataset_uri)}: {report.rows_checked} rows from {report.shards_read} of
{report.shards_total} shard(s), checked {html.escape(report.checked_at)} with {html.escape(report.engine or "-")}.</p>
<table><thead><tr><th></th><th>check</th><th>expectation</th><th>failing rows</th><th>observed</th><th>spec setting</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
</body></html>
"""


def loss_plot(client: MlflowClient, run_id: str, path: Path, *, events: Sequence[RecoveryEvent] = (),
              title: str | None = None) -> Path | None:
    """`loss` by step, `loss.replay` dotted over it, a dashed line at each recovery event's step.
    None when the run has no `loss` (a job that failed before its first step)."""
    from trainyard.plugins.tracking.metrics import replay_key

    loss = _series(client, run_id, "loss")
    if not loss:
        log.info("run %s has no loss metric yet: no loss plot", run_id)
        return None
    replay = _series(client, run_id, replay_key("loss"))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(list(loss), list(loss.values()), lw=1.5, label="loss")
    if replay:
        ax.plot(list(replay), list(replay.values()), lw=1.5, ls=":", color="tab:green",
                label="replayed after resume")
    for i, e in enumerate(events):
        if e.step is not None:
            ax.axvline(e.step, color="red", ls="--", lw=1, label=e.kind if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{title or run_id}: one MLflow run across attempts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _series(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    """{step: value}; for a step logged twice, the later point."""
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return {m.step: m.value for m in history}


def artifact_paths(client: MlflowClient, run_id: str, folder: str = "") -> list[str]:
    """Every artifact file of the run under `folder`, recursively (for tests and `status`)."""
    out: list[str] = []
    for info in client.list_artifacts(run_id, folder or None):
        out += artifact_paths(client, run_id, info.path) if info.is_dir else [info.path]
    return sorted(out)


def log_report(report: DataQualityReport, run_id: str, *, tracking_uri: str) -> None:
    """The report as the run's artifact `data_quality/report.json`, a tag and a few metrics."""
    from trainyard.plugins.tracking.runs import client_for, log_metrics

    client = client_for(tracking_uri)
    client.log_text(run_id, report.model_dump_json(indent=2), "data_quality/report.json")
    state = "skipped" if report.skipped else ("passed" if report.success else "failed")
    client.set_tag(run_id, "trainyard.data_quality", state)
    if report.failures:
        client.set_tag(run_id, "trainyard.data_quality.failed",
                       ",".join(sorted({o.expectation for o in report.failures}))[:8000])
    if not report.skipped:
        log_metrics(client, run_id, {"data_quality/rows_checked": report.rows_checked,
                                     "data_quality/failed_checks": len(report.failures)}, step=0)
