"""Per-run object-store credentials: what a run's ranks may read and write, enforced by the
store's own IAM, issued at launch and gone when the run closes (DESIGN §14, issue 56).

**How, on S3: one IAM role per run, assumed with STS at each launch.** The role
(`trainyard-run-<digest of store, job and run>`, path `/trainyard/`, tagged with the job, run
and team) carries one inline policy, `storage` (`policy_document`): `s3:GetObject` on the
dataset's prefix and on the resume point's checkpoint folder, Get/Put/Delete (and multipart
abort) on the run's own checkpoint prefix, `s3:ListBucket` on those prefixes only (an
`s3:prefix` condition) — nothing else. Its trust policy names only the principal that issues it
(the deployment's, `sts:GetCallerIdentity`). Each launch (every attempt) puts the policy again
(a later attempt may resume from another checkpoint) and calls `sts:AssumeRole` with
`DurationSeconds` from the run's expected length (`training.maxRuntime` and a margin), bounded
by STS's limits (900 s to the role's maximum, 12 h). The ranks get the temporary key, secret and
session token as `AWS_*` variables and nothing of the deployment's (`config.worker_env`).
`revoke` deletes the policy and the role when the run closes: on AWS a session's permissions are
evaluated against its role at each request, so the still-unexpired keys stop working then.

**Why a role, not an STS session policy alone.** A session policy (AssumeRole's `Policy`) on
one shared role would need no IAM write per run, but moto — the S3 endpoint the tests run
against, with IAM enforcement on — ignores session policies: it evaluates an assumed role's
own inline and attached policies only (moto 5.2.5, `moto/iam/access_control.py`,
`AssumedRoleAccessKey.collect_policies`). A role per run is what both AWS and moto enforce,
and still gives expiring STS keys rather than an IAM user's long-lived access key.

What this does not do (said again in the README's security section): moto does not evaluate
the `s3:prefix` condition on `ListBucket` (it ignores `StringLike`), nor the keys' expiry, so the
tests prove the object-level rules, not the listing scope or the lifetime; a run longer than 12 h
outlives its keys (its next attempt gets new ones); a deployment whose own credentials are an
assumed role is limited by STS to 1-hour chained sessions; a role left by a run that never
closed stays until someone deletes it (its keys have expired). MinIO has no IAM role API:
`TRAINYARD_STORAGE_CREDENTIALS=shared` keeps the deployment's credentials there.

A `file://` store has no credentials to scope: the ranks run as the launching user, and a job's
prefix is kept by path structure only (`trainyard.plugins.checkpoint.uris`).

The IAM and STS clients use the store's endpoint (`TRAINYARD_S3_ENDPOINT_URL`: moto serves all
three; unset: AWS's own). boto3 is imported only when credentials are issued.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

ROLE_PATH = "/trainyard/"
POLICY_NAME = "storage"
MIN_SESSION_S = 900
"""STS's shortest `DurationSeconds`."""
MAX_SESSION_S = 43_200
"""STS's longest (12 h), the `MaxSessionDuration` each run's role is created with."""
PROPAGATION_S = 30.0
"""How long a first AssumeRole may be refused while a new role propagates through IAM (AWS
documents it as eventually consistent; seconds in practice)."""
_SESSION_NAME = re.compile(r"[^\w+=,.@-]")


@dataclass(frozen=True)
class Grant:
    """One S3 prefix (`bucket`, `prefix` ending in '/', or one object key) and whether the run
    may also write and delete there."""

    bucket: str
    prefix: str
    write: bool = False

    @classmethod
    def of(cls, uri: str, *, write: bool = False, folder: bool = True) -> Grant:
        """The grant for an `s3://bucket/prefix` URI (a folder unless `folder=False`)."""
        parts = urlsplit(uri)
        if parts.scheme.lower() != "s3" or not parts.netloc:
            raise ValueError(f"{uri!r} is not an s3://bucket/prefix URI")
        key = parts.path.strip("/")
        return cls(parts.netloc, f"{key}/" if key and folder else key, write)


def is_s3(uri: str) -> bool:
    return urlsplit(uri).scheme.lower() == "s3"


