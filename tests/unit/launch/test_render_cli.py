"""`trainyard render k8s`: multi-document YAML in apply order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.unit.launch.launch_fixtures import GPU_SPEC, validate_volcano
from trainyard.cli.main import main
from trainyard.config.settings import get_settings
from trainyard.config.teams import load_teams


@pytest.fixture(autouse=True)
def cluster_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings a cluster's pods can use: an S3 store and an MLflow server."""
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINYARD_OBJECT_STORE", "s3://trainyard/objects")
    monkeypatch.setenv("TRAINYARD_MLFLOW_TRACKING_URI", "http://mlflow.ml.svc:5000")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_renders_every_manifest_in_apply_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(GPU_SPEC))
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet", "--namespace", "ml", "--attempt", "3"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs][-3:] == ["DaemonSet", "NetworkPolicy", "Job"]
    job = docs[-1]
    validate_volcano(job, "batch.volcano.sh_jobs.yaml")
    assert job["metadata"]["namespace"] == "ml" and job["metadata"]["labels"]["trainyard.io/attempt"] == "3"
    assert job["spec"]["minAvailable"] == 32


def test_the_job_renders_into_its_teams_namespace_beside_every_teams_objects(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --namespace: the job, its pods' account and its NetworkPolicy in `team-<team>`;
    every team's namespace, quota and account rendered; the control plane bound in each."""
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(GPU_SPEC))
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    job, policy = docs[-1], docs[-2]
    assert job["metadata"]["namespace"] == policy["metadata"]["namespace"] == "team-foundation"
    assert {t["template"]["spec"]["serviceAccountName"] for t in job["spec"]["tasks"]} == {"trainyard-data"}
    teams = load_teams()
    of = {kind: [d for d in docs if d["kind"] == kind] for kind in ("Namespace", "ResourceQuota", "RoleBinding")}
    assert [d["metadata"]["name"] for d in of["Namespace"]] == ["trainyard", *(f"team-{t}" for t in sorted(teams.teams))]
    assert {d["metadata"]["namespace"]: d["spec"]["hard"] for d in of["ResourceQuota"]} == {
        f"team-{name}": {"requests.nvidia.com/gpu": str(team.quota_gpus)} for name, team in teams.teams.items()}
    assert sorted(d["metadata"]["namespace"] for d in of["RoleBinding"]) == sorted(f"team-{t}" for t in teams.teams)
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    assert ds["metadata"]["namespace"] == "trainyard"


def test_job_only_to_a_file_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(GPU_SPEC))
    out = tmp_path / "out.yaml"
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet", "--job-only", "-o", str(out)]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(out.read_text())] == ["Job"]
    no_image = dict(GPU_SPEC, spec={k: v for k, v in GPU_SPEC["spec"].items() if k != "image"})
    spec.write_text(yaml.safe_dump(no_image))
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet"]) == 1
    assert "spec.image is required" in capsys.readouterr().err


def test_settings_that_cannot_work_in_pods_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(GPU_SPEC))
    monkeypatch.delenv("TRAINYARD_OBJECT_STORE")  # the embedded default: a local folder
    monkeypatch.setenv("TRAINYARD_MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    get_settings.cache_clear()
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "error TRAINYARD_OBJECT_STORE='file://" in captured.err and "s3://bucket/prefix" in captured.err
    assert "error MLFLOW_TRACKING_URI='sqlite:" in captured.err and "MLflow server" in captured.err
    # --force renders them (to read), saying the same
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet", "--force", "--job-only"]) == 0
    captured = capsys.readouterr()
    assert "error TRAINYARD_OBJECT_STORE" in captured.err and "kind: Job" in captured.out


def test_an_mlflow_run_id_goes_into_the_pods_and_the_yaml_is_plain(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(GPU_SPEC))
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet", "--job-only"]) == 0
    assert "warning MLFLOW_RUN_ID=''" in capsys.readouterr().err  # rendered, but said
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet", "--mlflow-run-id", "abc123"]) == 0
    captured = capsys.readouterr()
    assert "MLFLOW_RUN_ID" not in captured.err
    assert "&id0" not in captured.out and "\\x" not in captured.out
    job = list(yaml.safe_load_all(captured.out))[-1]
    env = {e["name"]: e.get("value") for e in job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"]}
    assert (env["MLFLOW_RUN_ID"], env["MLFLOW_TRACKING_URI"]) == ("abc123", "http://mlflow.ml.svc:5000")


def test_the_example_fleets_whole_gang_is_one_object_well_under_the_api_servers_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: a gang on every healthy node of the example fleet (1,248) rendered as a
    Volcano task per node was 11.3 MB and refused. One task of `replicas` with one list of nodes:
    the longest job name still gives every pod a hostname within a DNS label."""
    import json

    from tests.unit.launch.launch_fixtures import fleet
    from trainyard.config.rules import MAX_JOB_NAME
    from trainyard.plugins.launch.gang_pods import gang_pods
    from trainyard.plugins.launch.kube_status import gang_tasks_of
    from trainyard.plugins.launch.manifests import DNS_LABEL, MAX_OBJECT_BYTES

    healthy = sorted(n.name for n in fleet().nodes if n.healthy and n.gpu_type == "H100")
    doc = yaml.safe_load(yaml.safe_dump(GPU_SPEC))
    doc["metadata"]["name"] = name = ("gpt-" + "x" * MAX_JOB_NAME)[:MAX_JOB_NAME]
    doc["spec"]["hardware"]["gpuCount"] = 8 * len(healthy)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(doc))
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet"]) == 0, capsys.readouterr().err
    job = list(yaml.safe_load_all(capsys.readouterr().out))[-1]
    validate_volcano(job, "batch.volcano.sh_jobs.yaml")
    size = len(json.dumps(job))
    assert size < MAX_OBJECT_BYTES // 10, size  # well under: a tenth of the limit
    assert job["metadata"]["labels"]["trainyard.io/job"] == name and len(name) == MAX_JOB_NAME
    (task,) = job["spec"]["tasks"]
    assert job["spec"]["minAvailable"] == task["replicas"] == len(healthy) == 1_248
    required = task["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert sorted(required["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]) == healthy  # every node, once
    pods = gang_pods(job["metadata"]["name"], gang_tasks_of(job))
    assert len(set(pods)) == 1_248 and max(len(p) for p in pods) <= DNS_LABEL, max(pods, key=len)


def test_render_with_kueue_prints_the_indexed_job_its_service_and_kueues_queues(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(GPU_SPEC))
    out = tmp_path / "out.yaml"
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet", "--queueing", "kueue", "-o", str(out)]) == 0
    docs = list(yaml.safe_load_all(out.read_text()))
    kinds = [(d["apiVersion"], d["kind"]) for d in docs]
    assert ("kueue.x-k8s.io/v1beta2", "ClusterQueue") in kinds and ("scheduling.volcano.sh/v1beta1", "Queue") not in kinds
    assert kinds[-1] == ("batch/v1", "Job") and docs[-1]["spec"]["suspend"] is True
    assert main(["render", "k8s", str(spec), "--cluster", "h100-fleet", "--queueing", "kueue", "--job-only",
                 "-o", str(out)]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(out.read_text())] == ["Job", "Service"]
