"""The teams' Kueue objects (`kueue_queues.py`) accepted by a real kube-apiserver holding Kueue
v0.17.0's own CRDs — their OpenAPI schemas and CEL rules (e.g. a `borrowingLimit` needs a cohort,
at most 16 flavors, quantities well-formed) — the Kueue we build (`tests/support/kube/components.py`).
A rendering that drifts from Kueue's API is refused here, with the API server's words.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kube import real, real_cluster
from tests.support.kube.rest import Rest
from tests.support.require import missing
from trainyard.config.teams import Team, Teams
from trainyard.plugins.launch.kueue_queues import (
    COHORT,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LOCAL_QUEUE,
    PLURALS,
    render_cluster_queue,
    render_kueue_queues,
)
from trainyard.plugins.launch.tenancy import render_teams, team_namespace

pytestmark = pytest.mark.slow
TEAMS = Teams(teams={"alpha": Team(share=0.5, quota_gpus=12), "beta": Team(share=0.3, can_borrow=False),
                     "gamma": Team(share=0.2)})


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from kubernetes import utils

    if real_cluster.binaries_missing():
        missing("kube", f"Kueue is not built or its source is not cached: {', '.join(real_cluster.binaries_missing())}")
    with real.control_plane(tmp_path_factory.mktemp("kube")) as plane:
        api = plane.client()
        real_cluster.install_kueue_crds(Rest(plane.url, plane.admin_token, ca_file=str(plane.ca_file)))
        for doc in render_teams(TEAMS, cpu_cluster=False):
            utils.create_from_dict(api, doc)
        yield api


def create(api: Any, doc: dict[str, Any]) -> dict[str, Any]:
    from kubernetes import client

    custom, plural = client.CustomObjectsApi(api), PLURALS[doc["kind"]]
    namespace = doc["metadata"].get("namespace")
    if namespace:
        return custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, plural, doc)
    return custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, doc)


def test_every_rendered_queueing_object_is_accepted_with_kueues_own_schemas(admin: Any) -> None:
    docs = render_kueue_queues(TEAMS, 40, cpu_cluster=False, rdma_resource="rdma/rdma_shared_device_a")
    created = [create(admin, doc) for doc in docs]
    queues = {c["metadata"]["name"]: c for c in created if c["kind"] == "ClusterQueue"}
    assert set(queues) == set(TEAMS.teams)
    alpha = queues["alpha"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert {r["name"]: (r["nominalQuota"], r["borrowingLimit"]) for r in alpha} == {
        "nvidia.com/gpu": ("12", "0"), "rdma/rdma_shared_device_a": ("12", "0")}  # share 20 > quota 12: capped
    beta = queues["beta"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert (beta["nominalQuota"], beta["borrowingLimit"]) == ("12", "0")  # may not borrow
    gamma = queues["gamma"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert (gamma["nominalQuota"], gamma["borrowingLimit"]) == ("8", "32")  # no quota: up to the cluster
    locals_ = [c for c in created if c["kind"] == "LocalQueue"]
    assert {(c["metadata"]["namespace"], c["metadata"]["name"], c["spec"]["clusterQueue"]) for c in locals_} == {
        (team_namespace(t), LOCAL_QUEUE, t) for t in TEAMS.teams}
    assert all(q["spec"]["cohortName"] == COHORT for q in queues.values())


def test_kueues_schema_refuses_a_drifted_rendering(admin: Any) -> None:
    """The check above can fail: the same ClusterQueue without its cohort but with a borrowing
    limit is refused by Kueue's CEL rule, in the API server."""
    from kubernetes.client.exceptions import ApiException

    queue = render_cluster_queue("delta", Team(share=0.1, quota_gpus=8), total=40, cpu_cluster=False)
    del queue["spec"]["cohortName"]
    with pytest.raises(ApiException) as refused:
        create(admin, queue)
    assert refused.value.status == 422 and "borrowingLimit must be nil when cohort is empty" in refused.value.body
