"""Teams isolated by the real kube-apiserver (issue 56): the rendered team objects of two teams
applied by the administrator, then judged by the API server's own authorizer and admission
plugins — RBAC, Pod Security Admission, ResourceQuota — and its NetworkPolicy validation.

As in `test_rbac_real_apiserver.py`, no Volcano CRDs are installed (the module proxy refuses
Volcano, `tests/support/kube/components.py`): a Volcano Job call that is authorized answers 404,
one refused answers 403 before any routing, and a SelfSubjectAccessReview says the same in words.

The quota admission plugin refuses every pod in a namespace whose quota has no status yet;
kube-controller-manager's quota controller would write it (`hard` = the spec, `used` = 0), and
no controller runs here (`real.py` starts etcd and the API server only), so the administrator
writes that status once. From then on the admission plugin itself counts each admitted pod into
`used`, and its refusal is what is tested.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kube import real
from tests.support.require import missing
from trainyard.config.teams import Team, Teams
from trainyard.plugins.launch.manifests import (
    VOLCANO_GROUP,
    VOLCANO_PLURAL,
    VOLCANO_VERSION,
    KubernetesOptions,
    render_volcano_job,
)
from trainyard.plugins.launch.netpol import render_network_policy
from trainyard.plugins.launch.rbac import ACCOUNT, render_rbac
from trainyard.plugins.launch.tenancy import (
    PLATFORM_NAMESPACE,
    TEAM_ACCOUNT,
    render_platform_namespace,
    render_teams,
    team_namespace,
)

pytestmark = pytest.mark.slow
TEAMS = Teams(teams={"alpha": Team(share=0.4, quota_gpus=8), "beta": Team(share=0.4, quota_gpus=16),
                     "gamma": Team(share=0.2)})
"""Two teams with quotas (the quota test fills alpha's) and one without (the rendered pods' test)."""
ALPHA, BETA, GAMMA = (team_namespace(team) for team in TEAMS.teams)
JOB = (VOLCANO_GROUP, VOLCANO_VERSION)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[real.ControlPlane, dict[str, str]]]:
    """One control plane for the module: the platform's and both teams' rendered objects applied
    by the administrator; tokens of the control plane's account and of each team's data account."""
    if real.binaries_missing():
        missing("kube", f"the Kubernetes binaries are not built: {', '.join(real.binaries_missing())}")
    from kubernetes import client, utils

    with real.control_plane(tmp_path_factory.mktemp("kube")) as plane:
        admin = plane.client()
        core = client.CoreV1Api(admin)
        docs = [render_platform_namespace(), *render_teams(TEAMS, cpu_cluster=False),
                *render_rbac(PLATFORM_NAMESPACE, [ALPHA, BETA, GAMMA])]
        for doc in docs:
            utils.create_from_dict(admin, doc)
        for doc in docs:  # what kube-controller-manager's quota controller would write (module docstring)
            if doc["kind"] == "ResourceQuota":
                hard = doc["spec"]["hard"]
                core.patch_namespaced_resource_quota_status(doc["metadata"]["name"], doc["metadata"]["namespace"], {
                    "status": {"hard": hard, "used": dict.fromkeys(hard, "0")}})
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
        tokens = {"platform": core.create_namespaced_service_account_token(ACCOUNT, PLATFORM_NAMESPACE, request)}
        for team in TEAMS.teams:
            tokens[team] = core.create_namespaced_service_account_token(TEAM_ACCOUNT, team_namespace(team), request)
        yield plane, {who: answer.status.token for who, answer in tokens.items()}


def refusal(call: Any, *args: Any, **kwargs: Any) -> tuple[int, str]:
    """(HTTP status, the API server's message); (200, '') when accepted."""
    from kubernetes.client.exceptions import ApiException

    try:
        call(*args, **kwargs)
    except ApiException as e:
        try:
            return int(e.status), json.loads(e.body).get("message", "")
        except (TypeError, ValueError):  # not a Status object: "404 page not found" where no CRD is
            return int(e.status), str(e.body or "")
    return 200, ""


def allowed(api: Any, verb: str, group: str, resource: str, namespace: str) -> bool:
    from kubernetes import client

    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(group=group, resource=resource, verb=verb, namespace=namespace)))
    return bool(client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed)


