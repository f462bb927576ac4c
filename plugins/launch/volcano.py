"""`KubernetesLauncher`: submit, poll, stop and read logs of a Volcano Job.

The engine takes the `kubernetes` client's API objects as arguments — `CustomObjectsApi` for the
Volcano objects, optionally `CoreV1Api` for pods and logs — so credentials and connections stay
with the caller: Airflow tasks build them from the cncf-kubernetes provider's `KubernetesHook`
(`operators.kubernetes_clients`, connection id from `TRAINYARD_KUBERNETES_CONN_ID`), other
callers from a kubeconfig (`KubernetesLauncher.from_kubeconfig`), tests pass `create_autospec`
mocks, and this package never imports Airflow.

API habits of Airflow's providers: transient errors (429, 5xx, dropped connections) are retried
with tenacity, waiting what `Retry-After` asks when the server says; everything else fails at
once; a delete that gets 404 is done; a create that gets 409 re-attaches when the existing object
is this very attempt (an Airflow retry), and refuses otherwise.
"""

from __future__ import annotations

import email.utils
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kubernetes.client import V1DeleteOptions, V1Preconditions
from kubernetes.client.exceptions import ApiException
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter
from tenacity.wait import wait_base
from urllib3.exceptions import HTTPError as Urllib3HTTPError

from plugins.launch.base import LaunchError
from plugins.launch.cluster_settings import check_cluster_settings
from plugins.launch.exit_codes import describe
from plugins.launch.manifests import (
    QUEUE_GROUP,
    QUEUE_PLURAL,
    QUEUE_VERSION,
    VOLCANO_GROUP,
    VOLCANO_PLURAL,
    VOLCANO_VERSION,
    KubernetesOptions,
    render_queues,
    render_volcano_job,
)
from plugins.launch.model import AgentStatus, RunHandle, RunStatus
from plugins.placement.inventory import cluster_from_k8s_nodes

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api, CustomObjectsApi

    from config.cluster import Cluster
    from config.spec import TrainingJob
    from config.teams import Teams
    from config.worker_env import WorkerEnv
    from plugins.advisor.plan import Plan
    from plugins.launch.kube_clients import KubeClients
    from plugins.placement.model import Placement

