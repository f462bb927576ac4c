"""`trainyard cost report`: GPU-hours and dollars per team and project (chargeback).

Runs come from MLflow (every Trainyard run in the tracking store) or from a JSON file of
`RunAccounting` records exported by the control plane (`--from-json`). Prices come from
`config/rates.yaml`, or the cluster's `hourlyRateUsd` with `--cluster`. The report prints as a
table (or `--json`), and can be written as CSV and self-contained HTML and logged to MLflow as a
run of the experiment `trainyard/chargeback`. Exit 0 on success, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

EXIT_CODES: dict[int, str | None] = {1: None}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cost", help="GPU-hours, cost and MFU: chargeback per team and project",
                       description=__doc__.split("\n\n")[0])
    cost_sub = p.add_subparsers(dest="cost_command", metavar="ACTION", required=True)
    r = cost_sub.add_parser("report", help="chargeback report per team and project",
                            description=__doc__.split("\n\n")[1])
    period = r.add_mutually_exclusive_group()
    period.add_argument("--month", metavar="YYYY-MM", help="jobs that ended in this calendar month (UTC)")
    period.add_argument("--since", metavar="DATE", help="jobs that ended on or after this date (ISO 8601)")
    r.add_argument("--until", metavar="DATE", help="…and before this date (with --since)")
    r.add_argument("--from-json", type=Path, metavar="FILE", help="RunAccounting records instead of MLflow")
    r.add_argument("--cluster", help="use this cluster's hourlyRateUsd where it sets one")
    r.add_argument("--rates", type=Path, metavar="FILE", help="rates file (default: config/rates.yaml)")
    r.add_argument("--csv", type=Path, metavar="FILE", help="write the report as CSV")
    r.add_argument("--html", type=Path, metavar="FILE", help="write the report as an HTML page")
    r.add_argument("--log-mlflow", action="store_true", help="log CSV and HTML to MLflow (trainyard/chargeback)")
    r.add_argument("--tracking-uri", help="MLflow tracking URI (default: TRAINYARD_MLFLOW_TRACKING_URI)")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.add_argument("--wide", action="store_true", help="every column, whatever the terminal's width")
    r.set_defaults(func=report)


def parse_period(month: str | None, since: str | None, until: str | None) -> tuple[dt.datetime | None, dt.datetime | None, str]:
    """(since, until, label) in UTC; raises ValueError naming the bad value."""
    if month:
        if until:
            raise ValueError("--until goes with --since, not with --month")
        try:
            start = dt.datetime.strptime(month, "%Y-%m").replace(tzinfo=dt.UTC)
        except ValueError as e:
            raise ValueError(f"--month must look like 2026-11, got {month!r}") from e
        end = (start + dt.timedelta(days=32)).replace(day=1)
        return start, end, month
    start, end = _date(since, "--since"), _date(until, "--until")
    if start and end and end <= start:
        raise ValueError(f"--until ({until}) must be after --since ({since})")
    label = f"{since or 'start'} – {until or 'now'}" if (since or until) else "all time"
    return start, end, label


def _date(text: str | None, flag: str) -> dt.datetime | None:
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError as e:
        raise ValueError(f"{flag} must be an ISO 8601 date, got {text!r}") from e
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def report(args: argparse.Namespace) -> int:
    from trainyard.cli.output import err_console
    from trainyard.config.settings import get_settings
    from trainyard.plugins.tracking import cost
    from trainyard.plugins.tracking.rates import load_rates

    settings = get_settings()
    tracking_uri = args.tracking_uri or settings.mlflow_tracking_uri
    try:
        since, until, label = parse_period(args.month, args.since, args.until)
        rates = load_rates(args.rates)
        cluster = None
        if args.cluster:
            from trainyard.config.cluster import load_cluster

            cluster = load_cluster(args.cluster)
        if args.from_json:
            accounts = cost.accounting_from_json(args.from_json.read_text())
        else:
            accounts = cost.accounting_from_mlflow(tracking_uri)
        rows = cost.chargeback(accounts, rates, cluster=cluster, since=since, until=until)
    except (ValueError, OSError) as e:
        err_console.print(f"trainyard cost report: error: {e}")
        return 2
    if args.csv:
        args.csv.write_text(cost.chargeback_csv(rows))
    if args.html:
        args.html.write_text(cost.chargeback_html(rows, period=label))
    run_id = cost.log_chargeback(rows, tracking_uri=tracking_uri, period=label) if args.log_mlflow else None
    if args.json:
        from trainyard.cli.output import print_json

        print_json({"period": label, "rows": [r.model_dump() for r in rows], "mlflow_run_id": run_id})
    else:
        _print_table(rows, label, run_id, wide=args.wide)
    return 0


def _print_table(rows: list, label: str, run_id: str | None, *, wide: bool = False) -> None:
    from rich.markup import escape

    from trainyard.cli.output import console, print_table, row, table
    from trainyard.config.quantities import readable_number as num

    if not rows:
        console.print(f"no jobs in {escape(label)}")
        return
    t, shown = table(f"GPU chargeback, {escape(label)} (GPU-hours, US$)", [
        ("team", "left"), ("project", "left"), ("jobs", "right"), ("GPU-h", "right"), ("training", "right"),
        ("waiting", "right"), ("recovery", "right"), ("cost $", "right"), ("idle %", "right"),
        ("MFU %", "right"), ("tokens/s", "right")], wide=wide, wide_only=("training", "waiting"))
    for r in rows:
        t.add_row(*row(shown, {
            "team": escape(r.team), "project": escape(r.project), "jobs": str(r.num_jobs),
            "GPU-h": num(r.total_gpu_hours, 1), "training": num(r.training_gpu_hours, 1),
            "waiting": num(r.waiting_gpu_hours, 1), "recovery": num(r.recovery_gpu_hours, 1),
            "cost $": num(r.total_cost_usd, 2), "idle %": f"{r.idle_pct:.1f}",
            "MFU %": "-" if r.avg_mfu_pct is None else num(r.avg_mfu_pct, 1),
            "tokens/s": "-" if r.avg_tokens_per_s is None else num(r.avg_tokens_per_s, 0)}))
    print_table(t, wide=wide)
    if not wide:
        console.print("[dim]--wide adds GPU-hours training and waiting[/]")
    if run_id:
        console.print(f"logged to MLflow run {run_id} (experiment trainyard/chargeback)")
