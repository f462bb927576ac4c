"""Cost, GPU-hours by phase, MFU, and the per-team chargeback report (seed §7, §11).

A job holds `gpu_count` devices from placement to release, and every device-hour is paid for
whether or not it trains. We split that time in three phases, because each has its own fix:

- **training**: steps that moved the model forward;
- **waiting**: devices held but idle before or between stretches of training — rendezvous,
  image pull, data-loader warm-up, a gang waiting for its last member (seed §11 "scheduling
  delay"). Time in the queue *before* devices are allocated costs nothing and is not here;
- **recovery**: from a failure to training resuming, plus the steps recomputed since the last
  checkpoint (seed §10's "lost compute").

cost = GPU-hours × the type's rate (`config/rates.yaml`, or the cluster's `hourlyRateUsd`).

MFU (model FLOP/s utilisation) = tokens/s × model FLOPs per token ÷ (devices × peak FLOP/s),
with the numerator, the denominator (at the job's precision) and the ratio from
`plugins/advisor/flops.py` — the same the worker streams and the advisor predicts. Seed §7:
100k tok/s · 6·200e9 / (256 · 989e12) = 0.474.
"""

from __future__ import annotations

import csv
import datetime as dt
import html
import io
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)

from trainyard.config.quantities import readable_number
from trainyard.config.spec import Precision
from trainyard.plugins.advisor.flops import (
    flops_per_token,
    flops_per_token_6n,
    mfu,
    peak_flops_per_device,
)
from trainyard.plugins.tracking.rates import Rates, load_rates

if TYPE_CHECKING:
    from trainyard.config.cluster import Cluster
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan

log = logging.getLogger(__name__)

SECONDS_PER_HOUR = 3600.0


# -- the seed's arithmetic, one quantity per function -------------------------------------------

def gpu_hours(num_gpus: float, seconds: float) -> float:
    """Device-hours of `num_gpus` devices held for `seconds`."""
    return num_gpus * seconds / SECONDS_PER_HOUR


def expected_failures(num_gpus: float, hours: float, mtbf_hours: float) -> float:
    """Failures over a run = device-hours / per-device MTBF (seed §11: 1000·168/2000 = 84)."""
    if mtbf_hours <= 0:
        raise ValueError(f"mtbf_hours must be > 0, got {mtbf_hours}")
    return num_gpus * hours / mtbf_hours


def recovery_gpu_hours(failures: float, seconds_per_failure: float, num_gpus: float) -> float:
    """Every device of the job idles through each recovery (seed §11: 84·60 s·1000 = 1,400)."""
    return gpu_hours(num_gpus, failures * seconds_per_failure)


def pipeline_bubble_fraction(pp: int, num_micro_batches: int, vpp: int = 1) -> float:
    """Idle share of a 1F1B pipeline: (p − 1) / (m · v) (Narayanan et al. 2021; v = virtual
    stages of interleaved 1F1B). Seed §3: PP = 4, m = 32 → 3/32 = 9.4 %."""
    if pp < 1 or num_micro_batches < 1 or vpp < 1:
        raise ValueError(f"pp, num_micro_batches and vpp must be >= 1, got {pp}, {num_micro_batches}, {vpp}")
    return (pp - 1) / (num_micro_batches * vpp)


def bubble_gpu_hours(plan: Plan, training_gpu_hours: float) -> float:
    """GPU-hours of a job's training spent in the pipeline bubble under `plan` (seed §11:
    168,000 GPU-hours at PP = 4, m = 32 → 15,750; the seed's 15,792 uses the rounded 9.4 %)."""
    return training_gpu_hours * pipeline_bubble_fraction(plan.layout.pp, plan.num_micro_batches, plan.vpp)


