"""The gang's pods and their node ranks (`plugins/launch/gang_pods.py`), held against torch's
own c10d rendezvous: its `_NodeDesc`s sorted are the order the agents get their ranks in."""

from __future__ import annotations

import random

import pytest
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

from trainyard.plugins.launch.gang_pods import (
    LAST_TASK,
    WORKER_TASK,
    GangTask,
    gang_pods,
    gang_tasks,
    node_order,
    pod_host,
    rank_ranges,
    rendezvous_pod,
)


def torch_order(job: str, pods: list[str]) -> list[str]:
    """The pods as c10d ranks them: each agent a `_NodeDesc` of its `--local-addr` (the pod's DNS
    name), its pid and a local id, sorted (`dynamic_rendezvous._mark_rendezvous_complete`)."""
    rng = random.Random(7)
    descs = [_NodeDesc(pod_host(job, pod), rng.randrange(1, 4_000_000), rng.randrange(0, 3)) for pod in pods]
    by_addr = {pod_host(job, pod): pod for pod in pods}
    return [by_addr[d.addr] for d in sorted(descs)]


@pytest.mark.parametrize("slots", [[8] * 12, [8] * 1_248, [4] * 101 + [2], [1] * 3])
def test_node_order_is_torchs_rendezvous_order(slots: list[int]) -> None:
    job = "gpt-200b-4f2a1c"
    tasks = gang_tasks(slots)
    pods = [f"{job}-{t.name}-{i}" for t in tasks for i in range(t.replicas)]
    random.Random(len(slots)).shuffle(pods)
    ordered = node_order(job, pods)
    assert ordered == torch_order(job, pods) == gang_pods(job, tasks)
    assert ordered[0] == rendezvous_pod(job) == f"{job}-worker-0"  # node rank 0 hosts the store
    if len(slots) > 10:  # string order, not the indexes: worker-10 comes before worker-2
        assert ordered.index(f"{job}-worker-10") < ordered.index(f"{job}-worker-2")
    if slots[-1] != slots[0]:
        assert ordered[-1] == f"{job}-{LAST_TASK}-0"  # the last node's fewer ranks stay the last ranks


def test_the_order_is_of_the_dns_names_not_of_the_pod_names() -> None:
    """`-` sorts before `.`: a pod whose name extends another's with `-…` comes first as a DNS
    name, where the bare names would put it second — the order is torch's, of the addresses."""
    pods = ["a-worker-1", "a-worker-1-0", "a-worker-10"]
    assert sorted(pods) == pods
    assert node_order("a", pods) == torch_order("a", pods) == ["a-worker-1-0", "a-worker-1", "a-worker-10"]


def test_each_pods_ranks_follow_its_place_and_the_slots_before_it() -> None:
    job = "j"
    ranges = rank_ranges(job, gang_tasks([4] * 11 + [2]))
    assert list(ranges) == node_order(job, ranges)
    assert ranges["j-worker-0"] == range(0, 4) and ranges["j-worker-1"] == range(4, 8)
    assert ranges["j-worker-10"] == range(8, 12)  # third in c10d's order
    assert ranges["j-worker-2"] == range(12, 16) and ranges[f"j-{LAST_TASK}-0"] == range(44, 46)
    assert sorted(r for ranks in ranges.values() for r in ranks) == list(range(46))


def test_tasks_one_per_slots_value_only_the_last_node_may_hold_fewer() -> None:
    assert gang_tasks([8, 8, 8]) == [GangTask(WORKER_TASK, 8, 0, 3)]
    assert gang_tasks([8, 8, 2]) == [GangTask(WORKER_TASK, 8, 0, 2), GangTask(LAST_TASK, 2, 2, 1)]
    assert gang_tasks([2]) == [GangTask(WORKER_TASK, 2, 0, 1)]
    for bad in ([8, 4, 8], [4, 8], [8, 4, 4]):
        with pytest.raises(ValueError, match="every node but the last must hold the same number of ranks"):
            gang_tasks(bad)
