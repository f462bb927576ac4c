"""Rendered Kubernetes manifests, validated against the real schemas: the Volcano CRDs'
OpenAPI schemas (strict: unknown fields rejected) and Kubernetes' own (kubernetes-validate)."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.unit.launch.launch_fixtures import gpu_job, pod_of, validate_k8s, validate_volcano
from trainyard.config.teams import load_teams
from trainyard.config.worker_env import WorkerEnv
from trainyard.plugins.advisor.rank_layout import RankLayout
from trainyard.plugins.launch.manifests import (
    KubernetesOptions,
    render_all,
    render_node_agent_daemonset,
    render_priority_classes,
    render_queues,
    render_volcano_job,
    volcano_job_name,
)

JOBS_CRD = "batch.volcano.sh_jobs.yaml"
QUEUES_CRD = "scheduling.volcano.sh_queues.yaml"


@pytest.fixture(scope="module")
def rendered() -> tuple[dict[str, Any], Any]:
    job, plan, placement, env = gpu_job()
    return render_volcano_job(job, plan, placement, env, attempt=2), placement


def test_volcano_job_validates_against_the_crd(rendered: tuple[dict[str, Any], Any]) -> None:
    body, _ = rendered
    validate_volcano(body, JOBS_CRD)


def test_every_pod_template_validates_as_a_kubernetes_pod(rendered: tuple[dict[str, Any], Any]) -> None:
    body, _ = rendered
    for task in body["spec"]["tasks"]:
        validate_k8s(pod_of(task))


def test_strict_schema_rejects_a_typo(rendered: tuple[dict[str, Any], Any]) -> None:
    body, _ = rendered
    broken = copy.deepcopy(body)
    broken["spec"]["minAvailble"] = broken["spec"].pop("minAvailable")
    with pytest.raises(jsonschema.ValidationError, match="minAvailble"):
        validate_volcano(broken, JOBS_CRD)
    pod = pod_of(broken["spec"]["tasks"][0])
    pod["spec"]["containers"][0]["resource"] = pod["spec"]["containers"][0].pop("resources")
    with pytest.raises(kubernetes_validate.ValidationError, match="resource"):
        validate_k8s(pod)


def test_one_task_of_replicas_confined_to_the_placements_nodes(rendered: tuple[dict[str, Any], Any]) -> None:
    body, placement = rendered
    spec = body["spec"]
    (task,) = spec["tasks"]
    assert spec["minAvailable"] == task["replicas"] == len(placement.nodes) == 32
    assert task["name"] == "worker" and task["template"]["metadata"]["annotations"] == {"trainyard.io/slots": "8"}
    assert spec["queue"] == "foundation" and spec["priorityClassName"] == "trainyard-critical"
    assert spec["schedulerName"] == "volcano" and "svc" in spec["plugins"]
    pod = task["template"]["spec"]
    # The placer's nodes are required (one list), and the pods repel per host.
    node_affinity = pod["affinity"]["nodeAffinity"]
    (required,) = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert required["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": placement.node_names}]
    assert list(node_affinity) == ["requiredDuringSchedulingIgnoredDuringExecution"]
    (apart,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert apart == {"labelSelector": {"matchLabels": {"trainyard.io/job": "gpt-200b"}},
                     "topologyKey": "kubernetes.io/hostname"}
    command = pod["containers"][0]["command"]
    # torchrun, through the entry that decides in the pod whether it hosts the rendezvous store
    assert command[:3] == ["python", "-m", "trainyard.plugins.launch.pod_entry"]
    options = command[3:command.index("-m", 3)]
    args = dict(zip(options[::2], options[1::2], strict=True))
    assert args["--nnodes"] == "32" and args["--nproc-per-node"] == "8"
    assert "--node-rank" not in args and "--rdzv-conf" not in args  # nothing of one pod in the template
    name = body["metadata"]["name"]
    assert name == volcano_job_name("gpt-200b", body["metadata"]["labels"]["trainyard.io/run"])
    # c10d on the pod `<name>-worker-0` (torchrun's in-place restart needs it: every agent joins a new round)
    assert args["--rdzv-backend"] == "c10d" and args["--rdzv-endpoint"] == f"{name}-worker-0.{name}:29500"
    assert args["--local-addr"] == f"$(POD_NAME).{name}"  # each pod's DNS name: c10d ranks the agents by it
    env = pod["containers"][0]["env"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in env
    assert command[-3:] == ["pretrain.py", "--config", "200b.yaml"]  # the spec's args, nothing added
    values = {e["name"]: e.get("value") for e in env}
    assert values["TRAINYARD_LEARNING_RATE"] == "0.0003"  # the learning rate as a variable instead


def test_resources_shm_security_and_environment(rendered: tuple[dict[str, Any], Any]) -> None:
    body, _ = rendered
    pod = body["spec"]["tasks"][0]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1"}
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
    sc = container["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}  # Pod Security restricted: no IPC_LOCK
    assert {"name": "heartbeats", "emptyDir": {}} in pod["volumes"]  # restricted: no hostPath
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NCCL_IB_DISABLE"] == "0" and env["NCCL_ALGO"] == "Ring"  # defaults + the plan's
    assert env["MY_FLAG"] == "1"
    contract = WorkerEnv.from_env({k: v for k, v in env.items() if v is not None})
    assert contract.job == "gpt-200b" and contract.attempt == 2
    assert contract.heartbeat_dir == "/var/run/trainyard/heartbeats/gpt-200b/r-test/2"
    assert contract.checkpoint_uri == "s3://trainyard/objects/jobs/gpt-200b/runs/r-test/checkpoints"
    assert any(e["name"] == "TRAINYARD_NODE" and e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
               for e in container["env"])


def _privileged_anywhere(obj: Any) -> bool:
    if isinstance(obj, dict):
        return obj.get("privileged") is True or any(_privileged_anywhere(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_privileged_anywhere(v) for v in obj)
    return False


def test_everything_rendered_validates_and_nothing_is_privileged() -> None:
    job, plan, placement, env = gpu_job()
    docs = render_all(job, plan, placement, env, load_teams(), attempt=0, total_gpus=10_000)
    kinds = [d["kind"] for d in docs]
    teams = ["Namespace", "ResourceQuota", "ServiceAccount"] * 6
    rbac = ["ServiceAccount", "ClusterRole"] + ["RoleBinding"] * 6 + ["ClusterRole", "ClusterRoleBinding"]
    assert kinds == (["Namespace", *teams, *rbac] + ["PriorityClass"] * 5 + ["Queue"] * 6
                     + ["DaemonSet", "NetworkPolicy", "Job"])
    for doc in docs:
        if doc["kind"] == "Queue":
            validate_volcano(doc, QUEUES_CRD)
        elif doc["kind"] == "Job":
            validate_volcano(doc, JOBS_CRD)
        else:
            validate_k8s(doc)
    assert not _privileged_anywhere(docs)


def test_queues_carry_shares_and_quotas() -> None:
    queues = {q["metadata"]["name"]: q["spec"] for q in render_queues(load_teams(), 10_000)}
    assert queues["foundation"] == {"weight": 40, "reclaimable": True, "deserved": {"nvidia.com/gpu": "4000"},
                                    "capability": {"nvidia.com/gpu": "6000"}}
    assert queues["demo"]["capability"] == {"nvidia.com/gpu": "8"}
    classes = {c["metadata"]["name"]: c["value"] for c in render_priority_classes()}
    assert classes["trainyard-critical"] > classes["trainyard-normal"] > classes["trainyard-preemptible"]


def test_node_agent_reads_the_pods_heartbeat_volumes_through_the_kubelets_folder() -> None:
    """The default: the pods' heartbeats are emptyDirs; the agent, in the platform's namespace,
    reads them under the kubelet's pods folder, read-only, as root with DAC_READ_SEARCH alone."""
    ds = render_node_agent_daemonset(KubernetesOptions(namespace="team-a", platform_namespace="ops"))
    validate_k8s(ds)
    assert ds["metadata"]["namespace"] == "ops"
    pod = ds["spec"]["template"]["spec"]
    agent = pod["containers"][0]
    assert agent["command"][-2:] == ["--heartbeat-dir", "/host/kubelet-pods/*/volumes/kubernetes.io~empty-dir/heartbeats"]
    assert agent["volumeMounts"] == [{"name": "kubelet-pods", "mountPath": "/host/kubelet-pods", "readOnly": True}]
    assert pod["volumes"] == [{"name": "kubelet-pods", "hostPath": {"path": "/var/lib/kubelet/pods", "type": "Directory"}}]
    sc = agent["securityContext"]
    assert sc["runAsUser"] == 0 and sc["capabilities"] == {"drop": ["ALL"], "add": ["DAC_READ_SEARCH"]}
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert "initContainers" not in pod
    assert pod["automountServiceAccountToken"] is False  # it never calls the API server
    elsewhere = render_node_agent_daemonset(KubernetesOptions(kubelet_pods_mount="/mnt/kp"))["spec"]["template"]["spec"]
    assert elsewhere["containers"][0]["command"][-1] == "/mnt/kp/*/volumes/kubernetes.io~empty-dir/heartbeats"
    assert elsewhere["containers"][0]["volumeMounts"][0]["mountPath"] == "/mnt/kp"


