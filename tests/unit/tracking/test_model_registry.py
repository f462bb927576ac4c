"""Registry against a real SQLite-backed MLflow store: logged model, version, alias, lineage query."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.unit.tracking.factories import (
    SHA,
    export_marking_the_step,
    make_job,
    make_plan,
    trained_run,
)
from tests.unit.tracking.factories import registry_dataset as dataset
from trainyard.plugins.data.datasets import DatasetRef
from trainyard.plugins.tracking import registry, runs


def test_best_checkpoint_becomes_a_candidate_version_with_lineage(
    sqlite_tracking_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    from mlflow import MlflowClient

    uri = sqlite_tracking_uri
    # mlflow's loaders resolve `models:/` through the process-wide URIs.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)
    rid = trained_run(uri, "reg-best", dataset("v3"), {100: 3.1, 200: 2.4, 300: 2.7})
    info = registry.register_checkpoint(rid, tracking_uri=uri, metric="loss", export=export_marking_the_step)

    assert (info.name, info.version, info.aliases) == ("reg-best", "1", ["candidate"])
    assert (info.run_id, info.job, info.checkpoint_step) == (rid, "reg-best", 200)
    assert info.checkpoint_uri == "file:///ckpt/reg-best/step-00000200/MANIFEST.json"
    assert info.checkpoint_sha256 == SHA
    assert (info.dataset_uri, info.dataset_version, info.dataset_digest) == ("s3://datasets/wiki", "v3", "d" * 64)
    assert info.weights_sha256 is not None and len(info.weights_sha256) == 64

    client = MlflowClient(uri, registry_uri=uri)
    model = client.get_logged_model(info.model_id)
    assert model.source_run_id == rid and str(model.status) in {"READY", "LoggedModelStatus.READY"}
    # the run's outputs: its three checkpoints (LoggedModels of type checkpoint) and the export
    outputs = {o.model_id: o.step for o in client.get_run(rid).outputs.model_outputs}
    kinds = {m: client.get_logged_model(m).model_type for m in outputs}
    assert sorted(s for m, s in outputs.items() if kinds[m] == "checkpoint") == [100, 200, 300]
    assert kinds[info.model_id] != "checkpoint" and outputs[info.model_id] == 200
    # Registered from the logged model (what links the version to it in the UI), not a path.
    version = client.get_model_version("reg-best", "1")
    assert version.source == f"models:/{info.model_id}"
    assert registry.model_id_of(version.source) == info.model_id

    # The registered model loads through the alias; its files hold no pickle.
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri="models:/reg-best@candidate",
                                                     dst_path=str(tmp_path / "dl")))
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert "MLmodel" in files and "safetensors_pyfunc.py" in files
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".pt", ".pth"))], files
    (weights,) = [local / f for f in files if f.endswith(".safetensors")]
    assert load_file(str(weights))["layer.weight"][0, 0] == 200  # the best checkpoint, not the last
    loaded = mlflow.pyfunc.load_model("models:/reg-best@candidate")
    assert loaded.predict(["layer.weight"]) == ["layer.weight\tF32\t[4, 8]"]


def test_the_alias_moves_to_the_newest_registration(sqlite_tracking_uri: str) -> None:
    uri = sqlite_tracking_uri
    rid = trained_run(uri, "reg-alias", dataset("v3"), {10: 1.0, 20: 0.5})
    first = registry.register_checkpoint(rid, tracking_uri=uri, export=export_marking_the_step)
    second = registry.register_checkpoint(rid, tracking_uri=uri, metric="loss", export=export_marking_the_step)
    assert first.checkpoint_step == 20 == second.checkpoint_step  # final == best here
    versions = {v.version: v.aliases for v in registry.models_trained_on("s3://datasets/wiki", tracking_uri=uri)
                if v.name == "reg-alias"}
    assert versions == {"1": [], "2": ["candidate"]}


def test_which_models_were_trained_on_dataset_v3(sqlite_tracking_uri: str) -> None:
    uri = sqlite_tracking_uri
    on_v3 = trained_run(uri, "reg-q-a", dataset("v3", "a" * 64), {5: 1.0})
    on_v4 = trained_run(uri, "reg-q-b", dataset("v4", "b" * 64), {5: 1.0})
    elsewhere = runs.start_or_resume_run(make_job("reg-q-c"), make_plan(), tracking_uri=uri, attempt=0,
                                         dataset=DatasetRef(uri="s3://datasets/other", version="v3", digest="c" * 64,
                                                            digest_method="content", num_shards=1, total_bytes=1))
    runs.log_checkpoint(elsewhere, "file:///c/step-00000005/MANIFEST.json", SHA, 5, tracking_uri=uri)
    for rid in (on_v3, on_v4, elsewhere):
        registry.register_checkpoint(rid, tracking_uri=uri, export=export_marking_the_step)

    v3 = registry.models_trained_on("s3://datasets/wiki", "v3", tracking_uri=uri)
    assert {(m.name, m.run_id) for m in v3 if m.name.startswith("reg-q")} == {("reg-q-a", on_v3)}
    every = registry.models_trained_on("s3://datasets/wiki/", tracking_uri=uri)  # trailing slash ignored
    assert {m.name for m in every if m.name.startswith("reg-q")} == {"reg-q-a", "reg-q-b"}
    by_digest = registry.models_trained_on("s3://datasets/wiki", tracking_uri=uri, digest="b" * 64)
    assert [m.name for m in by_digest] == ["reg-q-b"]
    assert registry.models_trained_on("s3://datasets/wiki", "v9", tracking_uri=uri) == []
    known = registry.trained_datasets(tracking_uri=uri)
    assert {"v3", "v4"} <= set(known["s3://datasets/wiki"]) and known["s3://datasets/other"] == ["v3"]


def test_final_and_best_checkpoint_selection(sqlite_tracking_uri: str) -> None:
    uri = sqlite_tracking_uri
    rid = trained_run(uri, "reg-select", dataset("v1"), {1: 3.0, 2: 1.0, 3: 1.0, 4: 2.0})
    assert registry.select_checkpoint(rid, tracking_uri=uri).step == 4
    assert registry.select_checkpoint(rid, tracking_uri=uri, metric="loss").step == 3  # tie → later
    assert registry.select_checkpoint(rid, tracking_uri=uri, metric="loss", mode="max").step == 1
    with pytest.raises(LookupError, match="eval_loss"):
        registry.select_checkpoint(rid, tracking_uri=uri, metric="eval_loss")
    empty = runs.start_or_resume_run(make_job("reg-none"), make_plan(), tracking_uri=uri, attempt=0)
    with pytest.raises(LookupError, match="no checkpoint"):
        registry.select_checkpoint(empty, tracking_uri=uri)


def test_a_pickle_named_safetensors_is_refused(sqlite_tracking_uri: str, tmp_path: Path) -> None:
    import pickle

    fake = tmp_path / "model.safetensors"  # a pickle under a safetensors name (written, never loaded)
    fake.write_bytes(pickle.dumps({"w": [1.0, 1.0]}))
    ckpt = runs.LoggedCheckpoint(step=1, manifest_uri="file:///x/MANIFEST.json", sha256=SHA)
    with pytest.raises(ValueError, match="not a safetensors file"):
        registry.register_safetensors(fake, run_id="r", checkpoint=ckpt, tracking_uri=sqlite_tracking_uri)
    with pytest.raises(ValueError, match=r"existing \.safetensors file"):
        registry.register_safetensors(tmp_path / "missing.safetensors", run_id="r", checkpoint=ckpt,
                                      tracking_uri=sqlite_tracking_uri)


def test_the_default_export_is_the_checkpoint_engines() -> None:
    from trainyard.plugins.checkpoint.export import export_safetensors

    assert registry.find_export() is export_safetensors


def test_an_export_whose_manifest_hash_differs_from_the_recorded_one_is_refused(sqlite_tracking_uri: str) -> None:
    rid = trained_run(sqlite_tracking_uri, "reg-tampered", dataset("v1"), {7: 1.0})

    def export_of_a_changed_checkpoint(manifest_uri: str, dest: Path) -> None:
        save_file({"w": np.ones(2, np.float32)}, str(dest), metadata={"trainyard.manifest_sha256": "0" * 64})

    with pytest.raises(ValueError, match="refusing to register it"):
        registry.register_checkpoint(rid, tracking_uri=sqlite_tracking_uri, export=export_of_a_changed_checkpoint)
    found = registry.models_trained_on("s3://datasets/wiki", "v1", tracking_uri=sqlite_tracking_uri)
    assert "reg-tampered" not in {m.name for m in found}
