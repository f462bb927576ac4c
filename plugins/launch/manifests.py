"""Kubernetes manifests for a placed job: a Volcano `Job`, the team `Queue`s, the
`PriorityClass`es, and the node-agent `DaemonSet`.

Pure functions from validated models to plain dicts (what the `kubernetes` client's
custom-objects API sends, and what `trainyard render k8s` prints as YAML).

The Volcano Job is one task per distinct `slots` value of the placement (`gang_pods.gang_tasks`:
normally the one task `worker` with `replicas` = the gang's nodes, `minAvailable` = all of them),
so its size grows with the node names alone, not with a pod template per node: the example
fleet's 1,248-node gang is one object well under the API server's limit. A task's template
*requires* the placer's nodes of that task (`kubernetes.io/hostname In [...]`, one list; with
`pin_to="rack"` only their racks, preferring those nodes) and the job's pods repel each
other per host: one pod per node, on the nodes the placer chose. Which pod lands on which of them
is the scheduler's choice.

Node ranks follow the pods, not the nodes: torchrun's c10d rendezvous (hosted by the pod
`<name>-worker-0`, `<name>` the job's name and a short digest of the run, `volcano_job_name`,
so two runs of a job never share a Volcano Job, its pods or its service) ranks the agents by
their `--local-addr`, each pod's own DNS name `$(POD_NAME).<name>` from Volcano's `svc` plugin —
`gang_pods.node_order` is that order, the one the status reader, the logs and the handle use.
So the placement chooses the nodes, and the ranks follow the scheduler's binding within them:
the placer's rack order inside the chosen nodes (which pipeline stage sits in which rack) is
not kept. c10d, not the static rendezvous: torchrun's in-place restart needs every agent to
restart its workers together in a new round; with a static one a restarted rank joins its
peers' dead round (their old store and gloo addresses) and fails. One command serves every pod
of a task, so the pod decides itself whether it hosts the store (`pod_entry`).

With `spec.source.git`, an init container fetches the pinned commit into an `emptyDir` and
torchrun runs the entrypoint from there (the image provides the environment, not the code);
without it, the entrypoint comes from the image. `to_yaml` writes the documents as plain YAML
(no anchors, UTF-8 as is) for `kubectl apply -f -`. Volcano contributes gang
admission (`minAvailable` = every worker: all pods start or none) and the team queues' fair share.
A pod template is ~9 KB and a node name a few tens of bytes, so a Job of 12,500 nodes still
fits; `render_volcano_job` refuses one past the API server's object size limit with the numbers.

Security: a job's pods pass Pod Security `restricted`, which its team's namespace enforces
(`tenancy.py`): non-root, no privilege escalation, every capability dropped, a RuntimeDefault
seccomp profile, never `privileged`, no hostPath (heartbeats go to an `emptyDir` the node agent
reads through the kubelet's folder). `restricted` refuses `IPC_LOCK`, which RDMA's pinned-memory
registration would otherwise use: on RDMA clusters the container runtime must give pods an
unlimited RLIMIT_MEMLOCK (`ipc_lock=True` adds the capability where a namespace allows it).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainyard.config.settings import DATA_CACHE_ENV, DEFAULT_DATA_CACHE_BYTES
from trainyard.plugins.launch.environment import TORCHRUN_ENV, entry_args, job_environment
from trainyard.plugins.launch.gang_pods import (
    SLOTS_ANNOTATION,
    WORKER_TASK,
    GangTask,
    gang_tasks,
    pod_host,
    rendezvous_pod,
)
from trainyard.plugins.launch.netpol import render_network_policy
from trainyard.plugins.launch.rank_exec import rank_exec_args
from trainyard.plugins.launch.tenancy import (
    TEAM_ACCOUNT,
    render_platform_namespace,
    render_teams,
    team_namespace,
)
from trainyard.plugins.placement.fairshare import BASE_PRIORITY
from trainyard.plugins.placement.inventory import RACK_LABEL, UNKNOWN_RACK

if TYPE_CHECKING:
    from trainyard.config.spec import TrainingJob
    from trainyard.config.teams import Teams
    from trainyard.config.worker_env import WorkerEnv
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.placement.model import Placement

VOLCANO_GROUP = "batch.volcano.sh"
VOLCANO_VERSION = "v1alpha1"
VOLCANO_PLURAL = "jobs"
QUEUE_GROUP = "scheduling.volcano.sh"
QUEUE_VERSION = "v1beta1"
QUEUE_PLURAL = "queues"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
START_TIMEOUT_ANNOTATION = "trainyard.io/start-timeout-s"
S3_ENDPOINT_ENV = "TRAINYARD_S3_ENDPOINT_URL"
"""`Settings.s3_endpoint_url`'s variable: the pods' store endpoint (`pod_s3_endpoint_url`)."""
DATA_CACHE_BYTES_ENV = "TRAINYARD_DATA_CACHE_BYTES"
"""`Settings.data_cache_bytes`'s variable: the cache's own bound (`KubernetesOptions.data_cache_bytes`)."""
MAX_OBJECT_BYTES = 1_400_000
"""etcd's default request limit is 1.5 MiB; stay below it with room for status."""

