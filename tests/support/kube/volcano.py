"""A minimal Volcano: the job controller, its admission checks and the gang scheduler.

**Job controller** (`batch.volcano.sh/v1alpha1` Job → `scheduling.volcano.sh/v1beta1` PodGroup
`<job>-<uid>` → one Pod `<job>-<task>-<i>` per task replica, all owned by the Job):
pods carry Volcano's labels and annotations (`volcano.sh/job-name`, `volcano.sh/task-spec`,
`scheduling.k8s.io/group-name`, …), the `svc` plugin's `hostname`/`subdomain` and headless
Service `<job>`, and the `env` plugin's `VK_TASK_INDEX`/`VC_TASK_INDEX`. The Job's
`status.state.phase` follows the pods: Pending → Running once `minAvailable` pods run →
Completed when every pod ended and at least `minAvailable` succeeded, else Failed. Policies
(the job's and its tasks'; `event` / `events` / `exitCode`, `*` for any event) act on
`PodFailed` and `PodEvicted` (a pod deleted by anyone but this controller): `AbortJob`
(Aborting → Aborted), `TerminateJob` (Terminating → Terminated), `CompleteJob`
(Completing → Completed) delete the pods still running and keep those that ended (Volcano's
`PodRetainPhaseSoft`: a failed pod's exit code stays readable); `RestartJob` deletes them all
and starts the pods again until `maxRetry` is spent (then Failed). A phase in "-ing" ends once no pod of the
job still runs on a Ready node: a pod stuck terminating on a lost node does not hold it.
Missing pods are made only while the Job is Pending (or restarting).

**Admission** (the `validatejob.volcano.sh` webhook's checks): the queue must exist, task names
be unique, and `minAvailable` ≤ the replicas of all tasks; refused with 400 and the webhook's
wording.

**Gang scheduler** (`schedulerName: volcano`): a PodGroup's pods are bound only when at least
`minMember` of them fit at once (`minAvailable` gang semantics), on Ready, schedulable nodes
whose taints they tolerate, matching `nodeSelector` and required node affinity (In, NotIn,
Exists, DoesNotExist, Gt, Lt), honouring required pod anti-affinity per topology key, with the
pods' requests (cpu, memory, `nvidia.com/gpu`, any extended resource) within the node's
allocatable minus what its running pods request; preferred node affinity orders the nodes.
Otherwise the PodGroup gets an `Unschedulable` condition and the pods `PodScheduled=False`,
with messages that name the numbers, and both get `FailedScheduling`/`Unschedulable` events.
The assignment is greedy (one pass in pod order, no backtracking), enough for small gangs.
Not emulated: queue capacity and fair share, preemption, PriorityClass lookup.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes.utils import parse_quantity

from tests.support.kube.rest import Rest
from tests.support.kube.store import ApiError, Store, now_rfc3339

log = logging.getLogger(__name__)

JOBS = ("batch.volcano.sh/v1alpha1", "jobs")
PODGROUPS = ("scheduling.volcano.sh/v1beta1", "podgroups")
QUEUES = ("scheduling.volcano.sh/v1beta1", "queues")
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
ENDING = {"Aborting": "Aborted", "Terminating": "Terminated", "Completing": "Completed"}
ACTION_PHASE = {"AbortJob": "Aborting", "TerminateJob": "Terminating", "CompleteJob": "Completing",
                "RestartJob": "Restarting"}
TERMINAL = ("Succeeded", "Failed")


def admit_job(store: Store, job: dict[str, Any]) -> None:
    """The checks of Volcano's job admission webhook (`validatejob.volcano.sh`)."""
    def deny(why: str) -> None:
        raise ApiError(400, "BadRequest", f'admission webhook "validatejob.volcano.sh" denied the request: {why}')

    spec = job.get("spec") or {}
    tasks = spec.get("tasks") or []
    if not tasks:
        deny("No task specified in job spec")
    names = [t.get("name") for t in tasks]
    if len(set(names)) != len(names):
        deny(f"duplicated task name {Counter(names).most_common(1)[0][0]}")
    total = sum(int(t.get("replicas", 1)) for t in tasks)
    if int(spec.get("minAvailable", 0)) > total:
        deny("job 'minAvailable' should not be greater than total replicas in tasks")
    queue = spec.get("queue") or "default"
    if ("queues.scheduling.volcano.sh", "", queue) not in store.objects:
        deny(f'unable to find job queue: queues.scheduling.volcano.sh "{queue}" not found')


