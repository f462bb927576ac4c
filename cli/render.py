"""`trainyard render k8s SPEC`: the Kubernetes manifests of a job, as multi-document YAML.

The platform's namespace, each team's namespace with its quota, Pod Security `restricted` and
data ServiceAccount (`plugins/launch/tenancy.py`), the control plane's least-privilege
ServiceAccount and roles (`plugins/launch/rbac.py`), PriorityClasses, the teams' queues, the
node-agent DaemonSet, the job's NetworkPolicy (`plugins/launch/netpol.py`) and its gang in its
team's namespace, in apply order (`trainyard render k8s job.yaml | kubectl apply -f -`). The gang
is a Volcano Job in the teams' Volcano Queues, or with `--queueing kueue` (or the cluster file's
`spec.launcher.queueing: kueue`) a suspended Indexed Job and its headless Service in the teams'
Kueue queues (`plugins/launch/kueue_job.py`, `kueue_queues.py`). The job is placed on the cluster
inventory first (nothing is reserved): its pods require the nodes the placer chose
(`--pin-racks`: require their racks, prefer the nodes). The cluster file's `spec.launcher`
options apply; the command line's go over them.

The pods get this machine's settings (object store, MLflow). Settings that cannot work in a
pod — a `file://` store, a SQLite MLflow URI, an S3 endpoint on localhost, an unpinned
`spec.source.git` — are refused with the fix; `--force` renders anyway (to read, not to apply).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_CODES: dict[int, str] = {1: "the spec has errors, the gang cannot be placed, or a setting cannot work in a cluster"}
"""This command's exit codes beyond the common ones (`trainyard.cli.output.EXIT_CODES`), for its --help."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("render", help="render deployment manifests for a job (Kubernetes / Volcano)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("target", choices=["k8s"], help="what to render for (k8s: Volcano on Kubernetes)")
    p.add_argument("spec", type=Path, metavar="SPEC", help="TrainingJob spec (YAML)")
    p.add_argument("--cluster", help="cluster name or file (default: the first with the spec's gpuType)")
    p.add_argument("--attempt", type=int, default=0, help="attempt number (default 0)")
    p.add_argument("--namespace", default=None,
                   help="namespace of the job (default: its team's, team-<team>)")
    p.add_argument("--platform-image", default=None, help="image of the node agent")
    p.add_argument("--job-only", action="store_true",
                   help="only the gang (the Volcano Job; with Kueue the Indexed Job and its Service)")
    p.add_argument("--queueing", choices=["volcano", "kueue"], default=None,
                   help="what admits the gang (default: the cluster file's spec.launcher.queueing, else volcano)")
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    p.add_argument("--mlflow-run-id", default="", metavar="ID",
                   help="the MLflow run the pods log into (the DAG's launch task sets it)")
    p.add_argument("--pin-racks", action="store_true",
                   help="require the placer's racks and only prefer its nodes (default: require its nodes)")
    p.add_argument("--pin-nodes", action="store_true", help=argparse.SUPPRESS)  # the default now
    p.add_argument("--force", action="store_true",
                   help="render even with settings that cannot work in a cluster (to read them)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainyard.cli.common import load_checked_job
    from trainyard.cli.output import err_console
    from trainyard.config.settings import get_settings
    from trainyard.config.teams import load_teams
    from trainyard.plugins.advisor.plans import plan_for_job
    from trainyard.plugins.launch.cluster_settings import cluster_setting_problems
    from trainyard.plugins.launch.environment import build_worker_env
    from trainyard.plugins.launch.manifests import (
        KubernetesOptions,
        as_pods_see_it,
        render_all,
        render_volcano_job,
        to_yaml,
    )
    from trainyard.plugins.placement.gang import place_gang
    from trainyard.plugins.placement.inventory import Inventory
    from trainyard.plugins.placement.model import GangRequest, Unschedulable

    try:
        loaded = load_checked_job(args.spec, args.cluster)
    except (FileNotFoundError, ValueError) as e:
        err_console.print(f"trainyard render: error: {e}")
        return 2
    if loaded is None:
        return 1
    job, cluster = loaded
    settings = get_settings()
    chosen = {"namespace": args.namespace, "pin_to": "rack" if args.pin_racks else "node",
              **({"queueing": args.queueing} if args.queueing else {}),
              **({"platform_image": args.platform_image} if args.platform_image else {})}
    try:  # the cluster file's launcher options, what the command line says over them
        options = KubernetesOptions(**(dict(cluster.spec.launcher) | chosen))
    except ValueError as e:
        err_console.print(f"trainyard render: error: the cluster's spec.launcher: {e}")
        return 2
    try:
        plan, _ = plan_for_job(job, cluster, memory_fraction=settings.memory_fraction)
        inventory = Inventory.from_cluster(cluster)
        placement = place_gang(GangRequest.for_job(job, plan, attempt=args.attempt), inventory)
        from trainyard.config.runs import new_run_id

        worker_env = build_worker_env(job, plan, settings, run=new_run_id(), attempt=args.attempt,
                                      mlflow_run_id=args.mlflow_run_id)
        options = options.model_copy(update={"pod_s3_endpoint_url": options.pod_s3_endpoint_url
                                              or settings.s3_endpoint_url})  # as the launcher's backend does
        problems = cluster_setting_problems(job, as_pods_see_it(worker_env, options),
                                            s3_endpoint_url=options.pod_s3_endpoint_url)
        if not _report(problems, force=args.force):
            return 1
        if args.job_only and options.queueing == "kueue":
            from trainyard.plugins.launch.kueue_job import render_kueue_job

            docs = list(render_kueue_job(job, plan, placement, worker_env, attempt=args.attempt, options=options))
        elif args.job_only:
            docs = [render_volcano_job(job, plan, placement, worker_env, attempt=args.attempt, options=options)]
        else:
            docs = render_all(job, plan, placement, worker_env, load_teams(settings.teams_file),
                              attempt=args.attempt, total_gpus=inventory.total_gpus(), options=options,
                              endpoints=[options.pod_s3_endpoint_url or settings.object_store,
                                         options.pod_mlflow_tracking_uri or settings.mlflow_tracking_uri])
    except Unschedulable as e:
        err_console.print(f"[red]unschedulable[/]: {e.reason.message}")
        return 1
    except ValueError as e:
        err_console.print(f"[red]cannot render[/]: {e}")
        return 1
    text = to_yaml(docs)
    if args.output:
        args.output.write_text(text)
        err_console.print(f"wrote {len(docs)} manifests to {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def _report(problems: list, *, force: bool) -> bool:
    """Print the settings that cannot (error) or may not (warning) work in pods; False when an
    error stops the rendering."""
    from rich.markup import escape

    from trainyard.cli.output import err_console

    errors = [p for p in problems if p.severity == "error"]
    for p in problems:
        style = "red" if p.severity == "error" and not force else "yellow"
        err_console.print(f"[{style}]{p.severity}[/] {escape(p.setting)}={escape(repr(p.value))}: "
                          f"{escape(p.message)}\n  fix: {escape(p.fix)}")
    if errors and not force:
        err_console.print(f"[red]not rendered[/]: {len(errors)} setting(s) cannot work in a cluster "
                          "(--force renders anyway, for reading)")
        return False
    return True