PRIORITY_VALUES = {name: int(value) for name, value in BASE_PRIORITY.items()}
"""Seed §4's base priorities (the placer's fair-share table), as Kubernetes PriorityClass values
(Volcano preempts by them)."""

DEFAULT_NCCL_ENV = {
    "NCCL_IB_DISABLE": "0",
    "NCCL_DEBUG": "WARN",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}
"""Seed §8's safe defaults; the advisor's `plan.nccl_env` overrides them per job."""


class KubernetesOptions(BaseModel):
    """Cluster-specific choices the spec does not (and should not) carry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str | None = None
    """The job's namespace; None: its team's (`tenancy.team_namespace`), where its pods run as the
    team's data account (`tenancy.TEAM_ACCOUNT`) unless `service_account` names another."""
    platform_namespace: str = "trainyard"
    """The control plane's ServiceAccount and the node-agent DaemonSet: not a team's namespace, and
    not under Pod Security `restricted` (the agent needs a hostPort and a hostPath)."""
    queueing: Literal["volcano", "kueue"] = "volcano"
    """What admits a gang: `volcano` — a Volcano Job (one object, `minAvailable` = every pod) in
    its team's Volcano Queue, scheduled by Volcano; `kueue` — a suspended batch/v1 Indexed Job in
    its team's LocalQueue, unsuspended by Kueue once the whole gang fits the team's quota, its
    pods scheduled by the default scheduler (`kueue_job.py`, `kueue_queues.py`)."""
    scheduler_name: str = ""
    """The pods' scheduler; '' = the queueing's own (`volcano`, or `default-scheduler` with Kueue)."""
    rdma_resource: str | None = "rdma/rdma_shared_device_a"
    """Device-plugin resource for the InfiniBand HCA (Mellanox shared-device plugin's default
    name); None on clusters without RDMA."""
    rdma_per_pod: int = 1
    shm_size: str = "64Gi"
    """`/dev/shm` (memory-backed): NCCL and DataLoader workers need far more than the 64 MiB default."""
    master_port: int = 29500
    run_as_user: int = 1000
    termination_grace_s: int = 300
    """Time for the emergency checkpoint after SIGTERM (DESIGN §5, preempted)."""
    heartbeat_root: str = "/var/run/trainyard/heartbeats"
    """Where the workers write heartbeats in their pods (and, with a hostPath, the node's folder)."""
    heartbeat_volume: Literal["emptyDir", "hostPath"] = "emptyDir"
    """`emptyDir`: what Pod Security `restricted` allows; the node agent reads every pod's copy
    under the kubelet's folder (`kubelet_pods_dir`). `hostPath`: the node's `heartbeat_root`,
    shared as is (a namespace at `privileged`; the test harness's emulated kubelet)."""
    kubelet_pods_dir: str = "/var/lib/kubelet/pods"
    """The kubelet's `--root-dir`/pods on the nodes, where it keeps each pod's `emptyDir` volumes."""
    kubelet_pods_mount: str = "/host/kubelet-pods"
    """Where the node agent's container sees `kubelet_pods_dir` (read-only, with emptyDir
    heartbeats). A runtime makes the mount point in the image; the test harness's nodes run on
    this machine's filesystem, so it names a folder of its own (as for `heartbeat_root`)."""
    ipc_lock: bool = False
    """Add `IPC_LOCK` to GPU pods with an RDMA resource; Pod Security `restricted` refuses it."""
    run_dir: str = "/var/run/trainyard/run"
    """Where the pod's run folder (an `emptyDir`) is mounted: `TRAINYARD_RUN_DIR`, the worker's
    records (`diverged.json`, …) and `exits.jsonl`, each rank's exit as `rank_exec` writes it,
    which is also the trainer container's termination message (`terminationMessagePath`), so
    the control plane reads every rank's exit code from the pod's status."""
    platform_image: str = "ghcr.io/trainyard/trainyard:0.1.0"
    """Image of the node agent."""
    node_agent_port: int = 9400
    service_account: str | None = None
    torchrun_max_restarts: int = 0
    ttl_after_finished_s: int = 86400
    extra_labels: dict[str, str] = Field(default_factory=dict)
    pin_to: Literal["rack", "node"] = "node"
    """`node`: require the placer's nodes (hard host names, one list per task): the gang runs on
    the nodes the placer reserved for it and the health watch watches; `rack`: require the
    placer's racks, prefer its nodes (needs rack labels on the nodes) — a node taken meanwhile
    is replaced by another of its rack, which the placer did not reserve (another gang may be
    placed there: the scheduler then keeps one of them pending)."""
    git_image: str = "alpine/git:2.47.2"
    """Image of the init container that fetches `spec.source.git` (needs only `git`)."""
    source_root: str = "/workspace/source"
    """Where the fetched source is mounted; the trainer's working directory."""
    start_timeout_s: int = 600
    """How long the pods of an attempt may stay unstarted (unschedulable, image not pulled, a
    container that cannot be created) before `poll` reports the launch failed with the
    scheduler's and the kubelet's messages. Written on the Job (`trainyard.io/start-timeout-s`),
    so a launcher that re-attaches from a handle applies the same deadline."""
    fence_lost_nodes: bool = True
    """End a lost node's pods the way Kubernetes documents (`fencing.py`): once the node is
    NotReady and lost to the control plane, taint it `node.kubernetes.io/out-of-service` so the
    pod GC deletes its pods (and volumes detach) — the control plane's role then patches Nodes.
    False (an administrator's opt-out, e.g. nodes that may come back with volumes still in
    use): the stop forces those pods' API objects away (grace 0), faster but unfenced."""
    shared_filesystem: bool = False
    """The pods see one filesystem at the same paths as the control plane (the test harness's
    simulated nodes run on this machine's): `file://` stores and SQLite files are then allowed
    (`cluster_settings`), since every pod and every attempt reaches the same folder."""
    data_cache_dir: str = "/var/cache/trainyard/data"
    """Where the pod's shard cache of streamed datasets (`TRAINYARD_DATA_CACHE_DIR`, an
    `emptyDir` shared by the pod's ranks) is mounted. Without it the ranks made the cache under
    their settings' home — the image's `TRAINYARD_HOME`, owned by the image's user, not the
    pods' uid (`run_as_user`): every rank failed with PermissionError on a real cluster."""
    data_cache_bytes: int = Field(default=DEFAULT_DATA_CACHE_BYTES, gt=0)
    """The most the pod's shard cache holds (`TRAINYARD_DATA_CACHE_BYTES`: the cache evicts to
    stay under it, `plugins/data/cache.py`). Its `emptyDir` is limited to this and a tenth more
    (`data_cache_size_limit`), so a cache that outgrew its bound would have its pod evicted by
    the kubelet instead of filling the node's disk under the other pods."""
    pod_s3_endpoint_url: str | None = None
    """The object store's S3 endpoint as the pods reach it — an in-cluster Service
    (`http://minio.storage.svc:9000`) where the control plane reaches the same store by another
    address — rendered as the pods' `TRAINYARD_S3_ENDPOINT_URL`. None: the control plane's own
    (`TRAINYARD_S3_ENDPOINT_URL`, filled in by the launcher's backend), or none at all for AWS."""
    pod_mlflow_tracking_uri: str = ""
    """The MLflow tracking server as the pods reach it, their `MLFLOW_TRACKING_URI`; '': the
    control plane's own (`TRAINYARD_MLFLOW_TRACKING_URI`)."""