def _owner(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _pod_for(job: dict[str, Any], task: dict[str, Any], index: int, group: str) -> dict[str, Any]:
    meta, spec = job["metadata"], job["spec"]
    name = f"{meta['name']}-{task['name']}-{index}"
    template = copy.deepcopy(task["template"])
    queue = spec.get("queue") or "default"
    retry = str((job.get("status") or {}).get("retryCount", 0))
    labels = {**(template.get("metadata", {}).get("labels") or {}), "volcano.sh/job-name": meta["name"],
              "volcano.sh/job-namespace": meta["namespace"], "volcano.sh/queue-name": queue,
              "volcano.sh/task-spec": task["name"], "volcano.sh/job-retry-count": retry}
    annotations = {**(template.get("metadata", {}).get("annotations") or {}), GROUP_ANNOTATION: group,
                   "volcano.sh/job-name": meta["name"], "volcano.sh/task-spec": task["name"],
                   "volcano.sh/task-index": str(index), "volcano.sh/queue-name": queue, "volcano.sh/job-version": "0"}
    pod_spec = template["spec"]
    pod_spec.setdefault("schedulerName", spec.get("schedulerName") or "volcano")
    pod_spec["hostname"], pod_spec["subdomain"] = name, meta["name"]
    for container in pod_spec.get("containers", []):
        container["env"] = [*(container.get("env") or []), {"name": "VK_TASK_INDEX", "value": str(index)},
                            {"name": "VC_TASK_INDEX", "value": str(index)}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels, "annotations": annotations,
                         "ownerReferences": [_owner(job)]},
            "spec": pod_spec}


