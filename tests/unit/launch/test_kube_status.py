"""Reading a Volcano Job's pods (`plugins/launch/kube_status.py`) when the scheduler bound them
in an order that is not their indexes': node ranks follow c10d's order of the pods' DNS names,
each pod's ranks its place in it, and the handle names the nodes they really run on."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

from trainyard.plugins.launch.kube_status import Observed, owned_pods, run_status
from trainyard.plugins.run.model import RunHandle

NODES = 12
SLOTS = 2
PLACED = [f"node-{i:02d}" for i in range(NODES)]
"""The placement's nodes, in its (rack) order."""


def job() -> dict[str, Any]:
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u1"},
            "spec": {"minAvailable": NODES, "tasks": [{"name": "worker", "replicas": NODES, "template": {
                "metadata": {"annotations": {"trainyard.io/slots": str(SLOTS)}}, "spec": {}}}]},
            "status": {"state": {"phase": "Running"}, "running": NODES}}


def pod(index: int, node: str, *, failed: dict[int, int] | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": "2026-12-07T08:00:00Z"}}
    phase = "Running"
    if failed:
        lines = "\n".join(json.dumps({"rank": r, "restart": 0, "exit_code": c, "ended_at": 1000.0 + r})
                          for r, c in failed.items())
        state = {"terminated": {"exitCode": 1, "reason": "Error", "message": lines,
                                "finishedAt": "2026-12-07T08:01:00+00:00"}}
        phase = "Failed"
    return {"metadata": {"name": f"j-worker-{index}", "namespace": "ns", "uid": f"p{index}",
                         "ownerReferences": [{"uid": "u1"}]},
            "spec": {"nodeName": node},
            "status": {"phase": phase, "containerStatuses": [{"name": "trainer", "state": state}]}}


def handle() -> RunHandle:
    return RunHandle(kind="kubernetes", job="j", attempt=0, world_size=NODES * SLOTS, namespace="ns", name="j",
                     uid="u1", nodes=PLACED, ranks_per_node=SLOTS, created_at=datetime.now(UTC))


def test_pods_bound_out_of_index_order_are_read_in_c10ds_order() -> None:
    # the scheduler's binding: pod i on a node that has nothing to do with i or the placement's order
    bound = dict(zip(range(NODES), random.Random(3).sample(PLACED, NODES), strict=True))
    order = [0, 1, 10, 11, 2, 3, 4, 5, 6, 7, 8, 9]  # `j-worker-<i>.j` sorted as strings
    # pod 10 is node rank 2 (ranks 4-5): its rank 5 failed
    pods = [pod(i, bound[i], failed={5: 1, 4: 0} if i == 10 else None) for i in range(NODES)]
    random.Random(5).shuffle(pods)
    seen = Observed(job=job(), pods=owned_pods(handle(), pods, "u1"))
    status = run_status(handle(), seen)
    assert [a.pod for a in status.agents] == [f"j-worker-{i}" for i in order]
    assert [a.node for a in status.agents] == [bound[i] for i in order]
    assert [r.rank for r in status.ranks] == list(range(NODES * SLOTS))
    by_rank = {r.rank: r for r in status.ranks}
    for position, i in enumerate(order):
        assert {by_rank[SLOTS * position + k].node for k in range(SLOTS)} == {bound[i]}
    assert (by_rank[5].exit_code, by_rank[4].exit_code, status.failed_rank, status.exit_code) == (1, 0, 5, 1)
    # the nodes the gang runs on, in node-rank order: the handle's from now on
    assert status.nodes == [bound[i] for i in order] != PLACED
    assert handle().bound(status).nodes == status.nodes
    assert handle().bound(status).gang_nodes[2] == bound[10]


def test_until_every_pod_is_bound_the_handle_keeps_the_placements_nodes() -> None:
    h = handle()
    pods = [pod(i, PLACED[i] if i != 7 else "") for i in range(NODES)]
    status = run_status(h, Observed(job=job(), pods=owned_pods(h, pods, "u1")))
    assert status.nodes == []
    assert h.bound(status) is h and h.gang_nodes == PLACED
    # pods not made yet (real Volcano makes none before the gang is admitted): no order of nodes,
    # and each pod made keeps the ranks of its place among all the Job's pods, not among those seen
    status = run_status(h, Observed(job=job(), pods=owned_pods(h, pods[:5], "u1")))
    assert status.nodes == [] and h.bound(status) is h
    assert [a.pod for a in status.agents] == [f"j-worker-{i}" for i in range(5)]
    assert [r.rank for r in status.ranks] == [0, 1, 2, 3, 8, 9, 10, 11, 12, 13]  # worker-10, -11 come before -2


def test_a_job_rendered_with_a_task_per_node_before_the_upgrade_is_still_read_right() -> None:
    """An attempt launched by the previous release (tasks `worker-NN`, one pod each, a
    `trainyard.io/ranks` range per template) keeps its ranks when a new control plane polls it."""
    old = job()
    old["spec"]["tasks"] = [{"name": f"worker-{i:02d}", "replicas": 1, "template": {"metadata": {"annotations": {
        "trainyard.io/ranks": f"{SLOTS * i}-{SLOTS * i + SLOTS - 1}"}}, "spec": {}}} for i in range(NODES)]
    pods = [pod(0, PLACED[i]) for i in range(NODES)]
    for i, p in enumerate(pods):
        p["metadata"]["name"] = f"j-worker-{i:02d}-0"
    h = handle()
    status = run_status(h, Observed(job=old, pods=owned_pods(h, pods[::-1], "u1")))
    assert [a.pod for a in status.agents] == [f"j-worker-{i:02d}-0" for i in range(NODES)]
    assert [(r.rank, r.node) for r in status.ranks] == [(r, PLACED[r // SLOTS]) for r in range(NODES * SLOTS)]
    assert status.nodes == PLACED
