"""`trainyard place SPEC --cluster C`: where the gang would go, as a map of racks and nodes.

Shows which node hosts which TP / PP / DP groups, how many pipelines stay inside one rack and
the score breakdown; when the job cannot be placed, says why in numbers. Devices already
reserved in the platform state count as busy (`--ignore-state` for an empty cluster). Nothing
is reserved. Exit 0 placed, 1 invalid spec or unschedulable, 2 usage error.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.plugins.placement.inventory import Inventory
    from trainyard.plugins.placement.model import Placement


EXIT_CODES: dict[int, str] = {1: "the spec has errors, or the gang cannot be placed (the output says why)"}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("place", help="show where a job's gang would be placed (racks, nodes, groups)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("spec", type=Path, metavar="SPEC", help="TrainingJob spec (YAML)")
    p.add_argument("--cluster", help="cluster name or file (default: TRAINYARD_CLUSTER, or the first "
                                     "cluster that has the spec's gpuType)")
    p.add_argument("--exclude", action="append", default=[], metavar="NODE", help="never use this node")
    p.add_argument("--strict-racks", action="store_true",
                   help="require every pipeline inside one rack (otherwise a preference)")
    p.add_argument("--ignore-state", action="store_true", help="treat every device as free")
    p.add_argument("--json", action="store_true", help="print the Placement JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainyard.cli.common import load_checked_job
    from trainyard.cli.output import console, err_console, print_json
    from trainyard.config.settings import get_settings
    from trainyard.plugins.advisor.plans import plan_for_job
    from trainyard.plugins.placement.gang import place_gang
    from trainyard.plugins.placement.inventory import Inventory
    from trainyard.plugins.placement.model import GangRequest, Unschedulable

    try:
        loaded = load_checked_job(args.spec, args.cluster)
    except (FileNotFoundError, ValueError) as e:
        err_console.print(f"trainyard place: error: {e}")
        return 2
    if loaded is None:
        return 1
    job, cluster = loaded
    try:
        plan, source = plan_for_job(job, cluster, memory_fraction=get_settings().memory_fraction,
                                      allow_unfit=True)
    except ValueError as e:
        err_console.print(f"[red]no plan[/]: {e}")
        return 1
    inventory = Inventory.from_cluster(cluster)
    used: dict[str, int] = {}
    if not args.ignore_state:
        from trainyard.plugins.state.reservations import open_state

        used = open_state(get_settings().state_db).used_by_node()
    free = inventory.free_map(used)
    request = GangRequest.for_job(job, plan, exclude=frozenset(args.exclude),
                                  require_pp_in_rack=args.strict_racks)
    try:
        placement = place_gang(request, inventory, free)
    except Unschedulable as e:
        if args.json:
            print_json({"unschedulable": e.reason.model_dump()})
        else:
            err_console.print(f"[red]unschedulable[/]: {e.reason.message}")
        return 1
    if args.json:
        print_json(placement.model_dump(mode="json"))
        return 0
    console.print(render_map(placement, inventory, free, cluster_name=cluster.name,
                             plan_label=plan.describe(), plan_source=source))
    return 0


def render_map(placement: Placement, inventory: Inventory, free: dict[str, int], *,
               cluster_name: str, plan_label: str, plan_source: str) -> Any:
    """A rich renderable: summary, one line per rack used (every node as a cell), node table."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    placed = {n.name: n for n in placement.nodes}
    in_rack, pp_total = placement.pp_groups_in_one_rack()
    # Short labelled lines (80 columns); only the score terms that counted; "placement policy"
    # for the placer's choice, never a second "strategy" beside the advisor's.
    import textwrap

    terms = ", ".join(f"{k} {v:+g}" for k, v in placement.score_breakdown.items() if v != 0) or "no term"
    score = textwrap.fill(f"{placement.score + 0:g} = {terms}", width=80 - 11, subsequent_indent=" " * 11)
    nodes, racks_used = len(placement.nodes), len(placement.racks)
    head = Text.assemble(
        ("Placement ", "bold"), (placement.job, "bold cyan"), f" on {cluster_name}\n",
        ("  plan     ", "dim"), f"{plan_label}\n           {plan_source}\n",
        ("  gang     ", "dim"), f"{placement.layout.world_size} ranks: {_plural(nodes, 'node')} × "
                               f"{placement.layout.ranks_per_node}, {_plural(racks_used, 'rack')}\n",
        ("  policy   ", "dim"), f"{placement.strategy}\n",
        ("  score    ", "dim"), score,
    )
    if pp_total:
        style = "green" if in_rack == pp_total else "yellow"
        head.append(f"\n  PP groups inside one rack: {in_rack}/{pp_total}", style=style)

    racks = Table.grid(padding=(0, 1))
    racks.add_column(style="bold")
    racks.add_column()
    for rack in sorted({n.rack for n in placement.nodes}, key=lambda r: inventory.rack_order[r]):
        cells = Text()
        for node in inventory.racks[rack]:
            short = node.name.removeprefix(f"{rack}-")
            if node.name in placed:
                p = placed[node.name]
                label = f"{short}:DP{_span(p.dp_replicas)}/PP{_span(p.pp_stages)}"
                cells.append(f"[{label}]", style=f"bold {_colour(p.dp_replicas[0])}")
            elif not node.healthy:
                cells.append(f"[{short}:✗]", style="red")
            elif free.get(node.name, 0) < node.gpus:
                cells.append(f"[{short}:busy]", style="dim")
            else:
                cells.append(f"[{short}]", style="dim green")
            cells.append(" ")
        racks.add_row(rack, cells)

    from trainyard.cli.output import table as compact_table

    columns = ("node rank", "node", "rack", "ranks", "TP groups", "PP stages", "DP replicas")
    table, _ = compact_table("nodes in rank order", [(c, "right" if c == "node rank" else "left") for c in columns])
    for p in placement.nodes:
        table.add_row(str(p.node_rank), p.name, p.rack, _span(list(p.ranks)),
                      _span(p.tp_groups), _span(p.pp_stages), _span(p.dp_replicas),
                      style=_colour(p.dp_replicas[0]))
    legend = Text("cells: [node:DP replica/PP stage] this job · [node] free · busy · ✗ unhealthy", style="dim")
    return Group(head, Text(""), racks, legend, Text(""), table)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _span(values: list[int]) -> str:
    if not values:
        return "-"
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}" \
        if values == list(range(values[0], values[-1] + 1)) else ",".join(map(str, values))


_COLOURS = ("cyan", "magenta", "yellow", "blue", "green", "bright_red", "bright_cyan", "bright_magenta")


def _colour(index: int) -> str:
    return _COLOURS[index % len(_COLOURS)]
