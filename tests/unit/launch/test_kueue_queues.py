from __future__ import annotations

from trainyard.config.teams import Team, Teams
from trainyard.plugins.launch.kueue_queues import (
    FLAVOR,
    LOCAL_QUEUE,
    covered_resources,
    eviction_cause,
    guaranteed_shares,
    render_kueue_queues,
    team_quota,
    workload_state,
)
from trainyard.plugins.launch.manifests import PRIORITY_VALUES
from trainyard.plugins.launch.tenancy import team_namespace


def test_a_teams_quota_is_its_share_and_it_borrows_up_to_its_hard_quota() -> None:
    assert team_quota(Team(share=0.25, quota_gpus=40), 100) == (25, 15)
    assert team_quota(Team(share=0.25, quota_gpus=40, can_borrow=False), 100) == (25, 0)
    assert team_quota(Team(share=0.25), 100) == (25, 75)  # no hard quota: the cluster caps it
    assert team_quota(Team(share=0.5, quota_gpus=8), 100) == (8, 0)  # the hard quota caps the share


def test_the_guaranteed_shares_add_up_to_the_cluster_on_a_small_one() -> None:
    """Six teams on 3 CPUs (`config/teams.yaml` on the e2e cluster): each share rounded down
    alone gave the cohort 1 CPU, so no 2-node gang was admitted; largest remainders give 3."""
    teams = Teams(teams={"foundation": Team(share=0.4), "nlp": Team(share=0.25), "vision": Team(share=0.15),
                         "speech": Team(share=0.1), "pool": Team(share=0.05), "demo": Team(share=0.05)})
    assert guaranteed_shares(teams, 3) == {"foundation": 1, "nlp": 1, "vision": 1, "speech": 0, "pool": 0, "demo": 0}
    assert sum(guaranteed_shares(teams, 7).values()) == 7
    assert guaranteed_shares(teams, 10_000)["foundation"] == 4_000  # exact shares stay exact
    nominal = [int(d["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"])
               for d in render_kueue_queues(teams, 3, cpu_cluster=True) if d["kind"] == "ClusterQueue"]
    assert sum(nominal) == 3, nominal
    # shares that leave part of the cluster unguaranteed keep it so
    assert guaranteed_shares(Teams(teams={"a": Team(share=0.3), "b": Team(share=0.3)}), 5) == {"a": 2, "b": 1}


def test_each_teams_queue_admits_only_its_own_namespace_and_covers_what_its_pods_request() -> None:
    teams = Teams(teams={"a": Team(share=0.5), "b": Team(share=0.5)})
    docs = render_kueue_queues(teams, 16, cpu_cluster=True)
    queues = [d for d in docs if d["kind"] == "ClusterQueue"]
    assert [q["spec"]["namespaceSelector"]["matchLabels"] for q in queues] == [
        {"kubernetes.io/metadata.name": team_namespace("a")}, {"kubernetes.io/metadata.name": team_namespace("b")}]
    assert all(q["spec"]["resourceGroups"][0]["coveredResources"] == ["cpu"] for q in queues)
    assert all(q["spec"]["resourceGroups"][0]["flavors"][0]["name"] == FLAVOR for q in queues)
    local = [d for d in docs if d["kind"] == "LocalQueue"]
    assert [(d["metadata"]["namespace"], d["metadata"]["name"], d["spec"]["clusterQueue"]) for d in local] == [
        (team_namespace("a"), LOCAL_QUEUE, "a"), (team_namespace("b"), LOCAL_QUEUE, "b")]
    assert {d["value"] for d in docs if d["kind"] == "WorkloadPriorityClass"} == set(PRIORITY_VALUES.values())
    assert covered_resources(cpu_cluster=False, rdma_resource="rdma/x") == ["nvidia.com/gpu", "rdma/x"]


def condition(kind: str, status: str, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def test_a_workloads_state_keeps_kueues_own_words() -> None:
    pending = {"status": {"conditions": [condition(
        "QuotaReserved", "False", "Pending",
        "couldn't assign flavors to pod set main: insufficient quota for cpu in flavor f, 3 more needed")]}}
    state = workload_state(pending)
    assert state.state == "pending" and "insufficient quota for cpu" in state.describe()
    admitted = {"status": {"conditions": [condition("QuotaReserved", "True", "QuotaReserved"),
                                          condition("Admitted", "True", "Admitted", "The workload is admitted")]}}
    assert workload_state(admitted).state == "admitted"
    evicted = {"status": {"conditions": [*admitted["status"]["conditions"], condition(
        "Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: u) due to prioritization")]}}
    assert workload_state(evicted).state == "evicted" and workload_state(evicted).reason == "Preempted"
    assert workload_state({"status": {"conditions": [condition("Finished", "True", "Succeeded")]}}).state == "finished"
    assert workload_state({}).describe() == "pending: not yet considered by Kueue"


def test_an_evictions_cause_is_kueues_reason_its_preemption_kind_and_its_message() -> None:
    message = "Preempted to accommodate a workload (UID: u, JobUID: j) due to reclamation within the cohort"
    admitted = [condition("QuotaReserved", "True", "QuotaReserved"), condition("Admitted", "True", "Admitted")]
    assert eviction_cause({"status": {"conditions": admitted}}) == "" and eviction_cause(None) == ""
    evicted = {"status": {"conditions": [*admitted, condition("Evicted", "True", "Preempted", message),
                                         condition("Preempted", "True", "InCohortReclamation", message)]}}
    assert eviction_cause(evicted) == f"Preempted (InCohortReclamation): {message}"
    timeout = {"status": {"conditions": [condition("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout")]}}
    assert eviction_cause(timeout) == "PodsReadyTimeout: Exceeded the PodsReady timeout"
    # admitted again: Kueue clears Evicted (and Preempted)
    again = {"status": {"conditions": [*admitted, condition("Evicted", "False", "QuotaReserved", "Previously: …"),
                                       condition("Preempted", "False", "QuotaReserved")]}}
    assert eviction_cause(again) == ""
