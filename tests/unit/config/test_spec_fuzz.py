"""Property: whatever a valid spec is mutated into, validation answers with problems — it
never raises anything else (no KeyError, TypeError, RecursionError from a rule)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.config.cluster import load_cluster
from trainyard.config.loader import parse_spec_text, validate_document
from trainyard.config.problems import Problem
from trainyard.config.rules import check_against_cluster, check_spec

CONFIG = Path(__file__).resolve().parents[3] / "config"
SPECS = [yaml.safe_load(p.read_text())
         for p in sorted([*(CONFIG / "jobs").glob("*.yaml"), *(CONFIG / "examples").glob("*.yaml")])]
CLUSTERS = [load_cluster("local"), load_cluster("h100-fleet")]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["80GB", "48h", "7e9", "auto", "manual", "-1", "0", "1e400"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _parent(doc: Any, path: tuple) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(st.sampled_from(SPECS)))
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(doc, path), path[-1]
        action = draw(st.sampled_from(["drop", "retype", "rename", "add"]))
        if action == "drop":
            del parent[key]
        elif action == "retype":
            parent[key] = draw(values)
        elif action == "rename" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=12))] = parent.pop(key)
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=12))] = draw(values)
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_mutated_specs_give_problems_never_exceptions(doc: dict[str, Any]) -> None:
    job, problems = validate_document(doc)
    assert all(isinstance(p, Problem) for p in problems)
    if job is None:
        assert problems, "an invalid document must say why"
        assert all(p.path and p.message for p in problems)
        return
    for cluster in CLUSTERS:
        assert all(isinstance(p, Problem) for p in check_spec(job) + check_against_cluster(job, cluster))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200)))
def test_arbitrary_text_gives_problems_never_exceptions(raw: bytes | str) -> None:
    job, problems = parse_spec_text(raw)
    assert job is None and problems


degrees = st.one_of(st.none(), st.integers(1, 64))


@settings(max_examples=300, deadline=None)
@given(tp=degrees, pp=degrees, dp=degrees, cp=degrees, vpp=degrees, gpus=st.integers(1, 512),
       layers=st.integers(1, 128), heads=st.integers(1, 128), kv=st.one_of(st.none(), st.integers(1, 128)))
def test_random_manual_degrees(tp: int | None, pp: int | None, dp: int | None, cp: int | None,
                               vpp: int | None, gpus: int, layers: int, heads: int, kv: int | None) -> None:
    doc = copy.deepcopy(SPECS[0])
    par = doc["spec"]["parallelism"]
    par.update({"strategy": "manual", "tensorParallel": tp, "pipelineParallel": pp, "dataParallel": dp,
                "contextParallel": cp, "virtualPipelineStages": vpp})
    par["hints"].update({"numLayers": layers, "numAttentionHeads": heads, "numKeyValueHeads": kv,
                         "hiddenSize": heads * 16})
    doc["spec"]["hardware"]["gpuCount"] = gpus
    job, problems = validate_document(doc)
    assert job is not None, problems
    codes = {p.code for p in check_spec(job)}
    for cluster in CLUSTERS:
        check_against_cluster(job, cluster)
    product = (tp or 1) * (pp or 1) * (cp or 1) * (dp if dp is not None else max(gpus // ((tp or 1) * (pp or 1) * (cp or 1)), 1))
    assert ("PARALLELISM_MISMATCH" in codes) == (product != gpus)
    assert ("PP_LAYER_MISMATCH" in codes) == (layers % ((pp or 1) * (vpp or 1)) != 0)