class JobController:
    def __init__(self, api: Rest, ready_nodes: Callable[[], set[str]]) -> None:
        self.api = api
        self.ready_nodes = ready_nodes
        self.handled: dict[str, set[str]] = {}
        """Job uid → pod uids whose failure or eviction was already acted on."""
        self.own_deletes: set[str] = set()

    def tick(self) -> None:
        pods = self.api.list("v1", "pods", labels="volcano.sh/job-name")
        groups = {g["metadata"]["namespace"] + "/" + g["metadata"]["name"]: g for g in self.api.list(*PODGROUPS)}
        for job in self.api.list(*JOBS):
            if job["metadata"].get("deletionTimestamp"):
                continue
            owned = [p for p in pods if any(r.get("uid") == job["metadata"]["uid"]
                                            for r in p["metadata"].get("ownerReferences") or [])]
            self.sync(job, owned, groups)

    def sync(self, job: dict[str, Any], pods: list[dict[str, Any]], groups: dict[str, dict[str, Any]]) -> None:
        meta, spec = job["metadata"], job["spec"]
        status = copy.deepcopy(job.get("status") or {})
        state = status.get("state") or {}
        phase = state.get("phase") or "Pending"
        group = f"{meta['name']}-{meta['uid']}"
        if f"{meta['namespace']}/{group}" not in groups:
            self._create_group_and_service(job, group)
        handled = self.handled.setdefault(meta["uid"], set())
        reason, message = state.get("reason", ""), state.get("message", "")

        action = None
        for pod in pods:
            event = self._event_of(pod, handled)
            if event is None:
                continue
            handled.add(pod["metadata"]["uid"])
            found = self._policy(job, pod, event)
            if found and phase not in ENDING and phase not in ENDING.values() and phase not in ("Completed", "Failed"):
                action, reason = found, event
                message = _describe(pod, event)
        if action is not None:
            phase = ACTION_PHASE[action]
            # Volcano keeps the pods that already ended (PodRetainPhaseSoft), except on a restart
            self._delete_pods([p for p in pods if action == "RestartJob" or p["status"].get("phase") not in TERMINAL])
        if phase == "Restarting" and not pods:
            retries = int(status.get("retryCount", 0)) + 1
            status["retryCount"] = retries
            phase = "Failed" if retries > int(spec.get("maxRetry", 3)) else "Pending"
        if phase == "Pending" and not any(p["metadata"].get("deletionTimestamp") for p in pods):
            self._create_missing_pods(job, pods, group, status)
        counts = _counts(pods)
        running_on_ready = [p for p in pods if p["status"].get("phase") not in TERMINAL
                            and p["spec"].get("nodeName") in self.ready_nodes()]
        if phase in ENDING and not running_on_ready:
            phase = ENDING[phase]
        elif phase == "Pending" and counts["running"] + counts["succeeded"] >= int(spec.get("minAvailable", 0)) > 0:
            phase = "Running"
        if phase in ("Pending", "Running") and pods and len(pods) == _replicas(job) \
                and all(p["status"].get("phase") in TERMINAL for p in pods):
            ok = counts["succeeded"] >= int(spec.get("minAvailable", len(pods)))
            phase = "Completed" if ok else "Failed"
            reason = reason or ("TaskCompleted" if ok else "PodFailed")
        self._write_status(job, status, phase, reason, message, counts, pods)

    def _event_of(self, pod: dict[str, Any], handled: set[str]) -> str | None:
        uid = pod["metadata"]["uid"]
        if uid in handled:
            return None
        if pod["status"].get("phase") == "Failed":
            return "PodFailed"
        if pod["metadata"].get("deletionTimestamp") and uid not in self.own_deletes:
            return "PodEvicted"
        return None

    @staticmethod
    def _policy(job: dict[str, Any], pod: dict[str, Any], event: str) -> str | None:
        task = next((t for t in job["spec"]["tasks"]
                     if t["name"] == pod["metadata"]["labels"].get("volcano.sh/task-spec")), {})
        codes = [s.get("state", {}).get("terminated", {}).get("exitCode") for s in
                 pod["status"].get("containerStatuses") or []]
        for policy in [*(task.get("policies") or []), *(job["spec"].get("policies") or [])]:
            events = [policy["event"]] if policy.get("event") else policy.get("events") or []
            if event in events or "*" in events:
                return str(policy["action"])
            if "exitCode" in policy and event == "PodFailed" and policy["exitCode"] in codes:
                return str(policy["action"])
        return None

    def _delete_pods(self, pods: list[dict[str, Any]]) -> None:
        from tests.support.kube.rest import RestError

        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                continue
            self.own_deletes.add(pod["metadata"]["uid"])
            try:
                self.api.delete("v1", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
            except RestError as e:
                if e.status != 404:
                    raise

    def _create_group_and_service(self, job: dict[str, Any], group: str) -> None:
        meta, spec = job["metadata"], job["spec"]
        body = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": group, "namespace": meta["namespace"], "ownerReferences": [_owner(job)],
                             "annotations": {"volcano.sh/job-name": meta["name"]}},
                "spec": {"minMember": int(spec.get("minAvailable", 0)), "queue": spec.get("queue") or "default",
                         **({"priorityClassName": spec["priorityClassName"]} if spec.get("priorityClassName") else {})},
                "status": {"phase": "Pending"}}
        self.api.create(*PODGROUPS, meta["namespace"], body)
        service = {"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": meta["name"], "namespace": meta["namespace"], "ownerReferences": [_owner(job)]},
                   "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                            "selector": {"volcano.sh/job-name": meta["name"],
                                         "volcano.sh/job-namespace": meta["namespace"]}}}
        from tests.support.kube.rest import RestError

        try:
            self.api.create("v1", "services", meta["namespace"], service)
        except RestError as e:
            if e.status != 409:
                raise

    def _create_missing_pods(self, job: dict[str, Any], pods: list[dict[str, Any]], group: str,
                             status: dict[str, Any]) -> None:
        existing = {p["metadata"]["name"] for p in pods}
        job = dict(job, status=status)
        for task in job["spec"]["tasks"]:
            for index in range(int(task.get("replicas", 1))):
                body = _pod_for(job, task, index, group)
                if body["metadata"]["name"] not in existing:
                    self.api.create("v1", "pods", job["metadata"]["namespace"], body)

    def _write_status(self, job: dict[str, Any], status: dict[str, Any], phase: str, reason: str, message: str,
                      counts: Counter[str], pods: list[dict[str, Any]]) -> None:
        old = job.get("status") or {}
        old_state = old.get("state") or {}
        new = dict(status, minAvailable=int(job["spec"].get("minAvailable", 0)),
                   **{k: counts[k] for k in ("pending", "running", "succeeded", "failed", "terminating", "unknown")})
        tasks: dict[str, dict[str, dict[str, int]]] = {}
        for pod in pods:
            task = pod["metadata"]["labels"].get("volcano.sh/task-spec", "")
            by_phase = tasks.setdefault(task, {"phase": {}})["phase"]
            by_phase[pod["status"].get("phase", "Pending")] = by_phase.get(pod["status"].get("phase", "Pending"), 0) + 1
        new["taskStatusCount"] = tasks
        if phase != old_state.get("phase"):
            now = now_rfc3339()
            new["state"] = {"phase": phase, "lastTransitionTime": now,
                            **({"reason": reason} if reason else {}), **({"message": message} if message else {})}
            new["conditions"] = [*(old.get("conditions") or []), {"status": phase, "lastTransitionTime": now}]
        else:
            new["state"] = old_state
        if new != old:
            self.api.patch(*JOBS, job["metadata"]["namespace"], job["metadata"]["name"], {"status": new}, status=True)