def data_cache_size_limit(options: KubernetesOptions) -> str:
    """The data cache's `emptyDir` limit, in bytes (a quantity without a suffix): the cache's bound
    and a tenth more, for the commit records and a fill's reservation being made."""
    return str(options.data_cache_bytes + options.data_cache_bytes // 10)


def as_pods_see_it(worker_env: WorkerEnv, options: KubernetesOptions) -> WorkerEnv:
    """`worker_env` with the tracking server as the pods reach it (`pod_mlflow_tracking_uri`);
    the control plane keeps its own view. (The S3 endpoint is not a `WorkerEnv` field: `pod_spec`
    adds `pod_s3_endpoint_url` to the pods' environment.)"""
    if not options.pod_mlflow_tracking_uri:
        return worker_env
    return worker_env.model_copy(update={"mlflow_tracking_uri": options.pod_mlflow_tracking_uri})


def scheduler_of(options: KubernetesOptions) -> str:
    return options.scheduler_name or ("default-scheduler" if options.queueing == "kueue" else "volcano")


def job_labels(job: TrainingJob, attempt: int, run: str = "") -> dict[str, str]:
    labels = {k: v for k, v in job.metadata.labels.items() if _label_ok(k, v)}
    labels.update({
        "app.kubernetes.io/name": "trainyard-job",
        "app.kubernetes.io/managed-by": "trainyard",
        "trainyard.io/job": job.metadata.name,
        "trainyard.io/team": _label_value(job.metadata.team),
        "trainyard.io/attempt": str(attempt),
    })
    if run:
        labels["trainyard.io/run"] = run
    return labels


DNS_LABEL = 63
"""A pod's hostname is one DNS label: the API server refuses a pod whose name is longer."""
MAX_NODE_DIGITS = 5
"""Pod indexes are written with up to this many digits (gangs of up to 100,000 nodes)."""
MAX_VOLCANO_NAME = 48
"""The longest Volcano Job name: its pods' hostnames (`<name>-worker-<index>`, at most 61
characters at `MAX_NODE_DIGITS`, and `<name>-worker-last-0`, 62) stay DNS labels at any gang
size, so a name never depends on the node count (a re-planned attempt keeps its run's name)."""


def volcano_job_name(job_name: str, run: str = "") -> str:
    """The Volcano Job (and headless service) of one run of a job: `<job>-<6 hex digits of the
    run>` — unique per run, stable across the run's attempts (attempt N+1 replaces N's Job), and
    at most `MAX_VOLCANO_NAME` characters, so a long job name is cut (the labels keep it whole).
    Without a run (a manifest rendered to read) the job's own name, cut the same way."""
    import hashlib

    if not run and len(job_name) <= MAX_VOLCANO_NAME:
        return job_name
    digest = hashlib.sha256((run or job_name).encode()).hexdigest()[:6]
    return f"{job_name[:MAX_VOLCANO_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def attempt_context(job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv, *, attempt: int,
                    options: KubernetesOptions | None) -> tuple[str, KubernetesOptions, WorkerEnv, dict[str, str]]:
    """What every rendering of an attempt's gang starts from, checked: the gang's name
    (`volcano_job_name`), the options with the job's namespace (its team's, where its pods run
    as the team's data account, unless the options name one), the worker environment with the
    pods' heartbeat and run folders and their view of the tracking server, and the labels."""
    options = options or KubernetesOptions()
    _check(job, plan, placement, attempt)
    if options.namespace is None:
        options = options.model_copy(update={"namespace": team_namespace(job.metadata.team),
                                             "service_account": options.service_account or TEAM_ACCOUNT})
    worker_env = as_pods_see_it(worker_env, options).model_copy(update={
        "heartbeat_dir": "/".join([options.heartbeat_root, job.metadata.name, *([worker_env.run] if worker_env.run else []),
                                   str(attempt)]),
        "run_dir": options.run_dir,
    })
    labels = job_labels(job, attempt, worker_env.run) | options.extra_labels
    return volcano_job_name(job.metadata.name, worker_env.run), options, worker_env, labels