def amortized_gpu_hour_usd(annual_cost_per_node: float, gpus_per_node: int, utilization: float = 1.0) -> float:
    """On-premise price of a *useful* device-hour (seed §11: 113,760 / (8·8760) / 0.85 = 1.91)."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    return annual_cost_per_node / (gpus_per_node * 24 * 365) / utilization


def job_flops_per_token(job: TrainingJob) -> float | None:
    """FLOPs per token of a job's model: from its hints (advisor), else 6·N from a declared
    parameter count, else None (MFU cannot be computed)."""
    hints = job.spec.parallelism.hints
    if hints is None:
        return None
    try:
        return flops_per_token(hints)
    except ValueError:
        return flops_per_token_6n(hints.model_parameters) if hints.model_parameters else None


def run_mfu(job: TrainingJob, tokens_per_s: float, *, cluster: Cluster | None = None) -> float | None:
    """MFU of a job at a measured whole-job throughput, on its declared devices."""
    fpt = job_flops_per_token(job)
    if fpt is None:
        return None
    hw, hints = job.spec.hardware, job.spec.parallelism.hints
    precision = hints.mixed_precision if hints is not None else "bf16"
    return mfu(tokens_per_s, fpt, hw.gpu_count, peak_flops_per_device(hw.gpu_type, precision, cluster))


# -- one job ----------------------------------------------------------------------------------------

class RunAccounting(BaseModel):
    """What the control plane measured about one job (all its attempts): the input of cost."""

    model_config = ConfigDict(frozen=True)

    job: str
    team: str
    project: str = "default"
    gpu_type: str
    gpu_count: PositiveInt
    submitted_at: dt.datetime
    started_at: dt.datetime | None = None
    """When devices were allocated to the first attempt."""
    ended_at: dt.datetime | None = None
    """When the last attempt released its devices (None while running)."""
    training_s: NonNegativeFloat = 0.0
    waiting_s: NonNegativeFloat = 0.0
    recovery_s: NonNegativeFloat = 0.0
    tokens: NonNegativeInt | None = None
    """Tokens trained on (over all attempts, counting recomputed steps once)."""
    precision: Precision = "bf16"
    """The job's training precision: picks the peak FLOP/s MFU is measured against."""
    tokens_per_s: NonNegativeFloat | None = None
    """Whole-job training throughput the run measured (its `tokens_per_s` metric); when absent,
    `tokens / training_s` where both are known (`throughput()`)."""
    mfu: float | None = Field(default=None, ge=0, le=1)
    """Measured MFU, if the run reported one (its `mfu` metric); otherwise computed from the
    throughput when possible."""
    run_id: str | None = None
    checkpoint_storage_gb: NonNegativeFloat = 0.0
    """Average checkpoint storage held over the period, GB."""

    @model_validator(mode="after")
    def _ordered(self) -> RunAccounting:
        if self.started_at and self.started_at < self.submitted_at:
            raise ValueError(f"started_at {self.started_at} is before submitted_at {self.submitted_at}")
        if self.started_at and self.ended_at and self.ended_at < self.started_at:
            raise ValueError(f"ended_at {self.ended_at} is before started_at {self.started_at}")
        return self

    @property
    def held_s(self) -> float:
        return self.training_s + self.waiting_s + self.recovery_s

    def throughput(self) -> float | None:
        """Tokens per second: as measured, else tokens over training time, else None."""
        if self.tokens_per_s is not None:
            return self.tokens_per_s
        return self.tokens / self.training_s if self.tokens and self.training_s > 0 else None

    def with_run_metrics(self, metrics: dict[str, float]) -> RunAccounting:
        """Fill what the control plane did not measure from the run's latest `mfu` and
        `tokens_per_s` (what the training processes streamed); a value already set stays."""
        update: dict[str, float] = {}
        if self.mfu is None and metrics.get("mfu") is not None and 0 <= metrics["mfu"] <= 1:
            update["mfu"] = float(metrics["mfu"])
        if self.tokens_per_s is None and metrics.get("tokens_per_s") is not None and metrics["tokens_per_s"] >= 0:
            update["tokens_per_s"] = float(metrics["tokens_per_s"])
        return self.model_copy(update=update) if update else self