log = logging.getLogger(__name__)

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
PODGROUP_VERSION = "v1beta1"
PHASES: Mapping[str, str] = {
    "Pending": "pending", "Running": "running", "Restarting": "running", "Completing": "running",
    "Aborting": "running", "Terminating": "running", "Completed": "succeeded",
    "Aborted": "failed", "Terminated": "failed", "Failed": "failed",
}
"""Volcano Job phases (`status.state.phase`) → RunState."""


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT_STATUS or not exc.status  # status 0/None: no response at all
    return isinstance(exc, Urllib3HTTPError | ConnectionError | TimeoutError)


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
    ) -> None:
        self.api = api
        self.core_api = core_api
        self.options = options or KubernetesOptions()
        self.attempts = attempts
        self.max_wait_s = max_wait_s
        self.sleep = sleep

    @classmethod
    def from_clients(cls, clients: KubeClients, **kwargs: Any) -> KubernetesLauncher:
        """A launcher over `clients` (`plugins.launch.kube_clients`, or the Airflow adapter
        `operators.kubernetes_clients`, which builds them from `KubernetesHook`)."""
        return cls(clients.custom, core_api=clients.core, **kwargs)

    @classmethod
    def from_kubeconfig(cls, config_file: str | None = None, context: str | None = None,
                        **kwargs: Any) -> KubernetesLauncher:
        """The default outside Airflow: the kubeconfig's context, or the pod's service account."""
        from plugins.launch.kube_clients import clients_from_kubeconfig

        return cls.from_clients(clients_from_kubeconfig(config_file, context), **kwargs)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        retrying = Retrying(
            retry=retry_if_exception(is_transient), stop=stop_after_attempt(self.attempts),
            wait=wait_retry_after(wait_exponential_jitter(multiplier=0.5, max=self.max_wait_s), self.max_wait_s),
            sleep=self.sleep, reraise=True,
        )
        return retrying(fn, *args, **kwargs)

    @property
    def _ns(self) -> str:
        return self.options.namespace

    # --- inventory --------------------------------------------------------------------------

    def cluster(self, name: str = "kubernetes") -> Cluster:
        """The fleet as the API server sees it: GPU nodes by rack label, health from conditions."""
        if self.core_api is None:
            raise ValueError("reading the node inventory needs a CoreV1Api (pass core_api=…)")
        nodes = self._call(self.core_api.list_node)
        return cluster_from_k8s_nodes(nodes.items, name=name)

    # --- queues -----------------------------------------------------------------------------

    def ensure_queues(self, teams: Teams, total_gpus: int) -> list[str]:
        """Create each team's Queue, or bring an existing one's spec up to date."""
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

    # --- submit -----------------------------------------------------------------------------

    def submit(self, job: TrainingJob, plan: Plan, placement: Placement, worker_env: WorkerEnv,
               *, attempt: int) -> RunHandle:
        """Create the attempt's Volcano Job. Raises `UnsafeForCluster` (fatal) before any API
        call when a setting cannot work in pods (`plugins.launch.cluster_settings`)."""
        for warning in check_cluster_settings(job, worker_env):
            log.warning("%s", warning.render())
        body = render_volcano_job(job, plan, placement, worker_env, attempt=attempt, options=self.options)
        name = body["metadata"]["name"]
        try:
            created = self._call(self.api.create_namespaced_custom_object, VOLCANO_GROUP, VOLCANO_VERSION,
                                 self._ns, VOLCANO_PLURAL, body)
        except ApiException as e:
            if e.status != 409:
                raise LaunchError(f"cannot create Volcano Job {self._ns}/{name}: {e.status} {e.reason}") from e
            created = self._get_job(self._ns, name)
            existing = (created.get("metadata", {}).get("labels") or {}).get("trainyard.io/attempt")
            if existing != str(attempt):
                raise LaunchError(f"Volcano Job {self._ns}/{name} already exists for attempt {existing}; "
                                  f"stop it before launching attempt {attempt}") from e
        return RunHandle(kind="kubernetes", job=job.metadata.name, run=worker_env.run, attempt=attempt,
                         world_size=placement.world_size, namespace=self._ns, name=name,
                         uid=str(created.get("metadata", {}).get("uid") or ""),
                         nodes=placement.node_names, ranks_per_node=placement.ranks_per_node)

    def _get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self.api.get_namespaced_custom_object, VOLCANO_GROUP, VOLCANO_VERSION,
                          namespace, VOLCANO_PLURAL, name)

    # --- poll -------------------------------------------------------------------------------

    def poll(self, handle: RunHandle) -> RunStatus:
        self._check_handle(handle)
        try:
            obj = self._get_job(handle.namespace, handle.name)
        except ApiException as e:
            if e.status == 404:
                return RunStatus(state="unknown", message=f"Volcano Job {handle.namespace}/{handle.name} is "
                                 "gone (deleted, or removed after ttlSecondsAfterFinished)")
            raise
        uid = str(obj.get("metadata", {}).get("uid") or "")
        if handle.uid and uid and uid != handle.uid:
            return RunStatus(state="unknown", message=f"{handle.namespace}/{handle.name} is another object now "
                             f"(uid {uid}, expected {handle.uid})")
        status = obj.get("status") or {}
        phase = (status.get("state") or {}).get("phase") or "Pending"
        state = PHASES.get(phase, "unknown")
        message = self._message(handle, obj, phase)
        agents = self._pods(handle)
        failed = [a for a in agents if a.exit_code not in (None, 0)]
        code = 0 if state == "succeeded" else (failed[0].exit_code if failed else None)
        if state == "failed" and code is None:
            code = 1
        return RunStatus(state=state, message=message, exit_code=code, agents=agents,  # type: ignore[arg-type]
                         processes_alive=phase not in ("Completed", "Aborted", "Terminated", "Failed"))

    def _message(self, handle: RunHandle, obj: Mapping[str, Any], phase: str) -> str:
        status = obj.get("status") or {}
        counts = ", ".join(f"{status[k]} {k}" for k in ("pending", "running", "succeeded", "failed")
                           if status.get(k))
        reason = (status.get("state") or {}).get("message") or (status.get("state") or {}).get("reason") or ""
        message = f"Volcano phase {phase}" + (f" ({counts})" if counts else "") + (f": {reason}" if reason else "")
        if phase == "Pending":
            why = self._podgroup_reason(handle, str(obj.get("metadata", {}).get("uid") or ""))
            if why:
                message += f"; scheduler: {why}"
        return message

    def _podgroup_reason(self, handle: RunHandle, uid: str) -> str:
        """Volcano explains a pending gang on its PodGroup (`<job>-<uid>`), e.g.
        "3/4 tasks in gang unschedulable: 1 Insufficient nvidia.com/gpu"."""
        if not uid:
            return ""
        try:
            group = self._call(self.api.get_namespaced_custom_object, QUEUE_GROUP, PODGROUP_VERSION,
                               handle.namespace, "podgroups", f"{handle.name}-{uid}")
        except ApiException as e:
            if e.status in (403, 404):
                return ""
            raise
        for condition in (group.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
                return str(condition.get("message") or condition.get("reason") or "")
        return ""

    def _pods(self, handle: RunHandle) -> list[AgentStatus]:
        if self.core_api is None:
            return []
        selector = f"trainyard.io/job={handle.job},trainyard.io/attempt={handle.attempt}"
        if handle.run:  # another run of the job may be at the same attempt number
            selector += f",trainyard.io/run={handle.run}"
        pods = self._call(self.core_api.list_namespaced_pod, handle.namespace, label_selector=selector)
        out = []
        for pod in sorted(pods.items, key=lambda p: int((p.metadata.labels or {}).get("trainyard.io/node-rank", 0))):
            node = pod.spec.node_name if pod.spec else ""
            code, message = None, pod.status.phase if pod.status else ""
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                terminated = cs.state.terminated if cs.state else None
                if cs.name == "trainer" and terminated is not None:
                    code = terminated.exit_code
                    message = f"{terminated.reason or 'terminated'}: {describe(code)}"
            out.append(AgentStatus(node=node or pod.metadata.name, alive=code is None and message == "Running",
                                   exit_code=code, message=message))
        return out

    # --- stop -------------------------------------------------------------------------------

    def stop(self, handle: RunHandle, grace_s: float = 30.0) -> RunStatus:
        """Delete the Volcano Job (its pods get SIGTERM and `grace_s` before SIGKILL).

        A 404 means it is already gone: done. The uid precondition makes sure a newer Job of
        the same name (a later attempt) is never deleted by a stale handle (409: also done)."""
        self._check_handle(handle)
        grace = max(int(grace_s), 0)
        options = V1DeleteOptions(grace_period_seconds=grace, propagation_policy="Foreground",
                                  preconditions=V1Preconditions(uid=handle.uid) if handle.uid else None)
        try:
            self._call(self.api.delete_namespaced_custom_object, VOLCANO_GROUP, VOLCANO_VERSION,
                       handle.namespace, VOLCANO_PLURAL, handle.name, grace_period_seconds=grace,
                       propagation_policy="Foreground", body=options)
        except ApiException as e:
            if e.status == 404:
                return RunStatus(state="stopped", message=f"{handle.namespace}/{handle.name} was already gone")
            if e.status == 409:
                return RunStatus(state="stopped", message=f"{handle.namespace}/{handle.name} is another object "
                                 "now (uid precondition failed); nothing of this attempt is left")
            raise
        return RunStatus(state="stopped", message=f"deleted {handle.namespace}/{handle.name} "
                         f"(grace {grace}s, foreground)", processes_alive=True)

    def settle(self, handle: RunHandle, status: RunStatus | None = None, *, grace_s: float = 5.0) -> RunStatus:
        """Volcano's job policies end the pods of a finished job themselves (its terminal phases
        report no live process). A finished status that still reports live pods has its Job
        deleted; the verdict stays the one given (the deletion only cleans up)."""
        status = status or self.poll(handle)
        if status.finished and status.processes_alive:
            stopped = self.stop(handle, grace_s=grace_s)
            return status.model_copy(update={"message": f"{status.message}; cleaned up: {stopped.message}"})
        return status

    # --- logs -------------------------------------------------------------------------------

    def logs(self, handle: RunHandle, rank: int | None = None, tail: int = 200) -> str:
        """The trainer container's log of the pod holding `rank` (all pods when None)."""
        self._check_handle(handle)
        if self.core_api is None:
            raise ValueError("reading pod logs needs a CoreV1Api (pass core_api=…)")
        if rank is not None and not 0 <= rank < handle.world_size:
            raise ValueError(f"rank {rank} is outside the job's world size {handle.world_size}")
        indices = [rank // handle.ranks_per_node] if rank is not None else range(len(handle.nodes))
        parts = []
        for i in indices:
            pod = f"{handle.name}-worker-{i}-0"
            try:
                text = self._call(self.core_api.read_namespaced_pod_log, pod, handle.namespace,
                                  container="trainer", tail_lines=tail)
            except ApiException as e:
                if e.status != 404:
                    raise
                text = f"(pod {pod} not found)"
            parts.append(text if rank is not None else f"==> {pod} <==\n{text}")
        return "\n".join(parts)

    @staticmethod
    def _check_handle(handle: RunHandle) -> None:
        if handle.kind != "kubernetes":
            raise ValueError(f"KubernetesLauncher cannot use a {handle.kind!r} handle")