def check_size(body: dict[str, Any], nodes: int, what: str) -> None:
    size = len(json.dumps(body))
    if size > MAX_OBJECT_BYTES:
        raise ValueError(f"the {what} for {nodes} nodes is {size:,} bytes; the API server accepts at most "
                         f"~{MAX_OBJECT_BYTES:,} (about {MAX_OBJECT_BYTES * nodes // size} nodes)")


def render_volcano_job(
    job: TrainingJob,
    plan: Plan,
    placement: Placement,
    worker_env: WorkerEnv,
    *,
    attempt: int,
    options: KubernetesOptions | None = None,
) -> dict[str, Any]:
    """The Volcano `Job` for one attempt of a placed job."""
    name, options, worker_env, labels = attempt_context(job, plan, placement, worker_env, attempt=attempt,
                                                        options=options)
    tasks = [_task(job, plan, placement, worker_env, task, labels, options)
             for task in gang_tasks([n.slots for n in placement.nodes])]
    body = {
        "apiVersion": f"{VOLCANO_GROUP}/{VOLCANO_VERSION}",
        "kind": "Job",
        "metadata": {
            "name": name, "namespace": options.namespace, "labels": labels,
            "annotations": {
                "trainyard.io/plan": plan.describe(),
                "trainyard.io/placement-score": str(placement.score),
                START_TIMEOUT_ANNOTATION: str(options.start_timeout_s),
            },
        },
        "spec": {
            "schedulerName": scheduler_of(options),
            "minAvailable": len(placement.nodes),
            "queue": job.metadata.team,
            "priorityClassName": priority_class_name(job.metadata.priority),
            "maxRetry": 0,
            "ttlSecondsAfterFinished": options.ttl_after_finished_s,
            "plugins": {"svc": [], "env": []},
            # The control plane (the job's DAG) decides every restart; Volcano only reports.
            "policies": [
                {"event": "PodEvicted", "action": "AbortJob"},
                {"event": "PodFailed", "action": "AbortJob"},
            ],
            "tasks": tasks,
        },
    }
    check_size(body, len(placement.nodes), "Volcano Job")
    return body


def _check(job: TrainingJob, plan: Plan, placement: Placement, attempt: int) -> None:
    plan.layout.check_world_size(job.spec.hardware.gpu_count)
    placed, planned = placement.layout.world_size, plan.layout.world_size
    if placed != planned:
        raise ValueError(f"placement world size {placed} != plan world size {planned}")
    if placement.job != job.metadata.name:
        raise ValueError(f"placement is for {placement.job!r}, the spec is {job.metadata.name!r}")
    if not job.spec.image:
        raise ValueError(f"spec.image is required to launch {job.metadata.name!r} on Kubernetes "
                         "(the local launcher ignores it)")
    if attempt < 0:
        raise ValueError(f"attempt must be ≥ 0, got {attempt}")
    if len(str(len(placement.nodes) - 1)) > MAX_NODE_DIGITS:
        raise ValueError(f"a gang of {len(placement.nodes)} nodes: pod hostnames would pass {DNS_LABEL} characters "
                         f"(at most 10**{MAX_NODE_DIGITS} nodes)")


