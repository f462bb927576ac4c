"""A team's namespace, quota and data account as rendered (the real API server judges them in
`tests/integration/launch/test_tenancy_real_apiserver.py`)."""

from __future__ import annotations

import pytest

from tests.unit.launch.launch_fixtures import validate_k8s
from trainyard.config.teams import Team, Teams, load_teams
from trainyard.plugins.launch.rbac import JOBS_ROLE, render_rbac
from trainyard.plugins.launch.tenancy import render_platform_namespace, render_teams, team_namespace


def test_each_team_gets_a_restricted_namespace_its_quota_and_a_data_account() -> None:
    docs = render_teams(Teams(teams={"nlp": Team(share=0.5, quota_gpus=64), "free": Team(share=0.1)}), cpu_cluster=False)
    for doc in docs:
        validate_k8s(doc)
    by = {(d["kind"], d["metadata"].get("namespace", d["metadata"]["name"])): d for d in docs}
    assert sorted(by) == [("Namespace", "team-free"), ("Namespace", "team-nlp"), ("ResourceQuota", "team-nlp"),
                          ("ServiceAccount", "team-free"), ("ServiceAccount", "team-nlp")]
    labels = by["Namespace", "team-nlp"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/enforce-version"] == "latest"
    assert by["ResourceQuota", "team-nlp"]["spec"] == {"hard": {"requests.nvidia.com/gpu": "64"}}
    assert by["ServiceAccount", "team-nlp"]["automountServiceAccountToken"] is False
    platform = render_platform_namespace()
    assert platform["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_a_cpu_cluster_quota_caps_cpu_requests() -> None:
    quotas = [d for d in render_teams(load_teams(), cpu_cluster=True) if d["kind"] == "ResourceQuota"]
    assert {q["metadata"]["namespace"]: q["spec"]["hard"] for q in quotas}["team-demo"] == {"requests.cpu": "8"}


@pytest.mark.parametrize("team", ["Vision", "a_b", "x" * 60])
def test_a_team_name_that_cannot_name_a_namespace_is_refused(team: str) -> None:
    with pytest.raises(ValueError, match="cannot name a namespace"):
        team_namespace(team)


def test_the_control_plane_is_bound_in_each_jobs_namespace_and_nowhere_else() -> None:
    docs = render_rbac("trainyard", ["team-a", "team-b", "team-a"])
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    assert {b["roleRef"]["name"] for b in bindings} == {JOBS_ROLE}
    assert {b["subjects"][0]["namespace"] for b in bindings} == {"trainyard"}
    assert not any(d["kind"] == "Role" for d in docs)  # the rules live in ClusterRoles, granted per namespace
    assert [b["metadata"]["namespace"] for b in render_rbac("ml") if b["kind"] == "RoleBinding"] == ["ml"]