class JobCost(BaseModel):
    """GPU-hours and dollars of one job, by phase."""

    model_config = ConfigDict(frozen=True)

    job: str
    team: str
    project: str
    gpu_type: str
    gpu_count: int
    rate_usd_per_gpu_hour: float
    training_gpu_hours: float
    waiting_gpu_hours: float
    recovery_gpu_hours: float
    total_gpu_hours: float
    training_cost_usd: float
    waiting_cost_usd: float
    recovery_cost_usd: float
    total_cost_usd: float
    idle_pct: float
    """(waiting + recovery) / total, in percent."""
    mfu: float | None = None
    tokens_per_s: float | None = None
    checkpoint_storage_cost_usd: float = 0.0


def job_cost(
    acct: RunAccounting,
    rates: Rates | None = None,
    *,
    cluster: Cluster | None = None,
    flops_per_token: float | None = None,
    months: float = 1.0,
) -> JobCost:
    """Price one job. `flops_per_token` lets MFU be computed from `tokens` when the run did
    not report MFU itself; `months` scales checkpoint storage."""
    rates = rates or load_rates()
    rate = rates.rate_for(acct.gpu_type, cluster)
    t, w, r = (gpu_hours(acct.gpu_count, s) for s in (acct.training_s, acct.waiting_s, acct.recovery_s))
    total = t + w + r
    measured = acct.mfu
    throughput = acct.throughput()
    if measured is None and flops_per_token and throughput:
        measured = mfu(throughput, flops_per_token, acct.gpu_count,
                       peak_flops_per_device(acct.gpu_type, acct.precision, cluster))
    return JobCost(
        job=acct.job, team=acct.team, project=acct.project, gpu_type=acct.gpu_type, gpu_count=acct.gpu_count,
        rate_usd_per_gpu_hour=rate, training_gpu_hours=t, waiting_gpu_hours=w, recovery_gpu_hours=r,
        total_gpu_hours=total, training_cost_usd=t * rate, waiting_cost_usd=w * rate,
        recovery_cost_usd=r * rate, total_cost_usd=total * rate,
        idle_pct=(w + r) / total * 100 if total else 0.0, mfu=measured, tokens_per_s=throughput,
        checkpoint_storage_cost_usd=acct.checkpoint_storage_gb * rates.storage_gb_month_usd * months,
    )


# -- chargeback -------------------------------------------------------------------------------------

class ChargebackRow(BaseModel):
    """One team/project over the report's period (the seed's §11 chargeback query)."""

    model_config = ConfigDict(frozen=True)

    team: str
    project: str
    num_jobs: int
    total_gpu_hours: float
    training_gpu_hours: float
    waiting_gpu_hours: float
    recovery_gpu_hours: float
    total_cost_usd: float
    training_cost_usd: float
    waiting_cost_usd: float
    recovery_cost_usd: float
    idle_pct: float
    """(waiting + recovery) GPU-hours / total GPU-hours: weighted by GPU-hours, so a large job
    counts for what it cost (the seed averages per-job percentages instead)."""
    avg_mfu_pct: float | None
    """MFU weighted by training GPU-hours, over the jobs that have one."""
    avg_tokens_per_s: float | None = None
    """Throughput of a job, weighted by training GPU-hours, over the jobs that have one."""
    checkpoint_storage_cost_usd: float


CSV_COLUMNS = tuple(ChargebackRow.model_fields)