def test_node_agent_daemonset_runs_the_agent_as_specified() -> None:
    ds = render_node_agent_daemonset(KubernetesOptions(platform_namespace="ops", heartbeat_volume="hostPath"))
    validate_k8s(ds)
    pod = ds["spec"]["template"]["spec"]
    agent = pod["containers"][0]
    # every interface of the pod, said explicitly (the agent's own default is 127.0.0.1)
    assert agent["command"] == ["trainyard-node-agent", "--node", "$(NODE_NAME)", "--host", "0.0.0.0",
                                "--port", "9400", "--heartbeat-dir", "/var/run/trainyard/heartbeats"]
    assert agent["env"][0] == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/health", "port": 9400}
    assert pod["securityContext"]["runAsNonRoot"] is True
    # Only the init container that makes the heartbeat root writable runs as root, with no capabilities.
    init = pod["initContainers"][0]["securityContext"]
    assert init["runAsUser"] == 0 and init["capabilities"] == {"drop": ["ALL"]}
    assert init["allowPrivilegeEscalation"] is False


def test_cpu_job_requests_cpus_without_nccl_or_rdma() -> None:
    from trainyard.config.cluster import load_cluster
    from trainyard.config.loader import load_spec_file
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.launch.environment import build_worker_env
    from trainyard.plugins.placement.gang import place_gang
    from trainyard.plugins.placement.inventory import Inventory
    from trainyard.plugins.placement.model import GangRequest

    job = load_spec_file("config/jobs/demo-tiny-lm.yaml").model_copy(deep=True)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"image": "trainyard:demo"})})
    plan = Plan(layout=RankLayout(dp=2))
    placement = place_gang(GangRequest.for_job(job, plan), Inventory.from_cluster(load_cluster("local")))
    from trainyard.config.settings import Settings

    env = build_worker_env(job, plan, Settings(home="/tmp/unused-trainyard-home"), run="r-test", attempt=0)
    body = render_volcano_job(job, plan, placement, env, attempt=0)
    validate_volcano(body, JOBS_CRD)
    container = body["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "2"}
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not any(e["name"].startswith("NCCL_") for e in container["env"])


def test_refuses_without_image_or_beyond_the_object_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.plugins.launch import manifests

    job, plan, placement, env = gpu_job(image=None)
    with pytest.raises(ValueError, match=r"spec\.image is required"):
        render_volcano_job(job, plan, placement, env, attempt=0)
    big = gpu_job(hardware={"gpuType": "H100", "gpuCount": 4096})
    render_volcano_job(*big[:4], attempt=0)  # 512 nodes: one task, far below the limit
    monkeypatch.setattr(manifests, "MAX_OBJECT_BYTES", 12_000)
    with pytest.raises(ValueError, match=r"the Volcano Job for 512 nodes is [\d,]+ bytes; the API server accepts "
                                         r"at most ~12,000"):
        render_volcano_job(*big[:4], attempt=0)


def test_rack_pinning_on_request() -> None:
    job, plan, placement, env = gpu_job()
    body = render_volcano_job(job, plan, placement, env, attempt=0, options=KubernetesOptions(pin_to="rack"))
    (task,) = body["spec"]["tasks"]
    affinity = task["template"]["spec"]["affinity"]
    # the placer's racks required, its nodes preferred (one list each)
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "topology.kubernetes.io/rack", "operator": "In",
                                            "values": placement.racks}]}]
    (preferred,) = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": placement.node_names}]
    # one pod per node still: a rack alone would let two of the job's pods share a node
    assert affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == \
        "kubernetes.io/hostname"
    validate_volcano(body, JOBS_CRD)