def _task(job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv, task: GangTask,
          labels: dict[str, str], options: KubernetesOptions) -> dict[str, Any]:
    gpu = placement.gpu_type != "cpu"
    nodes = placement.nodes[task.first_node:task.first_node + task.replicas]
    return {
        "name": task.name,
        "replicas": task.replicas,
        "template": {
            "metadata": {"labels": dict(labels), "annotations": {SLOTS_ANNOTATION: str(task.slots)}},
            "spec": pod_spec(job, plan, placement, worker_env, task.slots, nodes, options, gpu=gpu),
        },
    }


def pod_spec(job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv, slots: int,
             nodes: Sequence[Any], options: KubernetesOptions, *, gpu: bool,
             own_host: str = "$(POD_NAME)", first_task: str = WORKER_TASK) -> dict[str, Any]:
    """The pod of a task: torchrun for `slots` local ranks, on one of `nodes` (the placement's
    nodes of the task); its node rank is its place in `gang_pods.node_order`. `own_host`: the
    pod's host name as the kubelet expands it (Volcano's pod name; an Indexed Job's
    `<job>-$(JOB_COMPLETION_INDEX)`), `first_task`: the task whose pod 0 hosts the rendezvous."""
    env = TORCHRUN_ENV | job_environment(job, plan, worker_env, gpu=gpu)
    if gpu:
        env = DEFAULT_NCCL_ENV | env
    if options.pod_s3_endpoint_url:
        env[S3_ENDPOINT_ENV] = options.pod_s3_endpoint_url
    env[DATA_CACHE_ENV] = options.data_cache_dir
    env[DATA_CACHE_BYTES_ENV] = str(options.data_cache_bytes)
    name = volcano_job_name(job.metadata.name, worker_env.run)
    secret = storage_secret_name(name, worker_env.attempt) if worker_env.storage_credentials else ""
    env_list: list[dict[str, Any]] = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": k}}} if secret and k in SECRET_ENV
        else {"name": k, "value": v} for k, v in sorted(env.items())]
    env_list.append({"name": "TRAINYARD_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    env_list.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    command = [
        # torchrun, once the pod has decided whether it hosts the rendezvous store (`pod_entry`)
        "python", "-m", "trainyard.plugins.launch.pod_entry",
        "--nnodes", str(len(placement.nodes)),
        "--nproc-per-node", str(slots),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{pod_host(name, rendezvous_pod(name, first_task))}:{options.master_port}",
        # c10d ranks the agents by this address (`gang_pods.node_order`); the kubelet expands it
        "--local-addr", pod_host(name, own_host),
        "--rdzv-id", "-".join([job.metadata.name, *([worker_env.run] if worker_env.run else []),
                                str(worker_env.attempt)]),
        "--max-restarts", str(options.torchrun_max_restarts),
        # Each rank through the one exit recorder the local launcher uses too: torchrun itself
        # exits 1 whatever a rank's code was (42 diverged, 46 OOM, …).
        *rank_exec_args(worker_env.run_dir, job.spec.source.entrypoint, entry_args(job), stdout=True),
    ]
    resources: dict[str, Any] = {}
    if gpu:
        limits = {GPU_RESOURCE: str(slots)}
        if options.rdma_resource:
            limits[options.rdma_resource] = str(options.rdma_per_pod)
        resources = {"limits": limits, "requests": dict(limits)}
    else:
        resources = {"requests": {"cpu": str(slots)}, "limits": {"cpu": str(slots)}}
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if gpu and options.rdma_resource and options.ipc_lock:
        capabilities["add"] = ["IPC_LOCK"]
    container = {
        "name": "trainer",
        "image": job.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": env_list,
        "ports": [{"name": "rendezvous", "containerPort": options.master_port, "protocol": "TCP"}],
        "terminationMessagePath": f"{worker_env.run_dir}/exits.jsonl",
        "terminationMessagePolicy": "File",
        "resources": resources,
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False,
                            "runAsNonRoot": True, "capabilities": capabilities},
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "heartbeats", "mountPath": options.heartbeat_root},
            {"name": "run", "mountPath": worker_env.run_dir},
            {"name": "data-cache", "mountPath": options.data_cache_dir},
        ],
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": options.termination_grace_s,
        "schedulerName": scheduler_of(options),
        "securityContext": {"runAsNonRoot": True, "runAsUser": options.run_as_user,
                            "runAsGroup": options.run_as_user, "fsGroup": options.run_as_user,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "affinity": affinity(job.metadata.name, nodes, options),
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": options.shm_size}},
            heartbeat_volume(options),
            {"name": "run", "emptyDir": {}},
            {"name": "data-cache", "emptyDir": {"sizeLimit": data_cache_size_limit(options)}},
        ],
    }
    if gpu:
        spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    if options.service_account:
        spec["serviceAccountName"] = options.service_account
    git = job.spec.source.git
    if git is not None:
        spec["initContainers"] = [source_init_container(git.repo, git.commit, options)]
        spec["volumes"] += [{"name": "source", "emptyDir": {}}, {"name": "git-tmp", "emptyDir": {}}]
        container["volumeMounts"].append({"name": "source", "mountPath": options.source_root, "readOnly": True})
        container["workingDir"] = options.source_root
    return spec


SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
"""The run's storage keys: in the pod as references to the attempt's Secret, never as values in
the Job (which anyone who may read Jobs, and `trainyard render`, would see)."""


def storage_secret_name(volcano_name: str, attempt: int) -> str:
    """The Secret holding one attempt's storage keys (attempt N+1's Job replaces N's, and N's
    Secret goes with N's Job: its owner)."""
    return f"{volcano_name}-storage-{attempt}"


def render_storage_secret(job: TrainingJob, worker_env: WorkerEnv, *, attempt: int, namespace: str,
                          owner: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The attempt's Secret of storage keys (None without keys of its own); `owner`: the Volcano
    Job (`apiVersion`, `kind`, `name`, `uid`) whose deletion takes it along."""
    keys = worker_env.storage_credentials
    if keys is None:
        return None
    name = storage_secret_name(volcano_job_name(job.metadata.name, worker_env.run), attempt)
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": job_labels(job, attempt, worker_env.run)}
    if owner:
        meta["ownerReferences"] = [{**owner, "controller": False, "blockOwnerDeletion": False}]
    values = keys.to_env()
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "immutable": True,
            "stringData": {k: values[k] for k in SECRET_ENV}}


def heartbeat_volume(options: KubernetesOptions) -> dict[str, Any]:
    """The job pods' `heartbeats` volume (`KubernetesOptions.heartbeat_volume`)."""
    if options.heartbeat_volume == "hostPath":
        return {"name": "heartbeats", "hostPath": {"path": options.heartbeat_root, "type": "DirectoryOrCreate"}}
    return {"name": "heartbeats", "emptyDir": {}}


def agent_heartbeat_root(options: KubernetesOptions) -> str:
    """The node agent's `--heartbeat-dir`: the hostPath itself, or a glob over every pod's
    `heartbeats` emptyDir in the kubelet's folder (`HeartbeatReader` reads only those)."""
    if options.heartbeat_volume == "hostPath":
        return options.heartbeat_root
    return f"{options.kubelet_pods_mount}/*/volumes/kubernetes.io~empty-dir/heartbeats"


def affinity(job_name: str, nodes: Sequence[Any], options: KubernetesOptions) -> dict[str, Any]:
    """Where a task's pods may run: `nodes` (the placer's for the task, one list), or with
    `pin_to="rack"` their racks, preferring those nodes; one pod of the job per node either way
    (see the module docstring)."""
    def among(key: str, values: list[str]) -> dict[str, Any]:
        return {"matchExpressions": [{"key": key, "operator": "In", "values": values}]}

    names = [n.name for n in nodes]
    racks = sorted({n.rack for n in nodes})
    # One pod of this job per node: a node rank owns a whole node's devices.
    apart = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"trainyard.io/job": job_name}}, "topologyKey": HOSTNAME_LABEL}]}}
    if options.pin_to == "node" or UNKNOWN_RACK in racks:
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [among(HOSTNAME_LABEL, names)]}}, **apart}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [among(RACK_LABEL, racks)]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": among(HOSTNAME_LABEL, names)}],
        },
        **apart,
    }


def source_init_container(repo: str, commit: str | None, options: KubernetesOptions) -> dict[str, Any]:
    """Fetch `commit` of `repo` (only that commit, depth 1) into the source volume and check
    that HEAD is that commit. `cluster_settings` refuses a spec without a pinned commit."""
    if not commit:
        raise ValueError("spec.source.git.commit is required on Kubernetes: a branch moves between pods "
                         "and attempts (pin the commit)")
    root = options.source_root
    quoted = shlex.quote(commit)
    script = "\n".join([
        "set -eu",
        f"git init -q {root}",
        f"cd {root}",
        f"git remote add origin {shlex.quote(repo)}",
        f"git fetch -q --depth 1 origin {quoted}",
        "git checkout -q --detach FETCH_HEAD",
        'head="$(git rev-parse HEAD)"',
        f'case "$head" in {quoted}*) echo "source at $head" ;; '
        f'*) echo "fetched $head, not {commit}" >&2; exit 1 ;; esac',
    ])
    return {
        "name": "source",
        "image": options.git_image,
        "command": ["sh", "-c", script],
        # The source volume is the kubelet's (root-owned, group fsGroup) and git runs as the pod's
        # user: git ≥ 2.35.2 refuses a repository in a folder another user owns ("dubious
        # ownership") unless told this one is safe.
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "GIT_CONFIG_COUNT", "value": "1"},
                {"name": "GIT_CONFIG_KEY_0", "value": "safe.directory"}, {"name": "GIT_CONFIG_VALUE_0", "value": root}],
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False, "runAsNonRoot": True,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "source", "mountPath": root}, {"name": "git-tmp", "mountPath": "/tmp"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
    }


