"""`launcher_for`: the one place that chooses a launcher (DESIGN §1, one launcher seam).

Everything else — the DAG's tasks, the training trigger, `trainyard launch`, `trainyard logs`
and `stop`, preemption — talks to the `Launcher` protocol (`plugins/launch/base.py`) of
whatever this returns. A launcher is chosen by the cluster's `mode` to start an attempt, and by
the `RunHandle`'s `kind` (the mode it was started with) to find it again in any other process.

A mode is wired when a backend is registered for it: `local` and `kubernetes` here, and any
other through `TRAINYARD_LAUNCHERS` (`{"mode": "package.module:Backend"}` — a test's fake
launcher, a site's own). A backend is a class with two class methods:

    create(settings, options, runtime) -> Launcher   # to submit an attempt
    attach(handle, settings, runtime) -> Launcher    # to poll / stop / read logs of a handle

A cluster whose mode is not wired is refused before anything is allocated
(`launch_problems`, called by validation), never with `NotImplementedError` at run time.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trainyard.plugins.errors import FatalError
from trainyard.plugins.launch.base import LaunchOptions, Runtime

if TYPE_CHECKING:
    from pathlib import Path

    from trainyard.config.cluster import Cluster
    from trainyard.config.problems import Problem
    from trainyard.config.settings import Settings
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.planner import PlanResult
    from trainyard.plugins.launch.base import Launcher
    from trainyard.plugins.run.model import RunHandle

BUILTIN: dict[str, str] = {
    "local": "trainyard.plugins.launch.backends:LocalBackend",
    "kubernetes": "trainyard.plugins.launch.backends:KubernetesBackend",
}
"""Mode → the backend class, as `module:Class` (imported when first used: cheap to import here)."""


class LauncherNotWired(FatalError):
    """A cluster mode (or a handle's kind) no launcher backend is registered for."""


class Backend(Protocol):
    @classmethod
    def create(cls, settings: Settings, options: LaunchOptions, runtime: Runtime) -> Launcher: ...

    @classmethod
    def attach(cls, handle: RunHandle, settings: Settings, runtime: Runtime) -> Launcher: ...


def wired(settings: Settings) -> dict[str, str]:
    """Every wired mode → its backend (`module:Class`)."""
    return {**BUILTIN, **settings.launchers}


def backend(mode: str, settings: Settings) -> type[Backend]:
    path = wired(settings).get(mode)
    if path is None:
        raise LauncherNotWired(f"no launcher is wired for mode {mode!r} (wired: {', '.join(sorted(wired(settings)))}); "
                               "add one with TRAINYARD_LAUNCHERS or use a cluster of a wired mode")
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise LauncherNotWired(f"the launcher for mode {mode!r} ({path}) cannot be loaded: {e}") from e


def launcher_for(target: Cluster | RunHandle, runtime: Runtime, options: LaunchOptions | None = None) -> Launcher:
    """The launcher that starts attempts on `target` (a `Cluster`: by its mode), or that finds
    the run `target` names again (a `RunHandle`: by its kind)."""
    from trainyard.plugins.run.model import RunHandle

    settings = runtime.settings
    if isinstance(target, RunHandle):
        return backend(target.kind, settings).attach(target, settings, runtime)
    opts = options or LaunchOptions()
    if target.spec.launcher and not opts.cluster_options:
        opts = opts.model_copy(update={"cluster_options": dict(target.spec.launcher)})
    return backend(target.spec.mode, settings).create(settings, opts, runtime)


def local_script(job: TrainingJob, cluster: Cluster) -> Path | None:
    """The entrypoint file the local launcher would run (None on other launchers: the script is
    in the pod's image)."""
    src = job.spec.source
    entry = src.entrypoint
    if cluster.spec.mode != "local" or not entry.endswith(".py") or src.git is not None or \
            (src.path or "").startswith("s3://"):
        return None  # in an image, a module, or a commit or prefix not fetched yet
    from trainyard.config.settings import PACKAGE_ROOT

    return (Path(src.path.removeprefix("file://")) if src.path else PACKAGE_ROOT) / entry


def entrypoint_problems(job: TrainingJob, cluster: Cluster) -> list[Problem]:
    """The entrypoint the local launcher would run is not on this host: said by the commands a
    person runs here (`trainyard validate`, `submit`, `launch`) before anything starts. Not part
    of an attempt's opening: there the launch itself refuses it, and the run ends `launch_failed`
    with that message in every surface (the host that launches may not be the one that checked)."""
    from trainyard.config.problems import Code, Problem

    if job.spec.source.path is not None and cluster.spec.mode != "local":
        return [Problem(code=Code.LAUNCHER_UNAVAILABLE, path="spec.source.path",
                        message=f"source.path is run by the local launcher only; cluster {cluster.name!r} "
                                "starts pods from an image",
                        hint="use source.git (fetched by the pods' init container) or build the code into spec.image")]
    script = local_script(job, cluster)
    if script is None or script.is_file():
        return []
    return [Problem(code=Code.LAUNCHER_UNAVAILABLE, path="spec.source.entrypoint",
                    message=f"entrypoint {job.spec.source.entrypoint!r} not found: the local launcher runs {script}",
                    hint="give the script's path, absolute or relative to that folder")]


def all_problems(job: TrainingJob, cluster: Cluster, settings: Settings, *, offline: bool = False,
                 data_quality: bool = False, advice: PlanResult | None = None) -> list[Problem]:
    """Every problem of `job` on `cluster` at once, as `trainyard validate` and an attempt's
    opening report them: where it cannot run (`launch_problems`) beside the spec's own rules and
    what the worker runtime needs — never one in place of the others; the rest of the dry run
    (the cluster's rules, memory, quota, dataset) where it can run. `advice`: the advisor's
    answer the caller already has, for the memory check (`validation.memory.advise`)."""
    from trainyard.config.rules import check_spec
    from trainyard.plugins.state.reservations import usage_by_team
    from trainyard.plugins.validation.dry_run import validate_job
    from trainyard.plugins.validation.runtime import check_runtime

    launch = launch_problems(job, cluster, settings)
    if any(p.severity == "error" for p in launch):
        return launch + check_spec(job) + check_runtime(job)
    usage = None if offline else usage_by_team(settings.state_db)
    return launch + validate_job(job, cluster=cluster, settings=settings, usage=usage, offline=offline,
                                 data_quality=data_quality, advice=advice)


def launch_problems(job: TrainingJob, cluster: Cluster, settings: Settings) -> list[Problem]:
    """Why this deployment cannot launch `job` on `cluster`: its devices are not on the cluster
    the launcher runs (`TRAINYARD_CLUSTER` / `--cluster`), a Kubernetes cluster and no image,
    or no launcher is wired for the cluster's mode. Checked before any device is reserved."""
    from trainyard.config.cluster import known_clusters, load_cluster
    from trainyard.config.problems import Code, Problem

    problems = []
    gpu = job.spec.hardware.gpu_type
    if gpu not in cluster.gpu_types():
        having = [name for name in known_clusters() if gpu in load_cluster(name).gpu_types()]
        fix = (f"run it where {gpu} devices are: TRAINYARD_CLUSTER={having[0]} or --cluster {having[0]}"
               if having else f"no known cluster has {gpu}; add one under config/clusters/")
        problems.append(Problem(
            code=Code.LAUNCHER_UNAVAILABLE, path="spec.hardware.gpuType",
            message=f"{gpu} devices are not on cluster {cluster.name!r} (mode {cluster.spec.mode}, "
                    f"devices: {', '.join(sorted(cluster.gpu_types()))}), the one this deployment launches on",
            hint=fix))
    git = job.spec.source.git
    if cluster.spec.mode == "local" and git is not None and not git.commit:
        problems.append(Problem(
            code=Code.LAUNCHER_UNAVAILABLE, path="spec.source.git.commit",
            message=f"{git.repo} is given without a commit: the local launcher runs a pinned commit (a branch "
                    "moves between attempts)",
            hint="pin the commit: spec.source.git.commit: <sha>"))
    elif git is not None and not git.commit:
        problems.append(Problem(
            code=Code.LAUNCHER_UNAVAILABLE, path="spec.source.git.commit", severity="warning",
            message=f"{git.repo} is given without a commit: each pod clones {git.branch!r} as it starts, so pods "
                    "started apart, and later attempts, may run different code (the lineage cannot name it)",
            hint="pin the commit: spec.source.git.commit: <sha>"))
    if cluster.spec.mode == "kubernetes" and not job.spec.image:
        problems.append(Problem(
            code=Code.LAUNCHER_UNAVAILABLE, path="spec.image", message=(
                f"cluster {cluster.name!r} runs jobs as pods, and a pod needs an image: spec.image is not set "
                "(the local launcher runs this checkout's code and ignores it)"),
            hint="set spec.image to an image holding the job's code and Trainyard's worker runtime"))
    if cluster.spec.mode not in wired(settings):
        problems.append(Problem(
            code=Code.LAUNCHER_UNAVAILABLE, path="spec.hardware.gpuType",
            message=f"cluster {cluster.name!r} has mode {cluster.spec.mode!r}, and no launcher is wired for it "
                    f"(wired: {', '.join(sorted(wired(settings)))})",
            hint="use a cluster of a wired mode, or register a launcher with TRAINYARD_LAUNCHERS"))
    return problems
