"""Settings that work on this machine and cannot work in a cluster's pods.

The embedded default keeps everything on this machine: objects in a local folder
(`file:///…/.trainyard/objects`), MLflow in a SQLite file. Copied into a pod, such a URI names
a folder *inside the container*: every pod writes its own checkpoints nobody else sees, each
pod gets a private, empty MLflow database, and the job "succeeds" with nothing kept. So the
Kubernetes path refuses them before a manifest leaves this machine, and warns about what
merely loses data (an empty `MLFLOW_RUN_ID`: the pods' metrics go nowhere).

| problem | severity | why |
|---|---|---|
| `file://` object store, checkpoint root, resume manifest, dataset | error | a folder inside the pod |
| SQLite or `file:` MLflow URI | error | a database inside each pod |
| empty MLflow URI | warning | no metrics at all |
| empty `MLFLOW_RUN_ID` | warning | the pods' metrics land in no run (the DAG's launch task fills it) |
| S3 endpoint on localhost | error | the pod's localhost is the pod |
| `spec.source.git` without a pinned `commit` | error | a branch moves between pods and retries |

`shared_filesystem=True` (`KubernetesOptions.shared_filesystem`) lifts the first two rows: on a
cluster whose pods see one filesystem at the same paths (the test harness's simulated nodes run
on this machine's), a `file://` store and an SQLite file are the same for every pod.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict

from trainyard.plugins.errors import FatalError

if TYPE_CHECKING:
    from trainyard.config.spec import TrainingJob
    from trainyard.config.worker_env import WorkerEnv

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


class ClusterSetting(BaseModel):
    """One setting that cannot (error) or may not (warning) work in a cluster."""

    model_config = ConfigDict(frozen=True)

    severity: Literal["error", "warning"]
    setting: str
    """The variable or spec field, as the user sets it (`TRAINYARD_OBJECT_STORE`)."""
    value: str
    message: str
    fix: str

    def render(self) -> str:
        return f"{self.setting}={self.value!r}: {self.message} ({self.fix})"


class UnsafeForCluster(FatalError):
    """Manifests with these settings would run and keep nothing; fix the settings first."""

    def __init__(self, problems: list[ClusterSetting]) -> None:
        self.problems = problems
        super().__init__("settings that cannot work in a cluster: " + "; ".join(p.render() for p in problems))


def cluster_setting_problems(job: TrainingJob, worker_env: WorkerEnv, *, s3_endpoint_url: str | None = None,
                             shared_filesystem: bool = False) -> list[ClusterSetting]:
    """Every setting of this job's pods that cannot work (error) or loses data (warning)."""
    out: list[ClusterSetting] = []
    store_fix = "use an object store every pod reaches: TRAINYARD_OBJECT_STORE=s3://bucket/prefix"
    checkpoints = "" if worker_env.checkpoint_uri.startswith(worker_env.object_store) else worker_env.checkpoint_uri
    for setting, value in (("TRAINYARD_OBJECT_STORE", worker_env.object_store),
                           ("spec.checkpoint.storage", checkpoints),
                           ("TRAINYARD_RESUME_FROM", worker_env.resume_from),
                           ("spec.dataset.source", job.spec.dataset.source if job.spec.dataset else "")):
        if value and urlparse(value).scheme == "file" and not shared_filesystem:
            out.append(ClusterSetting(severity="error", setting=setting, value=value,
                                      message="a file:// URI names a folder inside each pod, which no "
                                              "other pod and no later attempt sees", fix=store_fix))
    out += _mlflow_problems(worker_env, shared_filesystem=shared_filesystem)
    if s3_endpoint_url and (urlparse(s3_endpoint_url).hostname or "") in LOCAL_HOSTS:
        out.append(ClusterSetting(severity="error", setting="TRAINYARD_S3_ENDPOINT_URL", value=s3_endpoint_url,
                                  message="localhost in a pod is the pod itself",
                                  fix="use the store's address as the cluster sees it (a Service DNS name)"))
    git = job.spec.source.git
    if git is not None and not git.commit:
        out.append(ClusterSetting(
            severity="error", setting="spec.source.git.commit", value="",
            message=f"branch {git.branch!r} of {git.repo} moves: pods started minutes apart, or an "
                    "attempt after a failure, would run different code",
            fix="pin the commit: spec.source.git.commit: <40-hex sha>"))
    return out


def _mlflow_problems(worker_env: WorkerEnv, *, shared_filesystem: bool = False) -> list[ClusterSetting]:
    uri, run_id = worker_env.mlflow_tracking_uri, worker_env.mlflow_run_id
    server_fix = "point TRAINYARD_MLFLOW_TRACKING_URI at an MLflow server the pods reach (http://…)"
    if not uri:
        return [ClusterSetting(severity="warning", setting="MLFLOW_TRACKING_URI", value="",
                               message="the pods log no metrics", fix=server_fix)]
    scheme = urlparse(uri).scheme
    if (scheme.startswith("sqlite") or scheme in {"file", ""}) and not shared_filesystem:
        return [ClusterSetting(severity="error", setting="MLFLOW_TRACKING_URI", value=uri,
                               message="a local store: each pod would write a database of its own, "
                                       "lost with the pod", fix=server_fix)]
    if (urlparse(uri).hostname or "") in LOCAL_HOSTS:
        return [ClusterSetting(severity="error", setting="MLFLOW_TRACKING_URI", value=uri,
                               message="localhost in a pod is the pod itself",
                               fix="use the server's address as the cluster sees it (a Service DNS name)")]
    if not run_id:
        return [ClusterSetting(severity="warning", setting="MLFLOW_RUN_ID", value="",
                               message="the pods' metrics go to no run",
                               fix="the DAG's launch task sets it; by hand, pass --mlflow-run-id")]
    return []


def check_cluster_settings(job: TrainingJob, worker_env: WorkerEnv, *, s3_endpoint_url: str | None = None,
                           shared_filesystem: bool = False) -> list[ClusterSetting]:
    """Raise `UnsafeForCluster` on any error; return the warnings."""
    problems = cluster_setting_problems(job, worker_env, s3_endpoint_url=s3_endpoint_url,
                                        shared_filesystem=shared_filesystem)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise UnsafeForCluster(errors)
    return problems
