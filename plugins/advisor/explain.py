"""A plan's explanation as plain text and JSON: what a run keeps beside its params.

`trainyard plan` prints the same facts as rich tables for a terminal; a run's artifacts need
them as a file anyone can open in the MLflow UI, months later, without the CLI: the layout, the
memory per device item by item against the budget, the time per step with its exposed
communication, the alternatives that also fit and how many layouts were rejected and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.advisor.planner import PlanResult

GiB = 2**30


def explanation_json(plan: Plan, result: PlanResult | None = None) -> dict[str, Any]:
    """`{"plan": <the plan run, every field>, "advisor": <PlanResult> or null}`."""
    return {"plan": plan.model_dump(mode="json"),
            "advisor": result.model_dump(mode="json") if result is not None else None}


def explanation_text(plan: Plan, result: PlanResult | None = None, *, source: str = "") -> str:
    """The plan in words and aligned columns (monospace), one section per concern."""
    lines = [f"plan {plan.describe()}" + (f" ({source})" if source else "")]
    if result is not None:
        lines.append(f"hardware {result.hardware}; {result.parameter_count:,} parameters; strategy "
                     f"{result.strategy}; budget {_gib(result.budget_bytes)} per device "
                     f"({result.budget_bytes / result.device_memory_bytes:.0%} of "
                     f"{_gib(result.device_memory_bytes)})")
        lines += [f"warning: {w}" for w in result.warnings]
    lines += ["", "layout"]
    lines += _rows([
        ("tensor parallel", str(plan.layout.tp)), ("pipeline parallel", f"{plan.layout.pp} ({plan.pipeline_schedule})"),
        ("virtual stages", str(plan.vpp)), ("data parallel", str(plan.layout.dp)),
        ("context parallel", str(plan.layout.cp)), ("expert parallel", str(plan.ep)),
        ("ZeRO stage", str(plan.zero_stage)),
        ("micro-batch x micro-batches", f"{plan.micro_batch_size} x {plan.num_micro_batches}"),
        ("activation checkpointing", plan.activation_checkpointing),
        ("sequence parallel", "yes" if plan.sequence_parallel else "no"),
    ])
    if plan.memory_breakdown:
        budget = result.budget_bytes if result is not None else None
        lines += ["", "memory per device (the busiest)"]
        items = sorted(plan.memory_breakdown.items(), key=lambda kv: -kv[1])
        lines += _rows([(k, _gib(v) + (f"  {v / budget:6.1%} of budget" if budget else "")) for k, v in items]
                       + [("total", _gib(plan.memory_per_gpu_bytes or 0))])
    if plan.step_time_s:
        lines += ["", "time per step (estimated)"]
        rows = [("step time", f"{plan.step_time_s:,.3f} s"), ("pipeline bubble", f"{plan.bubble_fraction or 0:.1%}")]
        rows += [(f"exposed {dim.upper()} communication", f"{s:,.3f} s ({s / plan.step_time_s:.1%})")
                 for dim, s in plan.communication_s.items() if s > 0]
        rows += [("tokens_per_s", f"{plan.tokens_per_s or 0:,.0f}"), ("mfu", f"{plan.mfu or 0:.1%}")]
        lines += _rows(rows)
    if result is not None:
        lines += _result_sections(result)
    return "\n".join(lines) + "\n"


def _result_sections(result: PlanResult) -> list[str]:
    lines: list[str] = []
    if result.alternatives:
        lines += ["", "alternatives (also fit)"]
        lines += _rows([(p.describe(), f"{_gib(p.memory_per_gpu_bytes or 0)}  {p.step_time_s or 0:,.3f} s  "
                                       f"mfu {p.mfu or 0:.1%}") for p in result.alternatives])
    lines += ["", f"{result.plans_considered:,} layouts considered, {result.plans_evaluated:,} evaluated"]
    lines += _rows([(reason.replace("_", " "), f"{n:,} rejected")
                    for reason, n in sorted(result.rejected.items(), key=lambda kv: -kv[1])])
    lines += [f"would fit: {s}" for s in result.suggestions]
    return lines


def _rows(rows: list[tuple[str, str]]) -> list[str]:
    width = max((len(k) for k, _ in rows), default=0)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


def _gib(n: int | float) -> str:
    """Bytes in the largest binary unit that keeps a digit before the point (0.38 GiB reads
    worse than 389.1 MiB; 0.00 GiB says nothing)."""
    for unit, size in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"