def priority_class_name(priority: str) -> str:
    return f"trainyard-{priority}"


def render_priority_classes() -> list[dict[str, Any]]:
    return [{
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": priority_class_name(name), "labels": {"app.kubernetes.io/managed-by": "trainyard"}},
        "value": value, "globalDefault": False,
        "preemptionPolicy": "Never" if name == "preemptible" else "PreemptLowerPriority",
        "description": f"Trainyard {name} training jobs (seed §4 base priority {value}).",
    } for name, value in PRIORITY_VALUES.items()]


def render_queues(teams: Teams, total_gpus: int) -> list[dict[str, Any]]:
    """One Volcano `Queue` per team: `deserved` = guaranteed share, `capability` = hard quota
    (or the share itself for teams that may not borrow), weight ∝ share."""
    queues = []
    for name, team in sorted(teams.teams.items()):
        deserved = int(team.share * total_gpus)
        cap = team.quota_gpus if team.can_borrow else min(deserved, team.quota_gpus or deserved)
        spec: dict[str, Any] = {
            "weight": max(1, round(team.share * 100)),
            "reclaimable": True,
            "deserved": {GPU_RESOURCE: str(deserved)},
        }
        if cap is not None:
            spec["capability"] = {GPU_RESOURCE: str(cap)}
        queues.append({
            "apiVersion": f"{QUEUE_GROUP}/{QUEUE_VERSION}", "kind": "Queue",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "trainyard"}},
            "spec": spec,
        })
    return queues


def render_node_agent_daemonset(options: KubernetesOptions | None = None) -> dict[str, Any]:
    """The node agent on every GPU node: reads the workers' heartbeats, watches GPUs (NVML),
    serves /health and /metrics on `node_agent_port`. It runs in the platform's namespace
    (`options.platform_namespace`), never a team's: a hostPort and a hostPath are beyond Pod
    Security `restricted`.

    With the pods' heartbeats in `emptyDir`s (the default), the agent mounts the kubelet's pods
    folder read-only and reads each pod's `heartbeats` volume there: as root (the kubelet's folders
    are root's, mode 0750) with every capability dropped but `DAC_READ_SEARCH` (the heartbeat
    files are the workers', mode 0600), never writing.

    With a hostPath: the kubelet creates a missing one as root, mode 0755, which the non-root
    workers could not write into; an init container (root, every capability dropped — chmod of a
    directory one owns needs none) makes the root sticky and world-writable (1777, like /tmp),
    and each job writes its own `<job>/<attempt>/` below it.
    """
    options = options or KubernetesOptions()
    labels = {"app.kubernetes.io/name": "trainyard-node-agent", "app.kubernetes.io/managed-by": "trainyard"}
    port = options.node_agent_port
    # /livez answers while the process serves; /health is the full report (NVML, heartbeats),
    # fine to gate traffic on, too slow and too rich to kill the agent by.
    probe = {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 10, "timeoutSeconds": 5}
    liveness = {"httpGet": {"path": "/livez", "port": port}, "periodSeconds": 10, "timeoutSeconds": 5,
                "initialDelaySeconds": 10}
    pod: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": options.run_as_user,
                            "runAsGroup": options.run_as_user, "seccompProfile": {"type": "RuntimeDefault"}},
        # the agent never calls the API server: no token in its pod (the ServiceAccount admission
        # would mount one, a projected volume of a credential nothing uses)
        "automountServiceAccountToken": False,
        "tolerations": [{"operator": "Exists"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Exists"}]}]}}},
        "initContainers": [{
            "name": "heartbeat-dir",
            "image": options.platform_image,
            "command": ["python", "-c", f"import os; os.chmod({options.heartbeat_root!r}, 0o1777)"],
            "securityContext": {"runAsUser": 0, "runAsNonRoot": False, "privileged": False,
                                "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "heartbeats", "mountPath": options.heartbeat_root}],
        }],
        "containers": [{
            "name": "node-agent",
            "image": options.platform_image,
            # every interface of the pod: the health watcher polls it from another node
            "command": ["trainyard-node-agent", "--node", "$(NODE_NAME)", "--host", "0.0.0.0", "--port", str(port),
                        "--heartbeat-dir", agent_heartbeat_root(options)],
            "env": [
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                # NVML access through the NVIDIA container runtime, without claiming a GPU.
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            ],
            # hostPort: the agent answers on its node's own address, where the health watch finds
            # it from the Node object (`KubernetesLauncher.node_agents`) — a pod IP changes with
            # every restart and no Service could address one node's agent.
            "ports": [{"name": "metrics", "containerPort": port, "hostPort": port, "protocol": "TCP"}],
            "readinessProbe": probe,
            "livenessProbe": liveness,
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
            "securityContext": {"privileged": False, "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "heartbeats", "mountPath": options.heartbeat_root, "readOnly": True}],
        }],
        "volumes": [{"name": "heartbeats", "hostPath": {"path": options.heartbeat_root, "type": "DirectoryOrCreate"}}],
    }
    if options.heartbeat_volume == "emptyDir":
        agent = pod["containers"][0]
        del pod["initContainers"]
        agent["securityContext"] |= {"runAsUser": 0, "runAsNonRoot": False,
                                     "capabilities": {"drop": ["ALL"], "add": ["DAC_READ_SEARCH"]}}
        agent["volumeMounts"] = [{"name": "kubelet-pods", "mountPath": options.kubelet_pods_mount,
                                  "readOnly": True}]
        pod["volumes"] = [{"name": "kubelet-pods", "hostPath": {"path": options.kubelet_pods_dir, "type": "Directory"}}]
    if options.service_account:
        pod["serviceAccountName"] = options.service_account
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "trainyard-node-agent", "namespace": options.platform_namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "trainyard-node-agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}},
                "spec": pod,
            },
        },
    }


