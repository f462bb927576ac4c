"""Checkpoint maintenance across every job and run (DESIGN §4 "maintenance DAGs"): the audit and
the retention sweep the `trainyard_maintenance_*` DAGs run on a schedule.

- `run_roots`       every training run's checkpoint root: the runs found under `<store>/jobs/`
                    plus those of specs that keep checkpoints elsewhere (`checkpoint.storage`);
- `audit`           re-hash a random sample of committed checkpoints across all of them — bit rot,
                    a truncated upload or a hand edit shows up here before a restore needs it;
                    `AuditFailed` names every bad one;
- `sweep`           `apply_retention` per run with its job's spec policy. The newest valid
                    checkpoint is never deleted (retention's own rule); quarantined checkpoints
                    (`QUARANTINED.json`) are not listed as committed, so no rule can touch them;
                    runs still live in the job state are left to their workers, whose rank 0
                    applies the policy at each commit (`trainyard.worker.checkpoint_records`).

No Airflow and no torch here: the DAG's tasks, the CLI and the tests call these.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from trainyard.plugins.checkpoint.catalog import CheckpointRecord, list_runs, scan, verify
from trainyard.plugins.checkpoint.retention import RetentionPolicy, RetentionReport, apply_retention
from trainyard.plugins.checkpoint.uris import checkpoint_root
from trainyard.plugins.errors import FatalError
from trainyard.plugins.storage.store import open_store

log = logging.getLogger(__name__)

DEFAULT_AUDIT_SAMPLE = 20
"""Checkpoints re-hashed per audit: a daily sample of 20 finds a rotten one among a few hundred
within weeks, at the cost of reading 20 checkpoints (not every byte of the store every day)."""


class AuditFailed(FatalError):
    """Sampled checkpoints that do not verify: each one named with what is wrong. Fatal: a retry
    re-reads the same bytes; a person must look (quarantine, re-export, or restore from a peer)."""

    def __init__(self, bad: Sequence[AuditFinding], sampled: int) -> None:
        lines = "\n".join(f"  ✗ {b.manifest_uri}: {b.reason}" for b in bad)
        super().__init__(f"checkpoint audit: {len(bad)} of {sampled} sampled checkpoint(s) fail "
                         f"verification:\n{lines}")
        self.bad = list(bad)


@dataclass(frozen=True)
class RunRoot:
    """One training run's checkpoint root."""

    job: str
    run: str
    uri: str


@dataclass(frozen=True)
class AuditFinding:
    job: str
    run: str
    step: int
    manifest_uri: str
    reason: str
    """'ok', or every problem `verify` found (missing file, size, digest)."""
    hashed_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


@dataclass
class AuditReport:
    population: int
    """Committed (not quarantined) checkpoints found across all runs."""
    findings: list[AuditFinding] = field(default_factory=list)

    @property
    def bad(self) -> list[AuditFinding]:
        return [f for f in self.findings if not f.ok]

    def raise_if_bad(self) -> None:
        if self.bad:
            raise AuditFailed(self.bad, len(self.findings))


@dataclass
class SweepReport:
    runs: dict[str, RetentionReport] = field(default_factory=dict)
    """Root URI → what retention decided and deleted there."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Root URI → why it was not swept (no spec policy, run still live)."""

    @property
    def deleted(self) -> dict[str, list[int]]:
        return {uri: r.deleted for uri, r in self.runs.items() if r.deleted}


def job_names(object_store: str, *, endpoint_url: str | None = None) -> list[str]:
    """Jobs that stored anything under `<store>/jobs/` (sorted)."""
    names: set[str] = set()
    for info in open_store(object_store, endpoint_url=endpoint_url).child("jobs").list():
        head = info.key.split("/", 1)[0]
        if head:
            names.add(head)
    return sorted(names)


def run_roots(object_store: str, *, storage: Mapping[str, str] | None = None,
              endpoint_url: str | None = None) -> list[RunRoot]:
    """Every run's checkpoint root, by job then run. `storage` maps a job to the
    `checkpoint.storage` its spec names (jobs not in it keep theirs under the store)."""
    found = find_run_roots(object_store, storage=storage, endpoint_url=endpoint_url, skip_unreadable=False)
    return found.roots


