"""The pods of a Volcano Job and their node ranks: names, DNS names and the one order torchrun
gives them (stdlib only: the manifests, the status reader and the launcher's logs share it).

A gang is one Volcano task per distinct `slots` value, with `replicas` = its nodes: normally one
task `worker`; a gang whose last node holds fewer ranks also has the task `worker-last` (one pod).
Volcano names each pod `<job>-<task>-<index>` (index 0 … replicas-1) and its `svc` plugin gives it
the DNS name `<pod>.<job>` (hostname and subdomain). A pod is not tied to a node rank: torchrun's
c10d rendezvous ranks the agents by their `--local-addr` — `_NodeDesc(addr, pid, local_id)`,
sorted, in `torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`
(`for rank, node in enumerate(sorted(state.participants))`) — and every pod's address is its own
DNS name, so the node ranks are the pods' DNS names sorted as strings (`node_order`). The pod
`<job>-worker-0` sorts first (no other index starts with 0; `worker-last` sorts after every
digit): it is node rank 0 and hosts the rendezvous store. A node's global ranks follow from its
position and the slots of the nodes before it (torchrun's own rank assignment: the sum of the
local world sizes in front of it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

WORKER_TASK = "worker"
"""The task of the gang's full nodes (all of them, normally)."""
LAST_TASK = "worker-last"
"""The task of a last node with fewer ranks than the others, where there is one."""
SLOTS_ANNOTATION = "trainyard.io/slots"
"""On each task's pod template: torchrun's `--nproc-per-node` for its pods."""


@dataclass(frozen=True)
class GangTask:
    """One Volcano task of the gang: `replicas` pods of `slots` ranks each, on `first_node` …
    `first_node + replicas - 1` of the placement's nodes (in the placement's order)."""

    name: str
    slots: int
    first_node: int
    replicas: int


def gang_tasks(slots_per_node: Sequence[int]) -> list[GangTask]:
    """The tasks of a gang whose nodes (in the placement's order) hold `slots_per_node` ranks.

    Only the last node may hold fewer (a world size that does not fill it): any other mix would
    give ranks to pods in an order the pods' names could not keep (`node_order`)."""
    if not slots_per_node:
        raise ValueError("a gang needs at least one node")
    full = slots_per_node[0]
    head = len(slots_per_node) - 1 if slots_per_node[-1] != full else len(slots_per_node)
    odd = [i for i, s in enumerate(slots_per_node[:head]) if s != full]
    if odd or (head < len(slots_per_node) and slots_per_node[-1] > full):
        raise ValueError(f"slots per node {list(slots_per_node)}: every node but the last must hold the same "
                         f"number of ranks ({full}), the last at most that")
    tasks = [GangTask(WORKER_TASK, full, 0, head)]
    if head < len(slots_per_node):
        tasks.append(GangTask(LAST_TASK, slots_per_node[-1], head, 1))
    return tasks


def pod_name(job_name: str, task: str, index: int) -> str:
    """The pod Volcano makes for replica `index` of `task` of the Job `job_name`."""
    return f"{job_name}-{task}-{index}"


def pod_host(job_name: str, pod: str) -> str:
    """A pod's DNS name (`<pod hostname>.<headless service>`, Volcano's `svc` plugin): its
    torchrun agent's `--local-addr`."""
    return f"{pod}.{job_name}"


def rendezvous_pod(job_name: str) -> str:
    """The pod of node rank 0, whose agent hosts the c10d rendezvous store."""
    return pod_name(job_name, WORKER_TASK, 0)


def node_order(job_name: str, pods: Iterable[str]) -> list[str]:
    """The pods of the Job `job_name` in node-rank order: their DNS names sorted as strings, as
    torchrun's c10d rendezvous sorts its participants (their addresses are all distinct, so the
    pid and local id that follow the address in `_NodeDesc` never decide)."""
    return sorted(pods, key=lambda pod: pod_host(job_name, pod))


def gang_pods(job_name: str, tasks: Sequence[GangTask]) -> list[str]:
    """Every pod the Job makes, in node-rank order."""
    return node_order(job_name, [pod_name(job_name, t.name, i) for t in tasks for i in range(t.replicas)])


def rank_ranges(job_name: str, tasks: Sequence[GangTask]) -> dict[str, range]:
    """Each pod's global ranks, the pods in node-rank order: a pod's first rank is the sum of
    the slots of the pods before it (how torchrun's agents assign ranks, `_assign_worker_ranks`)."""
    slots = {pod_name(job_name, t.name, i): t.slots for t in tasks for i in range(t.replicas)}
    out: dict[str, range] = {}
    first = 0
    for pod in node_order(job_name, slots):
        out[pod] = range(first, first + slots[pod])
        first += slots[pod]
    return out