def test_the_source_is_fetched_at_the_pinned_commit() -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    job, plan, placement, env = gpu_job(source={"entrypoint": "pretrain.py", "git": {
        "repo": "https://example.com/acme/train.git", "branch": "main", "commit": commit}})
    body = render_volcano_job(job, plan, placement, env, attempt=0)
    validate_volcano(body, JOBS_CRD)
    pod = pod_of(body["spec"]["tasks"][0])
    validate_k8s(pod)
    (init,) = pod["spec"]["initContainers"]
    script = init["command"][2]
    assert "git remote add origin https://example.com/acme/train.git" in script
    assert f"git fetch -q --depth 1 origin {commit}" in script and "case \"$head\" in " + commit in script
    assert init["securityContext"]["runAsNonRoot"] is True
    trainer = pod["spec"]["containers"][0]
    assert trainer["workingDir"] == "/workspace/source"
    assert {"name": "source", "mountPath": "/workspace/source", "readOnly": True} in trainer["volumeMounts"]
    unpinned = job.model_copy(update={"spec": job.spec.model_copy(update={"source": job.spec.source.model_copy(
        update={"git": job.spec.source.git.model_copy(update={"commit": None})})})})
    with pytest.raises(ValueError, match=r"spec\.source\.git\.commit is required"):
        render_volcano_job(unpinned, plan, placement, env, attempt=0)