def chargeback(
    accounts: Iterable[RunAccounting],
    rates: Rates | None = None,
    *,
    cluster: Cluster | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> list[ChargebackRow]:
    """Rows per (team, project), most expensive first. A job belongs to the period when it ended
    in [since, until) — or, still running, when it started before `until`."""
    rates = rates or load_rates()
    groups: dict[tuple[str, str], list[JobCost]] = {}
    for acct in accounts:
        if not _in_period(acct, since, until):
            continue
        groups.setdefault((acct.team, acct.project), []).append(job_cost(acct, rates, cluster=cluster))
    rows = [_row(team, project, costs) for (team, project), costs in groups.items()]
    return sorted(rows, key=lambda r: (-r.total_cost_usd, r.team, r.project))


def _in_period(acct: RunAccounting, since: dt.datetime | None, until: dt.datetime | None) -> bool:
    moment = acct.ended_at or acct.started_at or acct.submitted_at
    if acct.ended_at is None and until is not None:
        return moment < until
    return (since is None or moment >= since) and (until is None or moment < until)


def _row(team: str, project: str, costs: Sequence[JobCost]) -> ChargebackRow:
    def total(field: str) -> float:
        return sum(getattr(c, field) for c in costs)

    gpu_h = total("total_gpu_hours")
    with_mfu = [c for c in costs if c.mfu is not None and c.training_gpu_hours > 0]
    weight = sum(c.training_gpu_hours for c in with_mfu)
    with_tps = [c for c in costs if c.tokens_per_s is not None and c.training_gpu_hours > 0]
    tps_weight = sum(c.training_gpu_hours for c in with_tps)
    return ChargebackRow(
        team=team, project=project, num_jobs=len(costs), total_gpu_hours=gpu_h,
        training_gpu_hours=total("training_gpu_hours"), waiting_gpu_hours=total("waiting_gpu_hours"),
        recovery_gpu_hours=total("recovery_gpu_hours"), total_cost_usd=total("total_cost_usd"),
        training_cost_usd=total("training_cost_usd"), waiting_cost_usd=total("waiting_cost_usd"),
        recovery_cost_usd=total("recovery_cost_usd"),
        idle_pct=(total("waiting_gpu_hours") + total("recovery_gpu_hours")) / gpu_h * 100 if gpu_h else 0.0,
        avg_mfu_pct=(sum(c.mfu * c.training_gpu_hours for c in with_mfu) / weight * 100) if weight else None,  # type: ignore[operator]
        avg_tokens_per_s=(sum(c.tokens_per_s * c.training_gpu_hours for c in with_tps) / tps_weight  # type: ignore[operator]
                          if tps_weight else None),
        checkpoint_storage_cost_usd=total("checkpoint_storage_cost_usd"),
    )


def chargeback_csv(rows: Sequence[ChargebackRow]) -> str:
    """One line per team/project; numbers unrounded (spreadsheets round, reports do not)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.model_dump().items()})
    return out.getvalue()


_HTML_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("team", "Team", "s"), ("project", "Project", "s"), ("num_jobs", "Jobs", "d"),
    ("total_gpu_hours", "GPU-h", ",.1f"), ("training_gpu_hours", "training", ",.1f"),
    ("waiting_gpu_hours", "waiting", ",.1f"), ("recovery_gpu_hours", "recovery", ",.1f"),
    ("total_cost_usd", "Cost $", ",.2f"), ("recovery_cost_usd", "recovery $", ",.2f"),
    ("idle_pct", "idle %", ".1f"), ("avg_mfu_pct", "MFU %", ".1f"), ("avg_tokens_per_s", "tokens/s", ",.0f"),
    ("checkpoint_storage_cost_usd", "storage $", ",.2f"),
)


def chargeback_html(rows: Sequence[ChargebackRow], *, title: str = "GPU chargeback", period: str = "") -> str:
    """A self-contained HTML page (inline CSS, no scripts, nothing fetched) with a totals row."""
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in _HTML_COLUMNS)
    body = "\n".join("<tr>" + "".join(_cell(getattr(r, k), fmt) for k, _, fmt in _HTML_COLUMNS) + "</tr>"
                     for r in rows)
    totals = _totals(rows)
    foot = "<tr>" + "".join(_cell(totals.get(k, ""), fmt if k in totals else "s") for k, _, fmt in _HTML_COLUMNS) + "</tr>"
    subtitle = f"<p>{html.escape(period)}</p>" if period else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }}
th, td {{ padding: 4px 10px; border-bottom: 1px solid #ddd; }}
th {{ background: #f3f3f3; text-align: left; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
tfoot td {{ font-weight: bold; border-top: 2px solid #888; }}
</style></head>
<body><h1>{html.escape(title)}</h1>{subtitle}
<table><thead><tr>{head}</tr></thead>
<tbody>
{body}
</tbody>
<tfoot>{foot}</tfoot></table>
<p>GPU-hours split into training, waiting (devices held, not training) and recovery (failure to
resumed training, plus recomputed steps). Idle % = (waiting + recovery) / total.</p>
</body></html>
"""


def _totals(rows: Sequence[ChargebackRow]) -> dict[str, Any]:
    if not rows:
        return {"team": "Total"}
    summed = [k for k, _, fmt in _HTML_COLUMNS if fmt != "s" and k not in ("idle_pct", "avg_mfu_pct", "avg_tokens_per_s")]
    sums: dict[str, Any] = {k: sum(getattr(r, k) for r in rows) for k in summed}
    gpu_h = sums["total_gpu_hours"]
    sums["idle_pct"] = (sums["waiting_gpu_hours"] + sums["recovery_gpu_hours"]) / gpu_h * 100 if gpu_h else 0.0
    return {"team": "Total", **sums}


def _cell(value: Any, fmt: str) -> str:
    if value is None or value == "":
        return "<td></td>"
    if fmt == "s":
        return f"<td>{html.escape(str(value))}</td>"
    if fmt == "d":
        return f'<td class="n">{value:d}</td>'
    return f'<td class="n">{readable_number(value, int(fmt.split(".")[1][0]))}</td>'


# -- MLflow -----------------------------------------------------------------------------------------

ACCOUNTING_TAG = "trainyard.accounting"
RUN_COST_METRICS = ("training_gpu_hours", "waiting_gpu_hours", "recovery_gpu_hours", "total_gpu_hours",
                    "total_cost_usd", "recovery_cost_usd", "idle_pct")
"""What a job's run records of its cost, named as in `JobCost`, the CSV and the chargeback run."""


def log_job_cost(run_id: str, acct: RunAccounting, cost: JobCost, *, tracking_uri: str) -> None:
    """Put a job's accounting (JSON tag) and its cost (metrics) on its run, so runs compare by
    cost in the MLflow UI and the chargeback can be rebuilt from MLflow alone.

    The tag records the run's measured `mfu` and `tokens_per_s` (its latest points) when the
    caller did not know them. Those two stay the training processes' series: the cost adds no
    point to them (a step-0 point would draw a spike at the start of their charts)."""
    from trainyard.plugins.tracking.runs import client_for, log_metrics

    client = client_for(tracking_uri)
    acct = acct.with_run_metrics(client.get_run(run_id).data.metrics)
    # The field names of JobCost and the chargeback report: one name per quantity everywhere.
    metrics = {name: getattr(cost, name) for name in RUN_COST_METRICS}
    client.set_tag(run_id, ACCOUNTING_TAG, acct.model_dump_json(exclude_none=True))
    log_metrics(client, run_id, metrics, step=0)


def log_chargeback(
    rows: Sequence[ChargebackRow],
    *,
    tracking_uri: str,
    period: str,
    experiment: str = "trainyard/chargeback",
) -> str:
    """A run in `experiment` holding the report as `chargeback.csv` and `chargeback.html` plus
    total metrics; returns its id."""
    from trainyard.plugins.tracking.runs import (
        client_for,
        default_artifact_location,
        ensure_experiment,
        log_metrics,
    )

    client = client_for(tracking_uri)
    exp = ensure_experiment(client, experiment,
                            artifact_location=default_artifact_location(tracking_uri, experiment))
    run = client.create_run(exp, run_name=f"chargeback {period}".strip(),
                            tags={"trainyard.report": "chargeback", "trainyard.period": period})
    rid = run.info.run_id
    client.log_text(rid, chargeback_csv(rows), "chargeback.csv")
    client.log_text(rid, chargeback_html(rows, period=period), "chargeback.html")
    log_metrics(client, rid, {"total_cost_usd": sum(r.total_cost_usd for r in rows),
                              "total_gpu_hours": sum(r.total_gpu_hours for r in rows),
                              "recovery_gpu_hours": sum(r.recovery_gpu_hours for r in rows),
                              "num_jobs": sum(r.num_jobs for r in rows)}, step=0)
    client.set_terminated(rid, "FINISHED")
    return rid


def write_chargeback(rows: Sequence[ChargebackRow], out_dir: str | Path, *, period: str, stem: str = "chargeback"
                     ) -> tuple[Path, Path]:
    """Write the report as `<stem>.csv` and `<stem>.html` under `out_dir` (the maintenance DAG
    keeps one pair per period beside MLflow's copy); returns both paths."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, html_path = folder / f"{stem}.csv", folder / f"{stem}.html"
    csv_path.write_text(chargeback_csv(rows))
    html_path.write_text(chargeback_html(rows, period=period))
    return csv_path, html_path


def accounting_from_mlflow(tracking_uri: str, *, experiments: Sequence[str] | None = None) -> list[RunAccounting]:
    """RunAccounting for every Trainyard run (tag `trainyard.job`) in the store.

    A run with a `trainyard.accounting` tag (written by `log_job_cost`) gives it as recorded.
    Otherwise it is derived from what the run holds: devices from the spec params, allocation
    from the run's start/end times, recovery from the `trainyard.recovery_s` tag (the
    rest counted as training; waiting is unknown there and left at 0), tokens from the latest
    `tokens_total` metric and MFU from the latest `mfu` metric.
    """
    from trainyard.plugins.tracking.runs import TAG, client_for

    client = client_for(tracking_uri)
    if experiments:
        exps = [e for name in experiments if (e := client.get_experiment_by_name(name)) is not None]
    else:
        exps = list(client.search_experiments())
    ids = [e.experiment_id for e in exps]
    if not ids:
        return []
    out: list[RunAccounting] = []
    token = None
    while True:
        page = client.search_runs(ids, filter_string=f"tags.`{TAG}job` LIKE '%'", max_results=1000,
                                  page_token=token)
        for run in page:
            acct = _accounting_of(run)
            if acct is not None:
                out.append(acct)
        token = page.token
        if not token:
            return out


def _accounting_of(run: Any) -> RunAccounting | None:
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    if ACCOUNTING_TAG in tags:  # recorded; older tags lack the measured figures: the run has them
        return RunAccounting.model_validate_json(tags[ACCOUNTING_TAG]).with_run_metrics(metrics)
    try:
        started = _from_ms(run.info.start_time)
        ended = _from_ms(run.info.end_time) if run.info.end_time else None
        wall = ((ended or dt.datetime.now(dt.UTC)) - started).total_seconds()
        # what the job stood still (`recoveries.RECOVERY_SECONDS_TAG`); older runs: detection only
        recovery = min(float(tags.get("trainyard.recovery_s", tags.get("trainyard.recovery_seconds", "0"))),
                       max(wall, 0.0))
        return RunAccounting(
            job=tags["trainyard.job"], team=tags.get("trainyard.team", "unknown"),
            project=tags.get("trainyard.project", "default"), gpu_type=params["spec.hardware.gpuType"],
            gpu_count=int(params["spec.hardware.gpuCount"]), submitted_at=started, started_at=started,
            ended_at=ended, training_s=max(wall - recovery, 0.0), recovery_s=recovery,
            tokens=int(metrics["tokens_total"]) if "tokens_total" in metrics else None,
            run_id=run.info.run_id,
        ).with_run_metrics(metrics)
    except (KeyError, ValueError) as e:
        log.warning("run %s has no usable accounting (%s); left out of the report", run.info.run_id, e)
        return None


def _from_ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def accounting_from_json(text: str) -> list[RunAccounting]:
    """A JSON list of RunAccounting objects (what the control plane exports)."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"expected a JSON list of run accountings, got {type(data).__name__}")
    return [RunAccounting.model_validate(item) for item in data]
