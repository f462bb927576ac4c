"""What several subcommands do the same way: load a spec, check it against its cluster, and
say what is wrong in the `validate` format before doing anything else."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.config.cluster import Cluster
    from trainyard.config.problems import Problem
    from trainyard.config.spec import TrainingJob


def load_checked_job(spec: Path, cluster_name: str | None, *, to_run: bool = False
                     ) -> tuple[TrainingJob, Cluster] | None:
    """Load a spec and check it (spec rules + cluster rules). Prints its problems to stderr and
    returns None when it has errors. Without `cluster_name`, the configured cluster is used if
    it has the spec's GPU type, else the first cluster that does — for a preview (`plan`,
    `place`, `render`). `to_run` (`submit`): the cluster is the one this deployment launches on
    (`cluster_name`, else `TRAINYARD_CLUSTER`) and its launcher must provide the spec's devices
    (`plugins.attempt.launchers.launch_problems`, which names the cluster that would). A cluster
    that does not exist raises FileNotFoundError (a usage error for the caller)."""
    from trainyard.config.cluster import cluster_for, load_cluster
    from trainyard.config.loader import read_spec_file
    from trainyard.config.rules import check_against_cluster, check_spec
    from trainyard.config.settings import get_settings

    settings = get_settings()
    explicit = load_cluster(cluster_name) if cluster_name else None
    job, problems = read_spec_file(spec)
    cluster = None
    if job is not None and to_run:
        from trainyard.plugins.attempt.launchers import entrypoint_problems, launch_problems

        cluster = explicit or load_cluster(settings.cluster)
        problems = launch_problems(job, cluster, settings) + entrypoint_problems(job, cluster)
        refused = any(p.severity == "error" for p in problems)
        problems += check_spec(job) + ([] if refused else check_against_cluster(job, cluster))
    elif job is not None:
        cluster = explicit or cluster_for(job.spec.hardware.gpu_type, settings.cluster)
        problems = check_spec(job) + check_against_cluster(job, cluster)
    if job is None or cluster is None or any(p.severity == "error" for p in problems):
        print_problems(problems)
        return None
    return job, cluster


def print_problems(problems: list[Problem]) -> None:
    """Problems on stderr, one per line, as `trainyard validate` prints them."""
    from rich.markup import escape

    from trainyard.cli.output import err_console

    for p in problems:
        style = "red" if p.severity == "error" else "yellow"
        err_console.print(f"[{style}]{p.code.value}[/] {escape(p.render())}")