def test_the_agents_liveness_probe_is_livez() -> None:
    container = render_node_agent_daemonset()["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_yaml_is_plain_no_anchors_and_utf8() -> None:
    import yaml

    from trainyard.plugins.launch.manifests import to_yaml

    job, plan, placement, env = gpu_job()
    docs = render_all(job, plan, placement, env, load_teams(), attempt=0, total_gpus=10_000)
    shared = {"a": 1}
    text = to_yaml([*docs, {"x": shared, "y": shared, "label": "TP1·PP1"}])
    assert "&id" not in text and "*id" not in text
    assert "TP1·PP1" in text and "\\x" not in text
    assert list(yaml.safe_load_all(text))[:-1] == docs


def test_two_runs_of_a_job_are_two_volcano_jobs_within_the_name_limit() -> None:
    from trainyard.config.rules import MAX_JOB_NAME
    from trainyard.plugins.launch.gang_pods import gang_pods, gang_tasks
    from trainyard.plugins.launch.manifests import DNS_LABEL, MAX_VOLCANO_NAME

    first, second = volcano_job_name("gpt-200b", "20261201t031500-aaaaaa"), volcano_job_name("gpt-200b", "20261201t031501-bbbbbb")
    assert first != second and first.startswith("gpt-200b-") and second.startswith("gpt-200b-")
    assert volcano_job_name("gpt-200b", "20261201t031500-aaaaaa") == first  # every attempt of a run: one name
    longest = "a" * (MAX_JOB_NAME - 1) + "b"
    cut = volcano_job_name(longest, "20261201t031500-aaaaaa")
    assert len(cut) == MAX_VOLCANO_NAME and cut.startswith("a" * 40)
    assert volcano_job_name("gpt-200b") == "gpt-200b"  # no run (a manifest rendered for reading)
    assert len(volcano_job_name(longest)) == MAX_VOLCANO_NAME
    # The issue's case: the longest job name on 128 nodes rendered `…-worker-000-0`, 65 characters;
    # at every gang size up to 100,000 nodes (the example fleet has 1,248), a last node with fewer
    # ranks included, every pod's name fits.
    for nodes in (1, 10, 128, 1_248, 12_500, 100_000):
        for slots in ([8] * nodes, [8] * (nodes - 1) + [4]):
            longest = max(gang_pods(cut, gang_tasks(slots)), key=len)
            assert len(longest) <= DNS_LABEL, (nodes, longest)


def test_a_runs_storage_keys_reach_the_pods_only_through_the_attempts_secret() -> None:
    """The Job (what anyone who may read Jobs sees, and what `trainyard render` prints) names the
    Secret; the keys are only in the Secret, which validates as one and is owned by the Job."""
    import json

    from trainyard.config.worker_env import StorageCredentials
    from trainyard.plugins.launch.manifests import (
        SECRET_ENV,
        render_storage_secret,
        storage_secret_name,
    )

    job, plan, placement, env = gpu_job()
    keys = StorageCredentials(access_key_id="ASIARUNKEY", secret_access_key="run-secret", session_token="run-token")
    env = env.model_copy(update={"storage_credentials": keys})
    body = render_volcano_job(job, plan, placement, env, attempt=2)
    validate_volcano(body, JOBS_CRD)
    assert not {"ASIARUNKEY", "run-secret", "run-token"} & set(json.dumps(body).replace('"', " ").split())
    secret_name = storage_secret_name(body["metadata"]["name"], 2)
    for task in body["spec"]["tasks"]:
        validate_k8s(pod_of(task))
        by_name = {e["name"]: e for e in pod_of(task)["spec"]["containers"][0]["env"]}
        for var in SECRET_ENV:
            assert by_name[var] == {"name": var, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": var}}}
        assert by_name["AWS_EC2_METADATA_DISABLED"]["value"] == "true"
    owner = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": body["metadata"]["name"], "uid": "u-1"}
    secret = render_storage_secret(job, env, attempt=2, namespace="team-a", owner=owner)
    assert secret is not None
    validate_k8s(secret)
    assert secret["metadata"]["name"] == secret_name and secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert secret["stringData"] == {"AWS_ACCESS_KEY_ID": "ASIARUNKEY", "AWS_SECRET_ACCESS_KEY": "run-secret",
                                    "AWS_SESSION_TOKEN": "run-token"}
    # a run without keys of its own renders as before: no Secret, no reference
    _, _, _, plain = gpu_job()
    assert render_storage_secret(job, plain, attempt=2, namespace="team-a") is None
    plain_pod = pod_of(render_volcano_job(job, plan, placement, plain, attempt=2)["spec"]["tasks"][0])
    assert not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"] for e in plain_pod["spec"]["containers"][0]["env"])


def test_a_job_goes_to_its_teams_namespace_as_its_data_account_unless_told_otherwise() -> None:
    job, plan, placement, env = gpu_job()
    default = render_volcano_job(job, plan, placement, env, attempt=0)
    assert default["metadata"]["namespace"] == "team-foundation"
    assert default["spec"]["tasks"][0]["template"]["spec"]["serviceAccountName"] == "trainyard-data"
    told = render_volcano_job(job, plan, placement, env, attempt=0, options=KubernetesOptions(namespace="ml"))
    assert told["metadata"]["namespace"] == "ml"
    assert "serviceAccountName" not in told["spec"]["tasks"][0]["template"]["spec"]  # no data account there


def test_the_jobs_network_policy_lets_its_init_container_fetch_the_source() -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    job, plan, placement, env = gpu_job(source={"entrypoint": "pretrain.py", "git": {
        "repo": "git@git.example.com:acme/train.git", "commit": commit}})
    docs = render_all(job, plan, placement, env, load_teams(), attempt=0, total_gpus=10_000,
                      endpoints=["http://10.0.0.9:9000"])
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "team-foundation"
    assert policy["spec"]["egress"][2:] == [
        {"to": [{"ipBlock": {"cidr": "10.0.0.9/32"}}], "ports": [{"protocol": "TCP", "port": 9000}]},
        {"ports": [{"protocol": "TCP", "port": 22}]}]


def test_the_pods_reach_the_store_and_the_tracker_by_their_own_addresses_and_cache_data_in_a_volume() -> None:
    """The control plane's view (settings) and the pods' (an in-cluster Service) differ: the pods
    get theirs, and a shard cache they may write as uid 1000 (not the image's home)."""
    job, plan, placement, env = gpu_job()
    options = KubernetesOptions(pod_s3_endpoint_url="http://minio.storage.svc:9000",
                                pod_mlflow_tracking_uri="http://mlflow.ml.svc:5000", data_cache_dir="/cache",
                                data_cache_bytes=10 << 30)
    pod = render_volcano_job(job, plan, placement, env.model_copy(update={"mlflow_tracking_uri": "http://127.0.0.1:5000"}),
                             attempt=0, options=options)["spec"]["tasks"][0]["template"]["spec"]
    validate_k8s({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod})
    (container,) = pod["containers"]
    values = {e["name"]: e.get("value") for e in container["env"]}
    assert values["TRAINYARD_S3_ENDPOINT_URL"] == "http://minio.storage.svc:9000"
    assert values["MLFLOW_TRACKING_URI"] == "http://mlflow.ml.svc:5000"
    assert values["TRAINYARD_DATA_CACHE_DIR"] == "/cache"
    # the cache's own bound, and its volume limited a tenth above it: a cache past its bound has
    # its pod evicted by the kubelet, not the node's disk filled
    assert values["TRAINYARD_DATA_CACHE_BYTES"] == str(10 << 30)
    assert {"name": "data-cache", "mountPath": "/cache"} in container["volumeMounts"]
    assert {"name": "data-cache", "emptyDir": {"sizeLimit": str(11 << 30)}} in pod["volumes"]
    # without them the pods use the control plane's tracker and no endpoint of their own
    plain = render_volcano_job(job, plan, placement, env, attempt=0)["spec"]["tasks"][0]["template"]["spec"]
    values = {e["name"]: e.get("value") for e in plain["containers"][0]["env"]}
    assert "TRAINYARD_S3_ENDPOINT_URL" not in values and values["MLFLOW_TRACKING_URI"] == env.mlflow_tracking_uri
    assert values["TRAINYARD_DATA_CACHE_BYTES"] == str(8 << 30)  # the settings' default bound
