"""`trainyard render k8s SPEC`: the Kubernetes manifests of a job, as multi-document YAML.

PriorityClasses, the teams' Volcano Queues, the node-agent DaemonSet and the job's Volcano
Job, in apply order (`trainyard render k8s job.yaml | kubectl apply -f -`). The job is placed
on the cluster inventory first (nothing is reserved), so each pod is pinned to its node.
Exit 0 rendered, 1 invalid spec / unschedulable / not renderable, 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_CODES: dict[int, str] = {1: "the spec has errors, the gang cannot be placed, or a setting cannot work in a cluster"}
"""This command's exit codes beyond the common ones (`cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("render", help="render deployment manifests for a job (Kubernetes / Volcano)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("target", choices=["k8s"], help="what to render for (k8s: Volcano on Kubernetes)")
    p.add_argument("spec", type=Path, metavar="SPEC", help="TrainingJob spec (YAML)")
    p.add_argument("--cluster", help="cluster name or file (default: the first with the spec's gpuType)")
    p.add_argument("--attempt", type=int, default=0, help="attempt number (default 0)")
    p.add_argument("--namespace", default="trainyard", help="namespace of the job (default trainyard)")
    p.add_argument("--platform-image", default=None, help="image of the node agent")
    p.add_argument("--job-only", action="store_true", help="only the Volcano Job (no queues, classes, agent)")
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from cli.common import load_checked_job
    from cli.output import err_console
    from config.settings import get_settings
    from config.teams import load_teams
    from plugins.launch.environment import build_worker_env
    from plugins.launch.manifests import KubernetesOptions, render_all, render_volcano_job
    from plugins.placement.gang import place_gang
    from plugins.placement.inventory import Inventory
    from plugins.placement.model import GangRequest, Unschedulable
    from plugins.placement.plans import plan_for_job

    try:
        loaded = load_checked_job(args.spec, args.cluster)
    except (FileNotFoundError, ValueError) as e:
        err_console.print(f"trainyard render: error: {e}")
        return 2
    if loaded is None:
        return 1
    job, cluster = loaded
    settings = get_settings()
    options = KubernetesOptions(namespace=args.namespace, **(
        {"platform_image": args.platform_image} if args.platform_image else {}))
    try:
        plan, _ = plan_for_job(job, cluster, memory_fraction=settings.memory_fraction)
        inventory = Inventory.from_cluster(cluster)
        placement = place_gang(GangRequest.for_job(job, plan, attempt=args.attempt), inventory)
        worker_env = build_worker_env(job, plan, settings, attempt=args.attempt)
        if args.job_only:
            docs = [render_volcano_job(job, plan, placement, worker_env, attempt=args.attempt, options=options)]
        else:
            docs = render_all(job, plan, placement, worker_env, load_teams(settings.teams_file),
                              attempt=args.attempt, total_gpus=inventory.total_gpus(), options=options)
    except Unschedulable as e:
        err_console.print(f"[red]unschedulable[/]: {e.reason.message}")
        return 1
    except ValueError as e:
        err_console.print(f"[red]cannot render[/]: {e}")
        return 1
    text = yaml.safe_dump_all(docs, sort_keys=False, width=120)
    if args.output:
        args.output.write_text(text)
        err_console.print(f"wrote {len(docs)} manifests to {args.output}")
    else:
        sys.stdout.write(text)
    return 0
