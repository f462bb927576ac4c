"""A namespace per team (issue 56): the objects a cluster administrator applies once per team,
rendered by `trainyard render k8s` beside the job.

Why one namespace each: Kubernetes scopes quota, Pod Security Admission, ServiceAccounts and
RBAC by namespace, so a team's namespace is where each of those controls can say "this team".
Per team (from `config/teams.yaml`):
- the `Namespace`, labelled for Pod Security Admission `restricted` (enforce, and audit/warn at
  the same level): no privileged pod, no root, no hostPath, no added capability but
  NET_BIND_SERVICE, seccomp RuntimeDefault, no privilege escalation;
- a `ResourceQuota` on the team's accelerators from its `quotaGpus`: `requests.nvidia.com/gpu`
  on GPU clusters, `requests.cpu` on CPU clusters (a CPU cluster's slot is one core); a team
  without a quota gets none (the cluster is its cap);
- a `ServiceAccount` for data access (`TEAM_ACCOUNT`) that the job's pods run as, without an
  API token mounted (the pods never call the API server; the account is what a cloud's workload
  identity binds storage permissions to);
- its Volcano `Queue` stays in `manifests.render_queues` (one home), and the control plane's
  RoleBinding in the namespace in `rbac.render_rbac`.

The platform's own namespace (`PLATFORM_NAMESPACE`: the control plane's ServiceAccount and the
node-agent DaemonSet) is labelled `privileged`: the node agent needs a hostPort and hostPath
(heartbeats), which `restricted` and `baseline` refuse; no job runs there.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.config.teams import Team, Teams

PLATFORM_NAMESPACE = "trainyard"
"""The control plane's ServiceAccount and the node-agent DaemonSet (not a team's)."""
TEAM_NAMESPACE_PREFIX = "team-"
TEAM_ACCOUNT = "trainyard-data"
"""The ServiceAccount a team's job pods run as (one per team namespace)."""
PSA_LABEL = "pod-security.kubernetes.io"
MANAGED = {"app.kubernetes.io/managed-by": "trainyard"}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def team_namespace(team: str) -> str:
    """`team-<team>`; refuses a team name that would not make a namespace (a DNS label)."""
    name = f"{TEAM_NAMESPACE_PREFIX}{team}"
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise ValueError(f"team {team!r} cannot name a namespace ({name!r} is not a DNS label of at most 63 "
                         "characters: lower-case letters, digits and '-')")
    return name


def pod_security_labels(level: str) -> dict[str, str]:
    """Pod Security Admission at `level` for enforce, audit and warn (the latest policy version)."""
    return {f"{PSA_LABEL}/{mode}": level for mode in ("enforce", "audit", "warn")} | {
        f"{PSA_LABEL}/{mode}-version": "latest" for mode in ("enforce", "audit", "warn")}


def quota_resource(cpu_cluster: bool) -> str:
    """The ResourceQuota key a team's accelerator quota caps."""
    return "requests.cpu" if cpu_cluster else "requests.nvidia.com/gpu"


def render_platform_namespace(namespace: str = PLATFORM_NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": MANAGED | pod_security_labels("privileged")}}


def render_team(name: str, team: Team, *, cpu_cluster: bool) -> list[dict[str, Any]]:
    """Namespace, ResourceQuota (when the team has a quota) and data ServiceAccount of one team."""
    namespace = team_namespace(name)
    labels = MANAGED | {"trainyard.io/team": name}
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": namespace, "labels": labels | pod_security_labels("restricted")}}]
    if team.quota_gpus is not None:
        docs.append({"apiVersion": "v1", "kind": "ResourceQuota",
                     "metadata": {"name": "accelerators", "namespace": namespace, "labels": labels},
                     "spec": {"hard": {quota_resource(cpu_cluster): str(team.quota_gpus)}}})
    docs.append({"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": TEAM_ACCOUNT, "namespace": namespace, "labels": labels},
                 "automountServiceAccountToken": False})
    return docs


def render_teams(teams: Teams, *, cpu_cluster: bool) -> list[dict[str, Any]]:
    """Every team's objects, teams sorted by name."""
    return [doc for name, team in sorted(teams.teams.items()) for doc in render_team(name, team, cpu_cluster=cpu_cluster)]
