"""`KubernetesLauncher`: submit, poll, stop and read logs of a Volcano Job.

The engine takes the `kubernetes` client's API objects as arguments — `CustomObjectsApi` for the
Volcano objects, `CoreV1Api` for pods, nodes, events and logs — so credentials and connections
stay with the caller: Airflow tasks build them from the cncf-kubernetes provider's
`KubernetesHook` (`trainyard.operators.kubernetes_clients`, connection id from
`TRAINYARD_KUBERNETES_CONN_ID`), other callers from a kubeconfig
(`KubernetesLauncher.from_kubeconfig`), and this package never imports Airflow. Proven against
the emulated API server of `tests/support/kube/` over HTTP, with pods that really run.

One Volcano Job per run and attempt (`manifests.render_volcano_job`; its name is the run's,
`volcano_job_name`, so attempt N+1 replaces attempt N's Job once that is gone):

- **submit** creates it. A create that gets 409 re-attaches only when the existing Job is this
  very submission — same job, run and attempt labels, and the uid the caller already holds, if
  it holds one (`uid=`): a Job of the same name from another run, another attempt or another
  uid is refused (`LaunchError`), never adopted by name alone (the provider's own re-attach bug,
  apache/airflow#71743). A previous attempt's Job still being deleted is waited for
  (`delete_timeout_s`), then the create is made again; one that has ended (its verdict read
  when its attempt was concluded) is deleted first — foreground, by uid — and then waited for.
  An earlier attempt's Job that still runs is refused: it must be stopped first.
- **poll** reads the Job's phase, its PodGroup, each pod's phase, node (and whether that node is
  Ready), the trainer container's exit code, reason and termination message (every rank's own
  exit, `trainyard.plugins.launch.kube_status`) and, while it has not started, the events: a launch that
  stays unschedulable or cannot pull its image past the Job's start timeout is reported
  `failed` with the scheduler's message and the numbers, not waited on silently.
- **stop** deletes the Job with foreground propagation (uid precondition: a stale handle never
  deletes a newer attempt's Job) and each of its pods with `grace_s`, so the workers get SIGTERM
  and `grace_s` for their emergency checkpoint before SIGKILL; a gang with a pod on a lost node
  (not Ready, or lost to the health watch) is deleted at once (grace 0: without its ranks no
  emergency checkpoint can complete), and the lost node's own pods, which no kubelet will
  confirm, are ended by Kubernetes' non-graceful node shutdown path once it marks the node
  NotReady (`fencing.py`: the out-of-service taint, the pod GC).
  It waits until the Job is gone and returns the last status it saw, with the ranks' exits.
- **poll_async** is poll for the triggerer: the same reads through the provider's
  `AsyncKubernetesHook` connection (a `kubernetes_asyncio` ApiClient), the same pure reading.

API habits of Airflow's providers: transient errors (429, 5xx, dropped connections) are retried
with tenacity, waiting what `Retry-After` asks when the server says; everything else fails at
once; a delete that gets 404 is done.
"""

from __future__ import annotations

import email.utils
import logging
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes.client import V1DeleteOptions, V1Preconditions
from kubernetes.client.exceptions import ApiException
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)
from tenacity.wait import wait_base
from urllib3.exceptions import HTTPError as Urllib3HTTPError

from trainyard.plugins.launch.base import LaunchError
from trainyard.plugins.launch.cluster_settings import check_cluster_settings
from trainyard.plugins.launch.environment import run_dir_for
from trainyard.plugins.launch.fencing import (
    LOST_POD_GRACE_S,
    OUT_OF_SERVICE_KEY,
    nodes_to_fence,
    out_of_service_patch,
)
from trainyard.plugins.launch.gang_pods import node_order, pod_key, rank_ranges
from trainyard.plugins.launch.kube_status import (
    ENDED_PHASES,
    PHASES,
    Observed,
    gang_tasks_of,
    group_name,
    is_batch_job,
    job_phase,
    node_is_ready,
    owned_pods,
    pod_selector,
    reads_workload,
    run_status,
)
from trainyard.plugins.launch.manifests import (
    QUEUE_GROUP,
    QUEUE_PLURAL,
    QUEUE_VERSION,
    VOLCANO_GROUP,
    VOLCANO_PLURAL,
    VOLCANO_VERSION,
    KubernetesOptions,
    as_pods_see_it,
    render_queues,
    render_storage_secret,
    render_volcano_job,
)
from trainyard.plugins.placement.inventory import cluster_from_k8s_nodes
from trainyard.plugins.run.model import RunHandle, RunStatus

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api, CustomObjectsApi

    from trainyard.config.cluster import Cluster
    from trainyard.config.spec import TrainingJob
    from trainyard.config.teams import Teams
    from trainyard.config.worker_env import WorkerEnv
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.launch.kube_clients import KubeClients
    from trainyard.plugins.placement.model import Placement

log = logging.getLogger(__name__)