def pod(name: str, *, gpus: int = 0, **container_security: Any) -> dict[str, Any]:
    """A pod that passes Pod Security `restricted` unless `container_security` says otherwise."""
    security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}} | container_security
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "serviceAccountName": TEAM_ACCOUNT,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": "busybox", "securityContext": security, "resources": resources}]}}


def test_the_control_plane_may_create_volcano_jobs_only_in_team_namespaces(cluster: Any) -> None:
    from kubernetes import client

    plane, tokens = cluster
    api = plane.client(tokens["platform"])
    custom = client.CustomObjectsApi(api)
    for namespace in (ALPHA, BETA):  # authorized: 404 only because no Volcano CRD is installed
        assert allowed(api, "create", VOLCANO_GROUP, VOLCANO_PLURAL, namespace)
        assert refusal(custom.create_namespaced_custom_object, *JOB, namespace, VOLCANO_PLURAL, {})[0] == 404
    for namespace in (PLATFORM_NAMESPACE, "default", "kube-system"):
        assert not allowed(api, "create", VOLCANO_GROUP, VOLCANO_PLURAL, namespace)
        status, message = refusal(custom.create_namespaced_custom_object, *JOB, namespace, VOLCANO_PLURAL, {})
        assert status == 403 and f"system:serviceaccount:{PLATFORM_NAMESPACE}:{ACCOUNT}" in message


def test_a_teams_account_cannot_create_in_another_teams_namespace(cluster: Any) -> None:
    from kubernetes import client

    plane, tokens = cluster
    api = plane.client(tokens["alpha"])
    status, message = refusal(client.CustomObjectsApi(api).create_namespaced_custom_object, *JOB, BETA,
                              VOLCANO_PLURAL, {})
    assert status == 403 and f'cannot create resource "jobs" in API group "{VOLCANO_GROUP}" in the namespace "{BETA}"' in message
    status, message = refusal(client.CoreV1Api(api).create_namespaced_pod, BETA, pod("intruder"))
    assert status == 403 and f"system:serviceaccount:{ALPHA}:{TEAM_ACCOUNT}" in message
    assert not allowed(api, "create", "", "pods", BETA) and not allowed(api, "get", "", "secrets", BETA)


@pytest.mark.parametrize(("what", "security", "says"), [
    ("root", {"runAsUser": 0}, 'runAsUser=0 (container "c" must not set runAsUser=0)'),
    ("sys-admin", {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}},
     'container "c" must not include "SYS_ADMIN" in securityContext.capabilities.add'),
    ("escalating", {"allowPrivilegeEscalation": True},
     'allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false)'),
])
def test_pod_security_admission_refuses_a_privileged_or_root_pod_in_a_team_namespace(
        cluster: Any, what: str, security: dict[str, Any], says: str) -> None:
    from kubernetes import client

    plane, _ = cluster
    core = client.CoreV1Api(plane.client())  # even the administrator
    status, message = refusal(core.create_namespaced_pod, ALPHA, pod(what, **security), dry_run="All")
    assert status == 403 and 'violates PodSecurity "restricted:latest"' in message and says in message


def test_a_privileged_container_is_refused_before_admission_here(cluster: Any) -> None:
    """`privileged: true` itself never reaches Pod Security here: this API server runs with
    `--allow-privileged=false` (`real.py`), whose validation refuses it first, in any namespace.
    A cluster that allows privileged containers relies on the namespace's `restricted` (above)."""
    from kubernetes import client

    plane, _ = cluster
    core = client.CoreV1Api(plane.client())
    for namespace, account in ((ALPHA, TEAM_ACCOUNT), (PLATFORM_NAMESPACE, ACCOUNT)):
        privileged = pod("privileged", privileged=True)
        privileged["spec"]["serviceAccountName"] = account
        status, message = refusal(core.create_namespaced_pod, namespace, privileged, dry_run="All")
        assert status == 422 and "privileged: Forbidden: disallowed by cluster policy" in message


