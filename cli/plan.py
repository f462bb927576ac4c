"""`trainyard plan SPEC [--cluster C] [--top K] [--json]`: how the advisor would split the job.

Human output: the plan, its memory per device item by item, step time with the exposed
communication per dimension and the pipeline bubble, tokens/s and MFU, suggested NCCL
variables, the best alternatives and how many layouts were rejected and why. `--json` prints
`{"feasible", "plan", "alternatives", "rejected"}`. With `strategy: manual` the spec's own
configuration is evaluated. Exit 0 when a plan fits, 1 when nothing fits (saying what would)
or the spec has errors, 2 on usage errors.

The cluster: `--cluster`, else the configured one (TRAINYARD_CLUSTER) when it has the spec's
gpuType, else the first cluster under config/clusters/ that has it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.advisor.planner import PlanResult

GiB = 1024**3


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


EXIT_CODES: dict[int, str] = {1: "nothing fits (the output says what would), or the spec has errors"}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan the parallelism of a TrainingJob (TP/PP/DP/FSDP, "
                                    "micro-batches, recomputation) and explain it",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("spec", type=Path, metavar="SPEC", help="spec file (YAML)")
    p.add_argument("--cluster", help="cluster name or file (default: TRAINYARD_CLUSTER when it has "
                                     "the spec's gpuType, else the first cluster that does)")
    p.add_argument("--top", type=_non_negative, default=5, metavar="K",
                   help="alternatives to show (default 5)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--memory-fraction", type=_fraction, default=None, metavar="F",
                   help="share of device memory a plan may use (default: TRAINYARD_MEMORY_FRACTION, 0.9)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainyard.cli.common import load_checked_job
    from trainyard.config.settings import get_settings

    settings = get_settings()
    try:
        loaded = load_checked_job(args.spec, args.cluster)
    except (FileNotFoundError, ValueError) as e:
        _usage_error(str(e))
        return 2
    if loaded is None:
        return 1
    job, cluster = loaded

    from trainyard.plugins.advisor.planner import plan_job

    fraction = args.memory_fraction or settings.memory_fraction
    try:
        result = plan_job(job, cluster, memory_fraction=fraction, top_k=args.top)
    except ValueError as e:
        from trainyard.cli.output import err_console

        err_console.print(f"{args.spec}: {e}", markup=False)
        return 1
    if args.json:
        from trainyard.cli.output import err_console, print_json

        print_json(result.to_json())
        for line in result.warnings:
            err_console.print(f"warning: {line}", markup=False)
        for line in result.suggestions:
            err_console.print(f"would fit: {line}", markup=False)
    else:
        _print_human(result, job_name=job.name, cluster_name=cluster.name, spec=args.spec)
    return 0 if result.feasible else 1


def _usage_error(message: str) -> None:
    from trainyard.cli.output import err_console

    err_console.print(f"trainyard plan: error: {message}", markup=False)


def _count(n: int) -> str:
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:,.2f}{suffix}"
    return str(n)


def _gib(n: float | None) -> str:
    return "—" if n is None else f"{n / GiB:,.2f} GiB"


def _print_human(result: PlanResult, *, job_name: str, cluster_name: str, spec: Path) -> None:
    from rich.markup import escape

    from trainyard.cli.output import console

    # One fact per line: the console does not wrap (soft_wrap), and 80 columns must do.
    console.print(f"[bold]{escape(job_name)}[/] on [bold]{escape(cluster_name)}[/]\n"
                  f"  [dim]hardware[/]  {escape(result.hardware)}\n"
                  f"  [dim]model[/]     {_count(result.parameter_count)} parameters; strategy {result.strategy}\n"
                  f"  [dim]budget[/]    {_gib(result.budget_bytes)} per device "
                  f"({result.budget_bytes / result.device_memory_bytes:.0%} of {_gib(result.device_memory_bytes)})")
    for line in [*result.warnings, *([result.headroom_warning] if result.headroom_warning else [])]:
        console.print(f"[yellow]warning[/] {escape(line)}")
    shown = result.best or result.evaluated
    if shown is not None:
        verdict = "[green]fits[/]" if result.feasible else "[red]does not fit[/]"
        console.print(f"\n[bold]Plan[/] {escape(shown.describe())} — {verdict}")
        _print_plan(shown, result)
    if not result.feasible:
        if result.strategy == "manual" and result.evaluated is not None:
            console.print(f"\n[red bold]The configuration does not fit[/]: it needs "
                          f"{_gib(result.evaluated.memory_per_gpu_bytes)} per device, the limit is "
                          f"{_gib(result.limit_bytes or result.device_memory_bytes)}")
        else:
            smallest = result.smallest_memory_bytes
            console.print(f"\n[red bold]Nothing fits[/] in {_gib(result.limit_bytes or result.device_memory_bytes)} per device"
                          + (f" (the least any layout needs is {_gib(smallest)})" if smallest else ""))
        for line in result.suggestions:
            console.print(f"  [cyan]would fit[/]: {escape(line)}")
    if result.alternatives:
        _print_alternatives(result.alternatives, title="Alternatives" if result.feasible
                            else "Plans that fit (strategy: auto)")
    _print_rejected(result)


def _print_plan(plan: Plan, result: PlanResult) -> None:
    from rich.table import Table

    from trainyard.cli.output import console

    layout = Table(title="Layout", show_header=False, title_justify="left")
    for label, value in (
        ("tensor parallel", plan.layout.tp), ("pipeline parallel", f"{plan.layout.pp} ({plan.pipeline_schedule})"),
        ("virtual stages", plan.vpp), ("data parallel", plan.layout.dp), ("context parallel", plan.layout.cp),
        ("expert parallel", plan.ep),
        ("ZeRO stage", f"{plan.zero_stage} ({['DDP', 'FSDP2, no reshard', 'FSDP2, no reshard', 'FSDP2 (full shard)'][plan.zero_stage]})"),
        ("micro-batch × micro-batches", f"{plan.micro_batch_size} × {plan.num_micro_batches}"),
        ("activation checkpointing", plan.activation_checkpointing),
        ("sequence parallel", "yes" if plan.sequence_parallel else "no"),
    ):
        layout.add_row(label, str(value))
    console.print(layout)

    memory = Table(title="Memory per device (the busiest)", title_justify="left")
    memory.add_column("item")
    memory.add_column("bytes", justify="right")
    memory.add_column("of budget", justify="right")
    for item, nbytes in sorted(plan.memory_breakdown.items(), key=lambda kv: -kv[1]):
        memory.add_row(item, _gib(nbytes), f"{nbytes / result.budget_bytes:.1%}")
    total = plan.memory_per_gpu_bytes or 0
    memory.add_row("[bold]total[/]", f"[bold]{_gib(total)}[/]", f"[bold]{total / result.budget_bytes:.1%}[/]")
    console.print(memory)

    if plan.step_time_s is None:
        return
    timing = Table(title="Time per step", show_header=False, title_justify="left")
    timing.add_row("step time", f"{plan.step_time_s:,.3f} s")
    timing.add_row("pipeline bubble", f"{plan.bubble_fraction or 0:.1%}")
    for dim, seconds in plan.communication_s.items():
        if seconds > 0:
            timing.add_row(f"exposed {dim.upper()} communication",
                           f"{seconds:,.3f} s ({seconds / plan.step_time_s:.1%})")
    timing.add_row("tokens/s", f"{plan.tokens_per_s or 0:,.0f}")
    timing.add_row("MFU", f"{plan.mfu or 0:.1%}")
    if plan.hfu and plan.mfu and plan.hfu > plan.mfu * 1.001:
        timing.add_row("HFU (with recomputation)", f"{plan.hfu:.1%}")
    console.print(timing)
    if plan.nccl_env:
        env = Table(title="Suggested environment", show_header=False, title_justify="left")
        for key, value in plan.nccl_env.items():
            env.add_row(key, value)
        console.print(env)


def _print_alternatives(plans: list[Plan], *, title: str) -> None:
    from rich.table import Table

    from trainyard.cli.output import console

    table = Table(title=title, title_justify="left")
    for col in ("layout", "memory", "step s", "tokens/s", "MFU"):
        table.add_column(col, justify="left" if col == "layout" else "right")
    for plan in plans:
        table.add_row(plan.describe(), _gib(plan.memory_per_gpu_bytes),
                      f"{plan.step_time_s or 0:,.3f}", f"{plan.tokens_per_s or 0:,.0f}",
                      f"{plan.mfu or 0:.1%}")
    console.print(table)


def _print_rejected(result: PlanResult) -> None:
    from rich.table import Table

    from trainyard.cli.output import console

    if not result.rejected:
        console.print(f"{result.plans_considered:,} layouts considered, none rejected")
        return
    table = Table(title=f"Rejected ({result.plans_considered:,} considered, "
                        f"{result.plans_evaluated:,} evaluated)", title_justify="left")
    table.add_column("reason")
    table.add_column("layouts", justify="right")
    for reason, count in sorted(result.rejected.items(), key=lambda kv: -kv[1]):
        table.add_row(reason.replace("_", " "), f"{count:,}")
    console.print(table)