@dataclass
class RootsFound:
    roots: list[RunRoot] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """Store location → why it was not read: this process has no credentials for it (an
    example spec naming a production bucket, on a stack that has none)."""


def find_run_roots(object_store: str, *, storage: Mapping[str, str] | None = None,
                   endpoint_url: str | None = None, skip_unreadable: bool = True) -> RootsFound:
    """`run_roots`, leaving out (and naming, in `skipped`) each store location this process
    has no credentials for, instead of failing on the first: a maintenance DAG audits what it
    can read and says what it could not. Any other error (a store that does not answer, a
    refused request) propagates: that is a failure to see, not a store that is not ours."""
    storage = dict(storage or {})
    found = RootsFound()
    try:
        names = job_names(object_store, endpoint_url=endpoint_url)
    except Exception as e:
        why = _no_credentials(e)
        if why is None or not skip_unreadable:
            raise
        found.skipped[object_store] = why
        names = []
    for job in sorted({*names, *storage}):
        where = storage.get(job, "")
        location = where or object_store
        if location in found.skipped:
            continue
        try:
            runs = list_runs(object_store, job, storage=where, endpoint_url=endpoint_url)
        except Exception as e:
            why = _no_credentials(e)
            if why is None or not skip_unreadable:
                raise
            found.skipped[location] = f"{why} (job {job})"
            continue
        found.roots += [RunRoot(job, run, checkpoint_root(object_store, job, run, storage=where)) for run in runs]
    return found


def _no_credentials(error: BaseException) -> str | None:
    """Why `error` (or what caused it) means there are no credentials for an S3 store, else None."""
    try:
        from botocore.exceptions import NoCredentialsError, PartialCredentialsError
    except ImportError:  # no S3 client installed: no S3 store was read
        return None
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, NoCredentialsError | PartialCredentialsError):
            return f"no credentials for this store ({seen})"
        seen = seen.__cause__ or seen.__context__
    return None


def audit(roots: Sequence[RunRoot], *, sample: int = DEFAULT_AUDIT_SAMPLE, seed: int | None = None,
          endpoint_url: str | None = None) -> AuditReport:
    """Re-hash `sample` committed checkpoints chosen at random across `roots` (all of them when
    there are fewer). Never raises for a bad checkpoint: `AuditReport.raise_if_bad` does."""
    if sample < 1:
        raise ValueError(f"sample must be ≥ 1, got {sample}")
    population: list[tuple[RunRoot, CheckpointRecord]] = []
    for root in roots:
        population += [(root, record) for record in scan(root.uri, endpoint_url=endpoint_url).committed]
    chosen = random.Random(seed).sample(population, min(sample, len(population)))
    report = AuditReport(population=len(population))
    for root, record in sorted(chosen, key=lambda pair: (pair[0].job, pair[0].run, pair[1].step)):
        checked = verify(root.uri, record, hashes=True, endpoint_url=endpoint_url)
        finding = AuditFinding(root.job, root.run, record.step, record.manifest_uri, checked.reason,
                               checked.hashed_bytes)
        report.findings.append(finding)
        log.log(logging.INFO if finding.ok else logging.ERROR, "audit %s/%s step %d: %s",
                root.job, root.run, record.step, finding.reason)
    return report


def sweep(roots: Sequence[RunRoot], policies: Mapping[str, RetentionPolicy], *,
          live_runs: Mapping[str, set[str]] | None = None, now: datetime | None = None,
          dry_run: bool = False, endpoint_url: str | None = None) -> SweepReport:
    """`apply_retention` on every run whose job has a policy (from its spec) and that is not live.

    A job without a spec is skipped, not swept with some default: deleting checkpoints needs the
    owner's stated policy. `live_runs` maps a job to its runs not yet completed/failed/cancelled.
    """
    live_runs = live_runs or {}
    report = SweepReport()
    for root in roots:
        policy = policies.get(root.job)
        if policy is None:
            report.skipped[root.uri] = f"job {root.job!r} has no spec here: no retention policy to apply"
        elif root.run in live_runs.get(root.job, set()):
            report.skipped[root.uri] = (f"run {root.run} is still live: its workers apply retention "
                                        "at each commit")
        else:
            report.runs[root.uri] = apply_retention(root.uri, policy, now=now, dry_run=dry_run,
                                                    endpoint_url=endpoint_url)
    return report