__all__ = ["PHASES", "KubernetesLauncher", "is_transient", "retry_after_s"]

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
PODGROUP_VERSION = "v1beta1"
IDENTITY_LABELS = ("trainyard.io/job", "trainyard.io/run", "trainyard.io/attempt")
"""What makes an existing Job this submission (with the uid, when the caller holds one)."""


def is_transient(exc: BaseException) -> bool:
    status = getattr(exc, "status", None)
    if isinstance(exc, ApiException) or type(exc).__name__ == "ApiException":
        return status in TRANSIENT_STATUS or not status  # status 0/None: no response at all
    return isinstance(exc, Urllib3HTTPError | ConnectionError | TimeoutError) or type(exc).__name__ in (
        "ClientConnectionError", "ClientOSError", "ServerDisconnectedError")


def retry_after_s(exc: BaseException | None) -> float | None:
    """Seconds asked by a `Retry-After` header (delta-seconds or an HTTP date), if any."""
    headers = getattr(exc, "headers", None) or {}
    value = next((v for k, v in dict(headers).items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    value = str(value).strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


class wait_retry_after(wait_base):
    """Wait what the server's `Retry-After` says (capped), else fall back to `fallback`."""

    def __init__(self, fallback: wait_base, max_s: float) -> None:
        self.fallback = fallback
        self.max_s = max_s

    def __call__(self, retry_state: Any) -> float:
        asked = retry_after_s(retry_state.outcome.exception() if retry_state.outcome else None)
        if asked is not None:
            return min(asked, self.max_s)
        return self.fallback(retry_state)


def _status_of(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


class KubernetesLauncher:
    def __init__(
        self,
        api: CustomObjectsApi,
        *,
        core_api: CoreV1Api | None = None,
        options: KubernetesOptions | None = None,
        attempts: int = 6,
        max_wait_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        delete_timeout_s: float = 120.0,
        poll_interval_s: float = 0.5,
        records_dir: str | Path | None = None,
    ) -> None:
        self.api = api
        self.records_dir = Path(records_dir) if records_dir else None
        """The control plane's own folder for an attempt's records (`<runs>/<job>/<run>/<attempt>`:
        why the gang was stopped, a person's stop request), as the local launcher's run folder
        holds them; the pods never see it. None: handles without one (those records are lost)."""
        self.core_api = core_api
        self.options = options or KubernetesOptions()
        self.attempts = attempts
        self.max_wait_s = max_wait_s
        self.sleep = sleep
        self.delete_timeout_s = delete_timeout_s
        """How long `submit` waits for a previous attempt's Job to finish deleting, and `stop`
        for the Job to be gone beyond the grace. With `options.fence_lost_nodes` a lost node's
        pods go only once Kubernetes marks it NotReady and the pod GC runs, so this must cover
        kube-controller-manager's `--node-monitor-grace-period` (50 s by default) plus the pod
        GC's 20 s period; the default 120 s does. Past it the stop reports the Job still there
        and fences nothing more (the next attempt's `submit` waits, but does not fence)."""
        self.poll_interval_s = poll_interval_s

    @classmethod
    def from_clients(cls, clients: KubeClients, **kwargs: Any) -> KubernetesLauncher:
        """A launcher over `clients` (`trainyard.plugins.launch.kube_clients`, or the Airflow adapter
        `trainyard.operators.kubernetes_clients`, which builds them from `KubernetesHook`)."""
        return cls(clients.custom, core_api=clients.core, **kwargs)

    @classmethod
    def from_kubeconfig(cls, config_file: str | None = None, context: str | None = None,
                        **kwargs: Any) -> KubernetesLauncher:
        """The default outside Airflow: the kubeconfig's context, or the pod's service account."""
        from trainyard.plugins.launch.kube_clients import clients_from_kubeconfig

        return cls.from_clients(clients_from_kubeconfig(config_file, context), **kwargs)

    def _retrying(self) -> dict[str, Any]:
        return {"retry": retry_if_exception(is_transient), "stop": stop_after_attempt(self.attempts),
                "wait": wait_retry_after(wait_exponential_jitter(multiplier=0.5, max=self.max_wait_s), self.max_wait_s),
                "reraise": True}

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return Retrying(sleep=self.sleep, **self._retrying())(fn, *args, **kwargs)

    def _core(self) -> CoreV1Api:
        if self.core_api is None:
            raise ValueError("this needs a CoreV1Api for pods, nodes and logs (pass core_api=…)")
        return self.core_api

    # --- inventory --------------------------------------------------------------------------

    def cluster(self, name: str = "kubernetes") -> Cluster:
        """The fleet as the API server sees it: GPU nodes by rack label, health from conditions."""
        nodes = self._call(self._core().list_node)
        return cluster_from_k8s_nodes(nodes.items, name=name)

    # --- queues -----------------------------------------------------------------------------

    def ensure_queues(self, teams: Teams, total_gpus: int, *, cpu_cluster: bool = False) -> list[str]:
        """Create each team's Queue, or bring an existing one's spec up to date; with Kueue
        (`options.queueing`) its ClusterQueue and LocalQueue and the flavor and priorities they
        name (`kueue_queues`; `cpu_cluster`: the slots are cores, not GPUs)."""
        if self.options.queueing == "kueue":
            return self._ensure_kueue_queues(teams, total_gpus, cpu_cluster=cpu_cluster)
        names = []
        for body in render_queues(teams, total_gpus):
            name = body["metadata"]["name"]
            try:
                self._call(self.api.create_cluster_custom_object, QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL, body)
            except ApiException as e:
                if e.status != 409:
                    raise LaunchError(f"cannot create Volcano queue {name!r}: {e.status} {e.reason}") from e
                self._call(self.api.patch_cluster_custom_object, QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL,
                           name, {"spec": body["spec"]})
            names.append(name)
        return names

    def _ensure_kueue_queues(self, teams: Teams, total_gpus: int, *, cpu_cluster: bool) -> list[str]:
        from trainyard.plugins.launch.kueue_queues import (
            KUEUE_GROUP,
            KUEUE_VERSION,
            PLURALS,
            render_kueue_queues,
        )

        names = []
        for body in render_kueue_queues(teams, total_gpus, cpu_cluster=cpu_cluster,
                                        rdma_resource=self.options.rdma_resource):
            meta, plural = body["metadata"], PLURALS[body["kind"]]
            where = (meta["namespace"],) if "namespace" in meta else ()
            create = (self.api.create_namespaced_custom_object if where else self.api.create_cluster_custom_object)
            patch = (self.api.patch_namespaced_custom_object if where else self.api.patch_cluster_custom_object)
            try:
                self._call(create, KUEUE_GROUP, KUEUE_VERSION, *where, plural, body)
            except ApiException as e:
                if e.status != 409:
                    raise LaunchError(f"cannot create Kueue {body['kind']} {meta['name']!r}: {e.status} {e.reason}: "
                                      f"{_api_message(e)}") from e
                update = {k: v for k, v in body.items() if k in ("spec", "value", "description")}
                self._call(patch, KUEUE_GROUP, KUEUE_VERSION, *where, plural, meta["name"], update)
            names.append(meta["name"])
        return names

    # --- submit -----------------------------------------------------------------------------

    def submit(self, job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv,
               *, attempt: int, uid: str = "") -> RunHandle:
        """Create the attempt's Volcano Job, or re-attach to it (see the module docstring);
        `uid`: the Job's uid when the caller already holds a handle for this attempt.

        Raises `UnsafeForCluster` (fatal) before any API call when a setting cannot work in
        pods (`trainyard.plugins.launch.cluster_settings`), `LaunchError` when the API refuses the Job
        or another Job of that name is in the way."""
        for warning in check_cluster_settings(job, as_pods_see_it(worker_env, self.options),
                                              s3_endpoint_url=self.options.pod_s3_endpoint_url,
                                              shared_filesystem=self.options.shared_filesystem):
            log.warning("%s", warning.render())
        if worker_env.storage_credentials is not None and self.core_api is None:
            raise LaunchError(f"{job.metadata.name}: the run's storage keys go into a Secret, which needs the "
                              "Kubernetes core API; build the launcher with `core_api` (`from_clients`)")
        service = None
        if self.options.queueing == "kueue":
            from trainyard.plugins.launch.kueue_job import render_kueue_job

            body, service = render_kueue_job(job, plan, placement, worker_env, attempt=attempt, options=self.options)
        else:
            body = render_volcano_job(job, plan, placement, worker_env, attempt=attempt, options=self.options)
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        group, version = api_coordinates(body["apiVersion"])
        deadline = time.monotonic() + self.delete_timeout_s
        while True:
            try:
                created = self._call(self.api.create_namespaced_custom_object, group, version,
                                     namespace, VOLCANO_PLURAL, body)
                break
            except ApiException as e:
                if e.status != 409:
                    raise LaunchError(f"cannot create Volcano Job {namespace}/{name}: {e.status} {e.reason}: "
                                      f"{_api_message(e)}") from e
            try:
                existing = self._get_job(namespace, name, body["apiVersion"])
            except ApiException as e:
                if e.status == 404:  # deleted between our create and our read: create again
                    continue
                raise
            if self._is_this_submission(existing, body, uid):
                created = existing
                log.info("Volcano Job %s/%s exists for this attempt: re-attached (uid %s)", namespace, name,
                         existing["metadata"].get("uid"))
                break
            self._refuse_or_wait(existing, body, attempt, deadline)
        self._create_storage_secret(job, worker_env, attempt, created, namespace)
        if service is not None:
            self._create_owned(created, service)
        records = ""
        if self.records_dir is not None:
            folder = run_dir_for(self.records_dir, job.metadata.name, worker_env.run, attempt)
            folder.mkdir(parents=True, exist_ok=True)
            records = str(folder)
        return RunHandle(kind="kubernetes", job=job.metadata.name, run=worker_env.run, attempt=attempt,
                         run_dir=records, world_size=placement.layout.world_size, namespace=namespace, name=name,
                         uid=str(created.get("metadata", {}).get("uid") or ""), api_version=body["apiVersion"],
                         # the placement's set until the pods are bound (`RunHandle.bound`)
                         nodes=placement.node_names, ranks_per_node=placement.layout.ranks_per_node)

    def _create_storage_secret(self, job: TrainingJob, worker_env: WorkerEnv, attempt: int,
                               created: dict[str, Any], namespace: str) -> None:
        """The attempt's storage keys as a Secret its pods reference, owned by its Job so that it
        goes with the Job; made after the Job (its owner must exist; the kubelet retries a pod
        whose Secret is not there yet). A re-attached attempt finds it made (409)."""
        meta = created.get("metadata") or {}
        owner = {"apiVersion": str(created.get("apiVersion") or f"{VOLCANO_GROUP}/{VOLCANO_VERSION}"), "kind": "Job",
                 "name": str(meta.get("name", "")), "uid": str(meta.get("uid", ""))}
        secret = render_storage_secret(job, worker_env, attempt=attempt, namespace=namespace, owner=owner)
        if secret is None or self.core_api is None:
            return
        try:
            self._call(self.core_api.create_namespaced_secret, namespace, secret)
        except ApiException as e:
            if e.status != 409:
                raise LaunchError(f"cannot create the storage Secret {namespace}/{secret['metadata']['name']}: "
                                  f"{e.status} {e.reason}: {_api_message(e)}") from e

    @staticmethod
    def _is_this_submission(existing: dict[str, Any], body: dict[str, Any], uid: str) -> bool:
        meta = existing.get("metadata") or {}
        labels, wanted = meta.get("labels") or {}, body["metadata"]["labels"]
        same = all(labels.get(k) == wanted.get(k) for k in IDENTITY_LABELS)
        return same and not meta.get("deletionTimestamp") and (not uid or meta.get("uid") == uid)

    def _refuse_or_wait(self, existing: dict[str, Any], body: dict[str, Any], attempt: int, deadline: float) -> None:
        meta = existing.get("metadata") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        labels = meta.get("labels") or {}
        if meta.get("deletionTimestamp"):
            if time.monotonic() > deadline:
                raise LaunchError(f"Volcano Job {where} (attempt {labels.get('trainyard.io/attempt')}) is still being "
                                  f"deleted after {self.delete_timeout_s:.0f} s; cannot launch attempt {attempt}")
            self.sleep(self.poll_interval_s)
            return
        ours = {k: body["metadata"]["labels"].get(k) for k in IDENTITY_LABELS}
        theirs = {k: labels.get(k) for k in IDENTITY_LABELS}
        if theirs == ours:
            raise LaunchError(f"Volcano Job {where} of this attempt is another object (uid {meta.get('uid')}) than "
                              "the handle's; refusing to adopt it by name")
        if theirs["trainyard.io/run"] == ours["trainyard.io/run"] and theirs["trainyard.io/job"] == ours["trainyard.io/job"]:
            phase = job_phase(existing)
            earlier = (theirs["trainyard.io/attempt"] or "").isdigit() and int(theirs["trainyard.io/attempt"]) < attempt
            if earlier and phase in ENDED_PHASES:
                # attempt N+1 replaces attempt N's Job: it ended (its verdict was read), so it goes
                # now, foreground (its pods first), by uid — never a Job that changed meanwhile
                log.info("Volcano Job %s of attempt %s ended (%s): deleting it for the next attempt", where,
                         theirs["trainyard.io/attempt"], phase)
                try:
                    self._delete_job(meta["namespace"], meta["name"], meta.get("uid"),
                                     api_version=str(existing.get("apiVersion") or ""))
                except ApiException as e:
                    if e.status not in (404, 409):  # gone already, or another object now: the create decides
                        raise
                self.sleep(self.poll_interval_s)
                return
            raise LaunchError(f"Volcano Job {where} already exists for attempt {theirs['trainyard.io/attempt']} "
                              f"({phase}); stop it before launching attempt {attempt}")
        raise LaunchError(f"Volcano Job {where} belongs to another run ({theirs}); refusing to adopt it by name")

    def _create_owned(self, owner: dict[str, Any], doc: dict[str, Any]) -> None:
        """Create `doc` (a core object: the Kueue path's headless Service) owned by the gang's
        Job, so that it goes with it; a re-attached attempt finds it made (409)."""
        from trainyard.plugins.launch.kueue_job import owned_by

        meta = doc["metadata"]
        try:
            self._call(self._core().create_namespaced_service, meta["namespace"], owned_by(doc, owner))
        except ApiException as e:
            if e.status != 409:
                raise LaunchError(f"cannot create {doc['kind']} {meta['namespace']}/{meta['name']}: {e.status} "
                                  f"{e.reason}: {_api_message(e)}") from e

    def _delete_job(self, namespace: str, name: str, uid: str | None, grace_s: int | None = None,
                    api_version: str = "") -> None:
        """Delete a Volcano Job with foreground propagation (its pods first), only if it is still
        the object `uid` names (a precondition: a newer Job of the same name is never deleted)."""
        options = V1DeleteOptions(grace_period_seconds=grace_s, propagation_policy="Foreground",
                                  preconditions=V1Preconditions(uid=uid) if uid else None)
        self._call(self.api.delete_namespaced_custom_object, *api_coordinates(api_version), namespace,
                   VOLCANO_PLURAL, name, grace_period_seconds=grace_s, propagation_policy="Foreground", body=options)

    def _get_job(self, namespace: str, name: str, api_version: str = "") -> dict[str, Any]:
        return self._call(self.api.get_namespaced_custom_object, *api_coordinates(api_version),
                          namespace, VOLCANO_PLURAL, name)

    # --- poll -------------------------------------------------------------------------------

    def poll(self, handle: RunHandle) -> RunStatus:
        """The attempt's state, message, each pod (`agents`) and each rank (`ranks`):
        `trainyard.plugins.launch.kube_status` says what each field holds."""
        self._check_handle(handle)
        return run_status(handle, self._observe(handle))

    def _observe(self, handle: RunHandle) -> Observed:
        try:
            job = self._get_job(handle.namespace, handle.name, handle.api_version)
        except ApiException as e:
            if e.status == 404:
                return Observed(job=None)
            raise
        seen = Observed(job=job)
        if handle.uid and job["metadata"].get("uid") != handle.uid:
            return seen
        if self.core_api is None:
            return seen
        wire = self.core_api.api_client.sanitize_for_serialization
        pods = self._call(self.core_api.list_namespaced_pod, handle.namespace, label_selector=pod_selector(handle))
        seen.pods = owned_pods(handle, [wire(p) for p in pods.items], job["metadata"].get("uid", ""))
        names = {p["spec"].get("nodeName") for p in seen.pods if p["spec"].get("nodeName")}
        if names:
            nodes = self._call(self.core_api.list_node)
            seen.nodes = {n["metadata"]["name"]: n for n in map(wire, nodes.items) if n["metadata"]["name"] in names}
        unstarted = _unstarted(job, seen.pods)
        if unstarted or reads_workload(job, seen.pods):
            seen.group = self._workload(handle, job) if is_batch_job(job) else self._podgroup(handle, job)
        if unstarted:
            events = self._call(self.core_api.list_namespaced_event, handle.namespace)
            seen.events = _events_of(seen, [wire(e) for e in events.items])
        return seen

    def _podgroup(self, handle: RunHandle, job: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return self._call(self.api.get_namespaced_custom_object, QUEUE_GROUP, PODGROUP_VERSION,
                              handle.namespace, "podgroups", group_name(handle, job))
        except ApiException as e:
            if e.status in (403, 404):
                return None
            raise

    def _workload(self, handle: RunHandle, job: dict[str, Any]) -> dict[str, Any] | None:
        """Kueue's Workload of a batch Job (its label names the Job's uid): why it waits."""
        from trainyard.plugins.launch.kueue_queues import (
            KUEUE_GROUP,
            KUEUE_VERSION,
            workload_selector,
        )

        try:
            found = self._call(self.api.list_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION, handle.namespace,
                               "workloads", label_selector=workload_selector(job))
        except ApiException as e:
            if e.status in (403, 404):
                return None
            raise
        return next(iter(found.get("items") or []), None)

    async def poll_async(self, handle: RunHandle, api_client: Any) -> RunStatus:
        """`poll` for an asyncio caller (the training trigger): `api_client` is a
        `kubernetes_asyncio` ApiClient — what `AsyncKubernetesHook.get_conn()` yields
        (`trainyard.operators.kubernetes_clients.poll_with_async_hook`). Same reads, same reading."""
        return await poll_async(handle, api_client, attempts=self.attempts, max_wait_s=self.max_wait_s)

    # --- stop -------------------------------------------------------------------------------

    def stop(self, handle: RunHandle, grace_s: float = 30.0, *, lost_nodes: Collection[str] = ()) -> RunStatus:
        """Stop the attempt: its pods get SIGTERM and `grace_s` (the emergency checkpoint), then
        SIGKILL; the Job goes with foreground propagation. Waits until the Job is gone (at most
        `grace_s` + `delete_timeout_s`) and returns `stopped` with the last ranks seen.

        A gang with a pod on a node that is not Ready, or on one of `lost_nodes` (the health
        watch's verdict, which comes before Kubernetes' own: its node controller waits 50 s),
        is deleted at once, grace 0: without the lost ranks the others' emergency checkpoint (a
        collective save, after a step of collectives) cannot complete — the grace would only
        delay the next attempt. The lost node's own pods are ended as a real cluster ends them
        (`fencing.py`, `options.fence_lost_nodes`): deleted gracefully — no kubelet will confirm
        it, so they stay Terminating — and, once Kubernetes marks their node NotReady, the node
        is tainted out-of-service and kube-controller-manager's pod GC deletes them; the wait
        for the Job to be gone covers that. Without fencing they are forced away (grace 0).

        A 404 means it is already gone: done. The uid precondition makes sure a newer Job of
        the same name (a later attempt) is never deleted by a stale handle (409: also done)."""
        self._check_handle(handle)
        grace = max(int(grace_s), 0)
        where = f"{handle.namespace}/{handle.name}"
        before = run_status(handle, seen := self._observe(handle))
        if seen.job is None:
            return RunStatus(state="stopped", message=f"{where} was already gone")
        if handle.uid and seen.job["metadata"].get("uid") != handle.uid:
            return RunStatus(state="stopped", message=f"{where} is another object now (uid precondition); nothing of "
                                                      "this attempt is left")
        lost = self._pods_on_lost_nodes(seen, set(lost_nodes))
        fence: set[str] = set()
        if lost:
            grace = 0
            if self.options.fence_lost_nodes:
                fence = {pod["spec"]["nodeName"] for pod in seen.pods if pod["metadata"]["name"] in lost}
        try:
            self._delete_job(handle.namespace, handle.name, handle.uid, grace, handle.api_version)
        except ApiException as e:
            if e.status == 404:
                return RunStatus(state="stopped", message=f"{where} was already gone")
            if e.status == 409:
                return RunStatus(state="stopped", message=f"{where} is another object now (uid precondition failed); "
                                 "nothing of this attempt is left")
            raise
        self._delete_pods(seen, grace, on_lost_nodes=fence)
        fenced: list[str] = []
        last = self._wait_gone(handle, before, grace + self.delete_timeout_s, fence=fence, fenced=fenced)
        gone = last is None
        last = last or before
        note = f"; no grace: pods on lost nodes: {', '.join(lost)}" if lost else ""
        if fenced:
            note += f"; tainted {', '.join(fenced)} {OUT_OF_SERVICE_KEY} (NotReady): their pods ended by the pod GC"
        return RunStatus(state="stopped", ranks=last.ranks, agents=last.agents, nodes=last.nodes, step=last.step,
                         exit_code=next((r.exit_code for r in last.ranks if r.exit_code not in (None, 0)), None),
                         processes_alive=not gone,
                         message=f"deleted {where} (grace {grace}s, foreground)" + note
                                 + ("" if gone else f"; still there after {grace + self.delete_timeout_s:.0f} s"))

    @staticmethod
    def _pods_on_lost_nodes(seen: Observed, lost_nodes: set[str]) -> list[str]:
        """The gang's pods on a node in `lost_nodes` or not Ready."""
        return [pod["metadata"]["name"] for pod in seen.pods
                if (node := pod["spec"].get("nodeName") or "")
                and (node in lost_nodes or node_is_ready(seen.nodes.get(node)) is False)]

    def _delete_pods(self, seen: Observed, grace: int, *, on_lost_nodes: Collection[str] = ()) -> None:
        """Each pod with `grace` (the Job's deletion would leave its pods their own
        `terminationGracePeriodSeconds`); those on `on_lost_nodes` (to be fenced) gracefully,
        with `fencing.LOST_POD_GRACE_S`, never forced."""
        for pod in seen.pods:
            meta = pod["metadata"]
            wait = LOST_POD_GRACE_S if pod["spec"].get("nodeName") in on_lost_nodes else grace
            try:
                self._call(self._core().delete_namespaced_pod, meta["name"], meta["namespace"],
                           grace_period_seconds=wait,
                           body=V1DeleteOptions(grace_period_seconds=wait, preconditions=V1Preconditions(uid=meta["uid"])))
            except ApiException as e:
                if e.status not in (404, 409):
                    raise

    def _fence(self, seen: Observed, lost: Collection[str]) -> list[str]:
        """Taint out-of-service each of `lost` that Kubernetes marks NotReady and that still holds
        a pod of the gang (`fencing.nodes_to_fence`); the nodes tainted now. A Node changed since
        it was read (409) is tried again at the next look."""
        tainted = []
        for name in nodes_to_fence(seen, lost):
            try:
                self._call(self._core().patch_node, name, out_of_service_patch(seen.nodes[name]))
            except ApiException as e:
                if e.status in (404, 409):
                    continue
                raise LaunchError(f"cannot taint lost node {name} {OUT_OF_SERVICE_KEY}: {e.status} {e.reason}: "
                                  f"{_api_message(e)}") from e
            log.warning("node %s is NotReady and lost to the control plane: tainted %s, so that the pod GC ends "
                        "its pods", name, OUT_OF_SERVICE_KEY)
            tainted.append(name)
        return tainted

    def _wait_gone(self, handle: RunHandle, last: RunStatus, timeout_s: float, *, fence: Collection[str] = (),
                   fenced: list[str] | None = None) -> RunStatus | None:
        """None once the Job is gone; else the last status seen when `timeout_s` ran out. With
        `options.fence_lost_nodes` each look fences (appended to `fenced`) the nodes of `fence`,
        and those a terminating pod of the gang is on, that Kubernetes has marked NotReady."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seen = self._observe(handle)
            if handle.uid and seen.job is not None and seen.job["metadata"].get("uid") != handle.uid:
                return None  # a newer Job of the name: this attempt's is gone
            if seen.job is None:
                if not self._workload_left(handle):
                    return None
                self.sleep(self.poll_interval_s)
                continue
            if self.options.fence_lost_nodes:
                # the lost nodes, and any node a pod still waits on once Kubernetes marks it
                # NotReady (a stop that began before either verdict: no kubelet will confirm)
                waiting = {node for pod in seen.pods if pod["metadata"].get("deletionTimestamp")
                           and (node := pod["spec"].get("nodeName"))}
                tainted = self._fence(seen, {*fence, *waiting})
                if fenced is not None:
                    fenced.extend(tainted)
            status = run_status(handle, seen)
            if status.ranks and any(r.exit_code is not None for r in status.ranks):
                last = status
            self.sleep(self.poll_interval_s)
        return last

    def _workload_left(self, handle: RunHandle) -> bool:
        """Whether Kueue's Workload of the deleted batch Job is still there (garbage collection
        and Kueue's finalizer end it moments after the Job). The next attempt's Job has the same
        name, and Kueue finds a job's workloads by their owner's name: created beside the old
        one, it was left suspended with no reason ("conflict for annotations: …
        kueue.x-k8s.io/workload"), so the stop waits for it too."""
        if self.options.queueing != "kueue" or handle.api_version != "batch/v1" or not handle.uid:
            return False
        return self._workload(handle, {"metadata": {"uid": handle.uid}}) is not None

    def settle(self, handle: RunHandle, status: RunStatus | None = None, *, grace_s: float = 5.0) -> RunStatus:
        """Volcano's job policies end the pods of a finished job themselves (its terminal phases
        report no live process). A finished status that still reports live pods has its Job
        deleted; the verdict stays the one given (the deletion only cleans up). So has a Job
        Kueue evicted (`status.evicted`): suspended, it waits in Kueue's queue, and Kueue would
        admit it again by itself — the attempt a second time, beside the DAG's next one."""
        status = status or self.poll(handle)
        if status.finished and (status.processes_alive or status.evicted):
            stopped = self.stop(handle, grace_s=grace_s)
            return status.model_copy(update={"message": f"{status.message}; cleaned up: {stopped.message}"})
        return status

    def node_agents(self, handle: RunHandle) -> dict[str, str]:
        """Each gang node's agent: the rendered DaemonSet's pod answers on the node's own address
        at `node_agent_port` (a hostPort), so the Node object says where — no static map to keep
        in step with the fleet. A node without an InternalIP yet is left out (and said)."""
        self._check_handle(handle)
        from trainyard.plugins.placement.inventory import internal_ip

        found, gang = {}, set(handle.nodes)
        for raw in self._call(self._core().list_node).items:
            node = raw.to_dict() if hasattr(raw, "to_dict") else dict(raw)
            name = node["metadata"]["name"]
            if name not in gang:
                continue
            address = internal_ip(node)
            if address is None:
                log.warning("node %s has no InternalIP: its node agent cannot be reached yet", name)
                continue
            host = f"[{address}]" if ":" in address else address
            found[name] = f"http://{host}:{self.options.node_agent_port}"
        return found

    # --- logs -------------------------------------------------------------------------------

    def logs(self, handle: RunHandle, rank: int | None = None, tail: int = 200) -> str:
        """The trainer container's log of the pod holding `rank` (all pods when None)."""
        self._check_handle(handle)
        core = self._core()
        if rank is not None and not 0 <= rank < handle.world_size:
            raise ValueError(f"rank {rank} is outside the job's world size {handle.world_size}")
        gang = self._rank_ranges(handle)
        hosts = list(gang) if rank is None else [p for p, ranks in gang.items() if rank in ranks][:1]
        names = {pod_key(p): p["metadata"]["name"] for p in self._listed_pods(handle)} if handle.api_version else {}
        parts = []
        for pod in (names.get(host, host) for host in hosts):
            try:
                # raw, decoded here: the client's own str handling gives "b'…'" (kubernetes 36)
                raw = self._call(core.read_namespaced_pod_log, pod, handle.namespace,
                                 container="trainer", tail_lines=tail, _preload_content=False)
                text = raw.data.decode(errors="replace")
            except ApiException as e:
                if e.status not in (400, 404):
                    raise
                text = f"(pod {pod}: {_api_message(e) or e.reason})"
            parts.append(text if rank is not None else f"==> {pod} <==\n{text}")
        return "\n".join(parts)

    def _rank_ranges(self, handle: RunHandle) -> dict[str, range]:
        """Each pod's ranks in node-rank order (`gang_pods.rank_ranges`), from the Job's tasks;
        a Job already gone: its pods as listed, `ranks_per_node` each."""
        try:
            return rank_ranges(handle.name, gang_tasks_of(self._get_job(handle.namespace, handle.name,
                                                                        handle.api_version)))
        except ApiException as e:
            if e.status != 404:
                raise
        names = node_order(handle.name, [pod_key(p) for p in self._listed_pods(handle)])
        k = handle.ranks_per_node
        return {name: range(i * k, (i + 1) * k) for i, name in enumerate(names)}

    def _listed_pods(self, handle: RunHandle) -> list[dict[str, Any]]:
        pods = self._call(self._core().list_namespaced_pod, handle.namespace, label_selector=pod_selector(handle))
        return [self._core().api_client.sanitize_for_serialization(p) for p in pods.items]

    @staticmethod
    def _check_handle(handle: RunHandle) -> None:
        if handle.kind != "kubernetes":
            raise ValueError(f"KubernetesLauncher cannot use a {handle.kind!r} handle")


def api_coordinates(api_version: str) -> tuple[str, str]:
    """(group, version) of a gang object's `apiVersion`; '' is a Volcano Job (handles written
    before the Kueue path)."""
    if not api_version:
        return VOLCANO_GROUP, VOLCANO_VERSION
    group, _, version = api_version.rpartition("/")
    return group, version


def _unstarted(job: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    phase = job_phase(job)
    return phase == "Pending" or any((p.get("status") or {}).get("phase") == "Pending" for p in pods)


def _api_message(e: ApiException) -> str:
    import json

    try:
        return str(json.loads(e.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        return ""


async def poll_async(handle: RunHandle, api_client: Any, *, attempts: int = 6, max_wait_s: float = 60.0) -> RunStatus:
    """`KubernetesLauncher.poll` over a `kubernetes_asyncio` ApiClient, transient errors retried."""
    from kubernetes_asyncio.client import CoreV1Api as AsyncCore
    from kubernetes_asyncio.client import CustomObjectsApi as AsyncCustom

    KubernetesLauncher._check_handle(handle)
    custom, core = AsyncCustom(api_client), AsyncCore(api_client)
    wire = api_client.sanitize_for_serialization
    retrying = {"retry": retry_if_exception(is_transient), "stop": stop_after_attempt(attempts), "reraise": True,
                "wait": wait_retry_after(wait_exponential_jitter(multiplier=0.5, max=max_wait_s), max_wait_s)}

    async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async for attempt in AsyncRetrying(**retrying):
            with attempt:
                return await fn(*args, **kwargs)
        return None  # not reached: the last failure is re-raised

    try:
        job = await call(custom.get_namespaced_custom_object, *api_coordinates(handle.api_version), handle.namespace,
                         VOLCANO_PLURAL, handle.name)
    except Exception as e:
        if _status_of(e) == 404:
            return run_status(handle, Observed(job=None))
        raise
    seen = Observed(job=job)
    if handle.uid and job["metadata"].get("uid") != handle.uid:
        return run_status(handle, seen)
    pods = await call(core.list_namespaced_pod, handle.namespace, label_selector=pod_selector(handle))
    seen.pods = owned_pods(handle, [wire(p) for p in pods.items], job["metadata"].get("uid", ""))
    names = {p["spec"].get("nodeName") for p in seen.pods if p["spec"].get("nodeName")}
    if names:
        nodes = await call(core.list_node)
        seen.nodes = {n["metadata"]["name"]: n for n in map(wire, nodes.items) if n["metadata"]["name"] in names}
    unstarted = _unstarted(job, seen.pods)
    if unstarted or reads_workload(job, seen.pods):
        try:
            if is_batch_job(job):
                from trainyard.plugins.launch.kueue_queues import (
                    KUEUE_GROUP,
                    KUEUE_VERSION,
                    workload_selector,
                )

                found = await call(custom.list_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION, handle.namespace,
                                   "workloads", label_selector=workload_selector(job))
                seen.group = next(iter(found.get("items") or []), None)
            else:
                seen.group = await call(custom.get_namespaced_custom_object, QUEUE_GROUP, PODGROUP_VERSION,
                                        handle.namespace, "podgroups", group_name(handle, job))
        except Exception as e:
            if _status_of(e) not in (403, 404):
                raise
    if unstarted:
        events = await call(core.list_namespaced_event, handle.namespace)
        seen.events = _events_of(seen, [wire(e) for e in events.items])
    return run_status(handle, seen)


def _events_of(seen: Observed, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    uids = {p["metadata"]["uid"] for p in seen.pods} | ({seen.group["metadata"]["uid"]} if seen.group else set())
    return [e for e in events if (e.get("involvedObject") or {}).get("uid") in uids]