def _replicas(job: dict[str, Any]) -> int:
    return sum(int(t.get("replicas", 1)) for t in job["spec"]["tasks"])


def _counts(pods: list[dict[str, Any]]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            counts["terminating"] += 1
        else:
            counts[{"Pending": "pending", "Running": "running", "Succeeded": "succeeded",
                    "Failed": "failed"}.get(pod["status"].get("phase", ""), "unknown")] += 1
    return counts


def _describe(pod: dict[str, Any], event: str) -> str:
    node = pod["spec"].get("nodeName") or "no node"
    if event == "PodEvicted":
        why = next((c.get("message") for c in pod["status"].get("conditions") or []
                    if c.get("type") == "DisruptionTarget"), "") or "deleted"
        return f"pod {pod['metadata']['name']} on {node} was evicted: {why}"
    codes = [s["state"]["terminated"] for s in pod["status"].get("containerStatuses") or []
             if "terminated" in s.get("state", {}) and s["state"]["terminated"].get("exitCode")]
    detail = ", ".join(f"exit code {t['exitCode']} ({t.get('reason', '')})" for t in codes) or "failed"
    return f"pod {pod['metadata']['name']} on {node} failed: {detail}"


# --- the gang scheduler -----------------------------------------------------------------------


def pod_requests(pod: dict[str, Any]) -> dict[str, float]:
    total: Counter[str] = Counter()
    for container in pod["spec"].get("containers", []):
        resources = container.get("resources") or {}
        asked = resources.get("requests") or resources.get("limits") or {}
        for name, value in asked.items():
            total[name] += float(parse_quantity(value))
    return dict(total)


def _tolerates(pod: dict[str, Any], taint: dict[str, Any]) -> bool:
    for t in pod["spec"].get("tolerations") or []:
        operator = t.get("operator", "Equal")
        if (t.get("key") and t["key"] != taint.get("key")) or (not t.get("key") and operator != "Exists"):
            continue
        if operator == "Equal" and t.get("value", "") != taint.get("value", ""):
            continue
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        return True
    return False


def _expression_holds(labels: dict[str, str], e: dict[str, Any]) -> bool:
    value, op, values = labels.get(e["key"]), e["operator"], e.get("values") or []
    if op in ("In", "NotIn"):
        return (value in values) == (op == "In")
    if op in ("Exists", "DoesNotExist"):
        return (value is not None) == (op == "Exists")
    if value is None or not values:
        return False
    return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])


def _term_holds(labels: dict[str, str], term: dict[str, Any]) -> bool:
    return all(_expression_holds(labels, e) for e in term.get("matchExpressions") or [])