def policy_document(grants: list[Grant]) -> dict[str, Any]:
    """The IAM policy of `grants`: object reads everywhere granted, writes and deletes where
    `write`, listing of exactly those prefixes. Deterministic (sorted), so a retried launch
    puts the same document."""
    statements: list[dict[str, Any]] = []
    read = sorted({_object_arn(g) for g in grants})
    write = sorted({_object_arn(g) for g in grants if g.write})
    if read:
        statements.append({"Sid": "Read", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": read})
    if write:
        statements.append({"Sid": "WriteOwnCheckpoints", "Effect": "Allow",
                           "Action": ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                                      "s3:ListMultipartUploadParts"], "Resource": write})
    for i, bucket in enumerate(sorted({g.bucket for g in grants})):
        prefixes = sorted({g.prefix + "*" for g in grants if g.bucket == bucket})
        statements.append({"Sid": f"List{i}", "Effect": "Allow", "Action": ["s3:ListBucket"],
                           "Resource": [f"arn:aws:s3:::{bucket}"],
                           "Condition": {"StringLike": {"s3:prefix": prefixes}}})
    return {"Version": "2012-10-17", "Statement": statements}


def _object_arn(grant: Grant) -> str:
    return f"arn:aws:s3:::{grant.bucket}/{grant.prefix}*" if grant.prefix.endswith("/") or not grant.prefix \
        else f"arn:aws:s3:::{grant.bucket}/{grant.prefix}"


def role_name(store: str, job: str, run: str) -> str:
    """The run's role: a digest (IAM names stop at 64 characters; job and run are in its tags)."""
    return "trainyard-run-" + hashlib.sha256(f"{store}\n{job}\n{run}".encode()).hexdigest()[:32]


def session_seconds(expected_s: float | None) -> int:
    """`DurationSeconds` for a run expected to last `expected_s` (None: unknown), within STS's limits."""
    if expected_s is None:
        return MAX_SESSION_S
    return int(min(MAX_SESSION_S, max(MIN_SESSION_S, expected_s)))


def session_name(*parts: str) -> str:
    """An STS session name (what CloudTrail shows): `[\\w+=,.@-]`, 2 to 64 characters."""
    return _SESSION_NAME.sub("-", "-".join(parts))[:64].ljust(2, "-")


@dataclass(frozen=True)
class Issuer:
    """Issues and revokes run roles with the deployment's own credentials (the environment's)."""

    endpoint_url: str | None = None
    region: str = "us-east-1"

    def _client(self, service: str) -> Any:
        import boto3

        return boto3.session.Session().client(service, endpoint_url=self.endpoint_url, region_name=self.region)

    def issue(self, name: str, grants: list[Grant], *, expected_s: float | None, session: str,
              tags: dict[str, str] | None = None) -> dict[str, Any]:
        """Create (or find) the role `name`, put its policy for `grants`, assume it for the run's
        expected length (`session_seconds`). Returns STS's `Credentials` (`AccessKeyId`,
        `SecretAccessKey`, `SessionToken`, `Expiration`) with the role's `RoleArn`; the caller
        wraps them (`trainyard.config.worker_env.StorageCredentials`: this floor imports no config)."""
        from botocore.exceptions import ClientError

        iam, sts = self._client("iam"), self._client("sts")
        caller = sts.get_caller_identity()["Arn"]
        trust = {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": caller}, "Action": "sts:AssumeRole"}]}
        try:
            role = iam.create_role(RoleName=name, Path=ROLE_PATH, AssumeRolePolicyDocument=json.dumps(trust),
                                   MaxSessionDuration=MAX_SESSION_S, Description="Trainyard: one run's storage access",
                                   Tags=[{"Key": k, "Value": v} for k, v in sorted((tags or {}).items())])["Role"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "EntityAlreadyExists":
                raise
            role = iam.get_role(RoleName=name)["Role"]
        iam.put_role_policy(RoleName=name, PolicyName=POLICY_NAME, PolicyDocument=json.dumps(policy_document(grants)))
        answer = _propagation_retry()(sts.assume_role, RoleArn=role["Arn"], RoleSessionName=session,
                                      DurationSeconds=session_seconds(expected_s))
        return {**answer["Credentials"], "RoleArn": role["Arn"]}

    def revoke(self, name: str) -> bool:
        """Delete the role's policy and the role (its sessions lose every permission); False when
        there was none (a `file://` run, a second close)."""
        from botocore.exceptions import ClientError

        iam = self._client("iam")
        try:
            iam.delete_role_policy(RoleName=name, PolicyName=POLICY_NAME)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchEntity":
                raise
        try:
            iam.delete_role(RoleName=name)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchEntity":
                raise
            return False
        return True


def _propagation_retry() -> Any:
    """AssumeRole right after CreateRole may be refused (AccessDenied) until IAM propagates it."""
    from botocore.exceptions import ClientError

    from trainyard.plugins.retry import policy

    def refused(error: BaseException) -> bool:
        return isinstance(error, ClientError) and error.response.get("Error", {}).get("Code") == "AccessDenied"

    return policy(refused, deadline_s=PROPAGATION_S, first_wait_s=1.0, max_wait_s=5.0)
