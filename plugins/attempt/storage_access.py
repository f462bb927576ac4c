"""What one run's ranks may touch in the object store, and the credentials that say so.

The rule (the policy; `trainyard.plugins.storage.credentials` is the mechanism): read the
dataset's prefix (`spec.dataset.source`, resolved by `open_dataset`, the one place that does),
read the folder of the checkpoint the attempt resumes from — only after `resume_point` has
refused a point outside the job's own area (`check_resume_point`: a crafted `resume_from` or
`start_from` naming another job's checkpoint fails there, before anything is issued or
launched) — and the spec's read-only `checkpoint.initFrom`; read, write and delete the run's own
checkpoint prefix (`checkpoint_root`). Nothing else: not the job's other runs, not the store's
other jobs. Issued by `launch` for each attempt, revoked by `close` when the run ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainyard.plugins.storage.credentials import Grant, Issuer, is_s3, role_name, session_name

if TYPE_CHECKING:
    from trainyard.config.settings import Settings
    from trainyard.config.spec import TrainingJob
    from trainyard.config.worker_env import StorageCredentials

EXPIRY_MARGIN_S = 600.0
"""Added to `training.maxRuntime` for the keys' lifetime: the emergency checkpoint after the
deadline's SIGTERM still writes."""


def scoped(settings: Settings) -> bool:
    """Whether this deployment gives its runs credentials of their own: an S3 store, unless
    `TRAINYARD_STORAGE_CREDENTIALS=shared`."""
    return settings.storage_credentials == "per-run" and is_s3(settings.object_store)


def grants_for(job: TrainingJob, settings: Settings, *, run: str, resume_from: str = "") -> list[Grant]:
    """The run's grants on S3 (a `file://` dataset or checkpoint folder needs none). A
    `resume_from` outside the job's area is `InvalidConf` here too (`check_resume_point`, which
    `resume_point` applied already), so no caller can grant one by forgetting that check."""
    from trainyard.plugins.attempt.conf import check_resume_point
    from trainyard.plugins.checkpoint.uris import split_manifest_uri
    from trainyard.plugins.data.shards import open_dataset
    from trainyard.plugins.launch.environment import checkpoint_uri

    grants: list[Grant] = []
    own = checkpoint_uri(job, settings.object_store, run)
    if is_s3(own):
        grants.append(Grant.of(own, write=True))
    dataset = open_dataset(job.spec.dataset.source, object_store=settings.object_store,
                           endpoint_url=settings.s3_endpoint_url).uri
    if is_s3(dataset):
        grants.append(Grant.of(dataset))
    for point in {check_resume_point(resume_from, job, settings.object_store), job.spec.checkpoint.init_from or ""} - {""}:
        if point.startswith("s3://"):
            root, folder, _ = split_manifest_uri(point)
            grants.append(Grant.of(f"{root}/{folder}"))
    return grants


def issue_for_attempt(job: TrainingJob, settings: Settings, *, run: str, attempt: int,
                      resume_from: str = "") -> StorageCredentials | None:
    """The attempt's credentials, or None where the ranks keep the deployment's (`scoped`)."""
    if not scoped(settings):
        return None
    from botocore.exceptions import BotoCoreError, ClientError

    from trainyard.config.worker_env import StorageCredentials

    limit = job.spec.training.max_runtime
    grants = grants_for(job, settings, run=run, resume_from=resume_from)
    try:
        keys = Issuer(settings.s3_endpoint_url).issue(
            role_name(settings.object_store, job.name, run), grants,
            expected_s=limit.total_seconds() + EXPIRY_MARGIN_S if limit else None,
            session=session_name(job.name, run, f"a{attempt}"),
            tags={"trainyard.io/job": job.name, "trainyard.io/run": run, "trainyard.io/team": job.metadata.team})
    except (ClientError, BotoCoreError) as e:
        raise issuing_failed(e) from e
    return StorageCredentials(access_key_id=keys["AccessKeyId"], secret_access_key=keys["SecretAccessKey"],
                              session_token=keys["SessionToken"], expiration=keys.get("Expiration"),
                              role_arn=keys["RoleArn"])


TRANSIENT_CODES = frozenset({"Throttling", "ThrottlingException", "RequestLimitExceeded", "ServiceUnavailable",
                             "InternalFailure", "InternalError", "RequestTimeout", "SlowDown"})
"""What IAM and STS answer when asking again later may succeed."""

NEEDED = ("iam:CreateRole, iam:GetRole, iam:PutRolePolicy, iam:DeleteRolePolicy, iam:DeleteRole, "
          "sts:AssumeRole and sts:GetCallerIdentity")


def issuing_failed(error: Exception) -> Exception:
    """What a launch says when the store would not issue the run's keys: a `TransientError` to
    retry (throttled, unreachable, a server error), else a `FatalError` that names the
    permissions the deployment's own credentials need and the way back to shared keys — the
    default became per-run keys, so a deployment that worked before meets this first."""
    from botocore.exceptions import ClientError

    from trainyard.plugins.errors import FatalError, TransientError

    code = error.response.get("Error", {}).get("Code", "") if isinstance(error, ClientError) else ""
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) if isinstance(error, ClientError) else 0
    if not isinstance(error, ClientError) or code in TRANSIENT_CODES or status >= 500:
        return TransientError(f"could not issue this run's storage credentials (IAM/STS): {error}")
    return FatalError(
        f"the object store would not issue this run's storage credentials: {error}. Each run's ranks get "
        f"keys of their own on S3 (TRAINYARD_STORAGE_CREDENTIALS=per-run, the default): the deployment's "
        f"credentials need {NEEDED}; or set TRAINYARD_STORAGE_CREDENTIALS=shared to give the ranks the "
        "deployment's keys (a store without IAM and STS, e.g. MinIO)")


def revoke_for_run(job: TrainingJob, settings: Settings, *, run: str) -> bool:
    """Delete the run's role when the run ends; False when it had none."""
    if not scoped(settings):
        return False
    return Issuer(settings.s3_endpoint_url).revoke(role_name(settings.object_store, job.name, run))
