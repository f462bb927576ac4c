"""The policy a run's storage role carries, and the names and lifetimes it is issued with (no
network: what S3 does with them is `tests/integration/storage/test_storage_credentials.py`)."""

from __future__ import annotations

import re

import pytest

from trainyard.plugins.storage.credentials import (
    MAX_SESSION_S,
    MIN_SESSION_S,
    Grant,
    policy_document,
    role_name,
    session_name,
    session_seconds,
)


def test_the_policy_reads_what_is_granted_and_writes_only_where_write_is() -> None:
    own = Grant.of("s3://store/root/jobs/j/runs/r/checkpoints", write=True)
    data = Grant.of("s3://data/web/v2/")
    doc = policy_document([own, data])
    by_sid = {s["Sid"]: s for s in doc["Statement"]}
    assert by_sid["Read"]["Action"] == ["s3:GetObject"]
    assert by_sid["Read"]["Resource"] == ["arn:aws:s3:::data/web/v2/*", "arn:aws:s3:::store/root/jobs/j/runs/r/checkpoints/*"]
    assert by_sid["WriteOwnCheckpoints"]["Resource"] == ["arn:aws:s3:::store/root/jobs/j/runs/r/checkpoints/*"]
    assert "s3:PutObject" in by_sid["WriteOwnCheckpoints"]["Action"]
    lists = [s for s in doc["Statement"] if s["Action"] == ["s3:ListBucket"]]
    assert {s["Resource"][0]: s["Condition"]["StringLike"]["s3:prefix"] for s in lists} == {
        "arn:aws:s3:::data": ["web/v2/*"], "arn:aws:s3:::store": ["root/jobs/j/runs/r/checkpoints/*"]}
    assert all(s["Effect"] == "Allow" for s in doc["Statement"])
    assert not any(r == "*" or r.endswith(":::store/*") for s in doc["Statement"] for r in s["Resource"])
    assert policy_document([data, own]) == doc  # the same document whatever the order


def test_a_folder_grant_never_spills_into_a_sibling_with_the_same_start() -> None:
    """`…/runs/r` must not grant `…/runs/r2`: folders end in '/' before the wildcard."""
    resource = policy_document([Grant.of("s3://store/jobs/j/runs/r", write=True)])["Statement"][0]["Resource"][0]
    assert resource == "arn:aws:s3:::store/jobs/j/runs/r/*"


def test_only_s3_uris_are_granted() -> None:
    with pytest.raises(ValueError, match="not an s3://"):
        Grant.of("file:///srv/objects/jobs/j")


def test_sessions_last_the_runs_expected_length_within_stss_limits() -> None:
    assert session_seconds(60) == MIN_SESSION_S == 900
    assert session_seconds(7_800) == 7_800
    assert session_seconds(48 * 3600) == MAX_SESSION_S == 43_200
    assert session_seconds(None) == MAX_SESSION_S


def test_role_and_session_names_fit_iam() -> None:
    a, b = role_name("s3://store/root", "job-" + "x" * 60, "r-1"), role_name("s3://store/root", "job", "r-2")
    assert a != b and a == role_name("s3://store/root", "job-" + "x" * 60, "r-1")
    assert all(len(n) <= 64 and re.fullmatch(r"[\w+=,.@-]+", n) for n in (a, b))
    name = session_name("my job/with spaces", "run:7", "a1")
    assert len(name) <= 64 and re.fullmatch(r"[\w+=,.@-]{2,64}", name)