def selector_holds(labels: dict[str, str], selector: dict[str, Any]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against `labels`; {} selects all."""
    return (all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
            and all(_expression_holds(labels, e) for e in selector.get("matchExpressions") or []))


class GangScheduler:
    """Binds whole gangs or none (see the module docstring)."""

    def __init__(self, api: Rest, before_bind: Callable[[dict[str, str]], None]) -> None:
        self.api = api
        self.before_bind = before_bind
        """Called with pod name → node just before a gang is bound (the harness writes DNS)."""
        self.said: dict[str, str] = {}

    def tick(self) -> None:
        nodes = self.api.list("v1", "nodes")
        pods = self.api.list("v1", "pods")
        for group in self.api.list(*PODGROUPS):
            self._schedule(group, nodes, pods)

    def _schedule(self, group: dict[str, Any], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        name, namespace = group["metadata"]["name"], group["metadata"]["namespace"]
        members = [p for p in pods if p["metadata"]["namespace"] == namespace
                   and (p["metadata"].get("annotations") or {}).get(GROUP_ANNOTATION) == name
                   and not p["metadata"].get("deletionTimestamp")]
        unbound = [p for p in members if not p["spec"].get("nodeName") and p["status"].get("phase") == "Pending"]
        min_member = int(group["spec"].get("minMember", 1))
        running = sum(1 for p in members if p["status"].get("phase") == "Running")
        self._group_phase(group, members, running, min_member)
        if not unbound or len(members) < min_member:
            return
        assignment, why = self._assign(unbound, nodes, pods)
        if len(assignment) == len(unbound) and len(members) - len(unbound) + len(assignment) >= min_member:
            self.before_bind(assignment)
            for pod in unbound:
                self._bind(pod, assignment[pod["metadata"]["name"]])
                pod["spec"]["nodeName"] = assignment[pod["metadata"]["name"]]  # the next gang of this tick sees it
            self.api.patch(*PODGROUPS, namespace, name, {"status": {"phase": "Inqueue", "conditions": [
                {"type": "Scheduled", "status": "True", "reason": "tasks in gang are ready to be scheduled",
                 "lastTransitionTime": now_rfc3339(), "transitionID": group["metadata"]["uid"]}]}})
            return
        message = (f"{len(unbound)}/{len(members)} tasks in gang unschedulable: pod group is not ready, "
                   f"{len(unbound)} Pending, {min_member} minAvailable; {why}")
        if self.said.get(group["metadata"]["uid"]) == message:
            return
        self.said[group["metadata"]["uid"]] = message
        self.api.patch(*PODGROUPS, namespace, name, {"status": {"phase": "Pending", "conditions": [
            {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources", "message": message,
             "lastTransitionTime": now_rfc3339(), "transitionID": group["metadata"]["uid"]}]}})
        self.api.event(group, "Unschedulable", message, component="volcano")
        for pod in unbound:
            self.api.patch("v1", "pods", namespace, pod["metadata"]["name"], {"status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why,
                 "lastTransitionTime": now_rfc3339()}]}}, status=True)
            self.api.event(pod, "FailedScheduling", why, component="volcano")

    def _group_phase(self, group: dict[str, Any], members: list[dict[str, Any]], running: int, min_member: int) -> None:
        status = group.get("status") or {}
        counts = {"running": running,
                  "succeeded": sum(1 for p in members if p["status"].get("phase") == "Succeeded"),
                  "failed": sum(1 for p in members if p["status"].get("phase") == "Failed")}
        phase = status.get("phase", "Pending")
        if phase == "Inqueue" and running >= min_member:
            phase = "Running"
        if members and counts["succeeded"] == len(members):
            phase = "Completed"
        if phase != status.get("phase") or any(status.get(k, 0) != v for k, v in counts.items()):
            self.api.patch(*PODGROUPS, group["metadata"]["namespace"], group["metadata"]["name"],
                           {"status": {"phase": phase, **counts}})

    def _bind(self, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]
        self.api.patch("v1", "pods", meta["namespace"], meta["name"], {"status": {"conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}]}}, status=True)
        self.api.create("v1", "pods", meta["namespace"], {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, sub="binding", name=meta["name"])

    def _assign(self, unbound: list[dict[str, Any]], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
                ) -> tuple[dict[str, str], str]:
        free: dict[str, dict[str, float]] = {}
        for node in nodes:
            allocatable = {k: float(parse_quantity(v)) for k, v in (node["status"].get("allocatable") or {}).items()}
            for pod in pods:
                if pod["spec"].get("nodeName") == node["metadata"]["name"] and pod["status"].get("phase") not in TERMINAL:
                    for k, v in pod_requests(pod).items():
                        allocatable[k] = allocatable.get(k, 0.0) - v
            free[node["metadata"]["name"]] = allocatable
        placed = [(p, p["spec"]["nodeName"]) for p in pods if p["spec"].get("nodeName")
                  and p["status"].get("phase") not in TERMINAL]
        assignment: dict[str, str] = {}
        first_reasons: Counter[str] = Counter()
        for pod in unbound:
            reasons: Counter[str] = Counter()
            candidates = []
            for node in nodes:
                why = self._misfit(pod, node, free[node["metadata"]["name"]], placed, nodes)
                if why:
                    reasons[why] += 1
                else:
                    candidates.append(node)
            if not candidates:
                first_reasons = first_reasons or reasons
                continue
            best = max(candidates, key=lambda n: (_preference(pod, n), -nodes.index(n)))
            name = best["metadata"]["name"]
            assignment[pod["metadata"]["name"]] = name
            for k, v in pod_requests(pod).items():
                free[name][k] = free[name].get(k, 0.0) - v
            placed.append((pod, name))
        if len(assignment) == len(unbound):
            return assignment, ""
        pod = next(p for p in unbound if p["metadata"]["name"] not in assignment)
        summary = ", ".join(f"{n} {r}" for r, n in sorted(first_reasons.items(), key=lambda i: (-i[1], i[0])))
        asked = ", ".join(f"{k}: {_fmt(v)}" for k, v in sorted(pod_requests(pod).items()))
        most = {k: max((f.get(k, 0.0) for f in free.values()), default=0.0) for k in pod_requests(pod)}
        largest = ", ".join(f"{k}: {_fmt(v)}" for k, v in sorted(most.items()))
        return assignment, (f"0/{len(nodes)} nodes are available: {summary}. Pod {pod['metadata']['name']} requests "
                            f"{asked}; the most any node has free is {largest} "
                            f"({len(assignment)} of {len(unbound)} pods of the gang would fit)")

    @staticmethod
    def _misfit(pod: dict[str, Any], node: dict[str, Any], free: dict[str, float],
                placed: list[tuple[dict[str, Any], str]], nodes: list[dict[str, Any]]) -> str:
        labels = node["metadata"].get("labels") or {}
        ready = next((c for c in node["status"].get("conditions") or [] if c["type"] == "Ready"), {})
        if ready.get("status") != "True":
            return "node(s) were not ready"
        if node["spec"].get("unschedulable"):
            return "node(s) were unschedulable"
        for taint in node["spec"].get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(pod, taint):
                return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
        if not all(labels.get(k) == v for k, v in (pod["spec"].get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        affinity = pod["spec"].get("affinity") or {}
        required = ((affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
                    or {}).get("nodeSelectorTerms")
        if required and not any(_term_holds(labels, t) for t in required):
            return "node(s) didn't match Pod's node affinity/selector"
        by_name = {n["metadata"]["name"]: n for n in nodes}
        for term in (affinity.get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            key = term["topologyKey"]
            for other, where in placed:
                other_labels = by_name.get(where, {}).get("metadata", {}).get("labels") or {}
                if other_labels.get(key) is not None and other_labels.get(key) == labels.get(key) \
                        and selector_holds(other["metadata"].get("labels") or {}, term.get("labelSelector") or {}):
                    return "node(s) didn't match pod anti-affinity rules"
        for resource, amount in pod_requests(pod).items():
            if free.get(resource, 0.0) + 1e-9 < amount:
                return f"Insufficient {resource}"
        return ""


def _preference(pod: dict[str, Any], node: dict[str, Any]) -> int:
    labels = node["metadata"].get("labels") or {}
    preferred = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution") or []
    return sum(int(p["weight"]) for p in preferred if _term_holds(labels, p["preference"]))


def _fmt(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"