def test_the_platform_namespace_is_not_restricted(cluster: Any) -> None:
    """Where the node agent runs (hostPort, hostPath, root for the kubelet's folder): the same
    root pod the team namespace refuses is admitted."""
    from kubernetes import client

    plane, _ = cluster
    core = client.CoreV1Api(plane.client())
    root = pod("root", runAsUser=0)
    root["spec"] |= {"serviceAccountName": ACCOUNT, "securityContext": {}}
    assert refusal(core.create_namespaced_pod, ALPHA, root, dry_run="All")[0] == 403
    assert refusal(core.create_namespaced_pod, PLATFORM_NAMESPACE, root, dry_run="All") == (200, "")


def test_the_rendered_job_pods_pass_pod_security_restricted(cluster: Any) -> None:
    from kubernetes import client

    from tests.unit.launch.launch_fixtures import gpu_job, pod_of

    plane, _ = cluster
    core = client.CoreV1Api(plane.client())
    job, plan, placement, env = gpu_job()
    options = KubernetesOptions(namespace=GAMMA, service_account=TEAM_ACCOUNT)
    assert not core.list_namespaced_resource_quota(GAMMA).items  # a team without a quota has none
    body = render_volcano_job(job, plan, placement, env, attempt=0, options=options)
    for task in body["spec"]["tasks"][:2]:
        assert refusal(core.create_namespaced_pod, GAMMA, pod_of(task), dry_run="All") == (200, "")
    # The same pod with the capability RDMA would like is refused by the admission, in its words.
    body = render_volcano_job(job, plan, placement, env, attempt=0, options=options.model_copy(update={"ipc_lock": True}))
    status, message = refusal(core.create_namespaced_pod, GAMMA, pod_of(body["spec"]["tasks"][0]), dry_run="All")
    assert status == 403 and 'must not include "IPC_LOCK" in securityContext.capabilities.add' in message


def test_a_pod_over_its_teams_quota_is_refused_with_the_quotas_message(cluster: Any) -> None:
    from kubernetes import client

    plane, _ = cluster
    core = client.CoreV1Api(plane.client())
    assert refusal(core.create_namespaced_pod, ALPHA, pod("eight", gpus=8)) == (200, "")
    status, message = refusal(core.create_namespaced_pod, ALPHA, pod("one-more", gpus=1))
    assert status == 403 and message == (
        'pods "one-more" is forbidden: exceeded quota: accelerators, requested: requests.nvidia.com/gpu=1, '
        "used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8")
    # Another team's quota is its own.
    assert refusal(core.create_namespaced_pod, BETA, pod("nine", gpus=9)) == (200, "")


def test_the_rendered_network_policy_is_accepted_and_a_malformed_one_refused(cluster: Any) -> None:
    from kubernetes import client

    plane, _ = cluster
    net = client.NetworkingV1Api(plane.client())
    policy = render_network_policy("gpt-abc123", ALPHA, {"trainyard.io/job": "gpt", "trainyard.io/run": "r-1"},
                                   endpoints=["http://10.0.0.9:9000", "http://mlflow.ml.svc.cluster.local:5000",
                                              "s3://bucket/objects", "https://tracker.example.com"],
                                   platform_namespace=PLATFORM_NAMESPACE)
    assert refusal(net.create_namespaced_network_policy, ALPHA, policy) == (200, "")
    stored = net.read_namespaced_network_policy("gpt-abc123", ALPHA)
    assert len(stored.spec.egress) == 5 and stored.spec.policy_types == ["Ingress", "Egress"]
    broken = json.loads(json.dumps(policy))
    broken["metadata"]["name"] = "broken"
    broken["spec"]["egress"][2]["to"][0]["ipBlock"]["cidr"] = "10.0.0.9/99"
    status, message = refusal(net.create_namespaced_network_policy, ALPHA, broken)
    assert status == 422 and "spec.egress[2].to[0].ipBlock.cidr" in message