def render_all(job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv, teams: Teams,
               *, attempt: int, total_gpus: int, options: KubernetesOptions | None = None,
               endpoints: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Everything `trainyard render k8s` prints, in apply order: the platform's namespace, each
    team's namespace, quota and data ServiceAccount (`tenancy.py`), the control plane's RBAC
    (bound in every team namespace and the job's), PriorityClasses, the queues (Volcano's, or with
    `options.queueing="kueue"` Kueue's and the pods' headless Service), the node agent, the
    job's NetworkPolicy (`netpol.py`; `endpoints`: the object store's and the tracker's URLs, and
    `spec.source.git`'s repository is added) and the gang (the Volcano Job, or the Indexed Job)."""
    from trainyard.plugins.launch.rbac import render_rbac  # rbac reads this module's group names

    options = options or KubernetesOptions()
    cpu_cluster = placement.gpu_type == "cpu"
    if options.queueing == "kueue":  # (kueue_job and kueue_queues build on this module)
        from trainyard.plugins.launch.kueue_job import render_kueue_job
        from trainyard.plugins.launch.kueue_queues import render_kueue_queues

        gang, service = render_kueue_job(job, plan, placement, worker_env, attempt=attempt, options=options)
        queueing = [*render_kueue_queues(teams, total_gpus, cpu_cluster=cpu_cluster,
                                         rdma_resource=options.rdma_resource), service]
    else:
        gang = render_volcano_job(job, plan, placement, worker_env, attempt=attempt, options=options)
        queueing = render_queues(teams, total_gpus)
    selector = {k: v for k, v in gang["metadata"]["labels"].items() if k in ("trainyard.io/job", "trainyard.io/run")}
    namespace = gang["metadata"]["namespace"]
    git = job.spec.source.git
    endpoints = [*endpoints, *([git.repo] if git is not None else [])]
    policy = render_network_policy(gang["metadata"]["name"], namespace, selector, endpoints=endpoints,
                                   platform_namespace=options.platform_namespace,
                                   labels=job_labels(job, attempt, worker_env.run))
    job_namespaces = [*(team_namespace(name) for name in sorted(teams.teams)), namespace]
    return [render_platform_namespace(options.platform_namespace),
            *render_teams(teams, cpu_cluster=cpu_cluster),
            *render_rbac(options.platform_namespace, job_namespaces, queueing=options.queueing,
                        fence_lost_nodes=options.fence_lost_nodes),
            *render_priority_classes(), *queueing, render_node_agent_daemonset(options), policy, gang]


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """Multi-document YAML as people write it: no `&id001` anchors for repeated values, non-ASCII
    as is (`TP1·PP1`, not `TP1\\xB7PP1`), keys in the order built."""
    import yaml

    class PlainDumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump_all(docs, Dumper=PlainDumper, sort_keys=False, allow_unicode=True, width=120)


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _label_value(value: str) -> str:
    """Coerce into a valid label value (≤ 63 chars, alphanumeric ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:63].strip("-_.")
    return value


def _label_ok(key: str, value: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return bool(_LABEL_VALUE.match(value)) and len(value) <= 63 and 0 < len(name) <= 63
