"""Checkpoint retention (seed §5, DESIGN §6): which checkpoints to keep, and why.

Rules compose with OR — a checkpoint is deleted only when *no* rule keeps it:

1. the last N by step (`keep_last`),
2. the best K by a metric, lower is better (`best_metric`, `keep_best`),
3. every checkpoint whose step is a multiple of M (`keep_every_steps`, milestones),
4. anything younger than a minimum age (`min_age`),

and, whatever the policy says, never the newest checkpoint, the newest *valid* one, nor one
being restored (`protected`). `plan_retention` only decides; `apply_retention` lists, verifies,
decides and deletes (manifest first). No torch import here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveInt, field_validator

from trainyard.plugins.checkpoint.catalog import (
    CheckpointRecord,
    as_store,
    delete_checkpoint,
    scan,
    verify,
)
from trainyard.plugins.checkpoint.manifest import utc_now
from trainyard.plugins.storage.store import ObjectStore

if TYPE_CHECKING:
    from trainyard.config.spec import Checkpoint as CheckpointSpec

log = logging.getLogger(__name__)


class RetentionPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    keep_last: NonNegativeInt = 5
    best_metric: str | None = None
    """Metric for the best-K rule; lower is better (a loss). Checkpoints without it, or with a
    NaN, never count as best."""
    keep_best: NonNegativeInt = 0
    keep_every_steps: PositiveInt | None = None
    min_age: timedelta = timedelta(0)

    @field_validator("min_age")
    @classmethod
    def _non_negative(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError(f"min_age must be ≥ 0, got {value}")
        return value

    @classmethod
    def from_spec(cls, spec: CheckpointSpec) -> RetentionPolicy:
        """The policy a `TrainingJob`'s `checkpoint:` section asks for."""
        return cls(
            keep_last=spec.max_keep,
            best_metric=spec.keep_best_metric,
            keep_best=spec.keep_best_count if spec.keep_best_metric else 0,
            keep_every_steps=spec.keep_every_m_steps,
            min_age=timedelta(minutes=spec.min_age_minutes),
        )


class RetentionCandidate(Protocol):
    """What the rules look at (a `CheckpointRecord` has all of it)."""

    @property
    def step(self) -> int: ...

    @property
    def created_at(self) -> datetime: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...


@dataclass(frozen=True)
class RetentionDecision:
    step: int
    keep: bool
    reasons: tuple[str, ...]
    """Why it is kept (every rule that keeps it), or why nothing keeps it."""

    @property
    def action(self) -> str:
        return "keep" if self.keep else "delete"


def plan_retention(
    policy: RetentionPolicy,
    checkpoints: Sequence[RetentionCandidate],
    now: datetime,
    protected: Mapping[int, str] | Collection[int] = (),
) -> list[RetentionDecision]:
    """Decide keep/delete for each checkpoint (ordered by step), with reasons.

    `protected` maps steps that must survive to why (e.g. `{1200: "being restored"}`); a plain
    collection of steps works too.
    """
    steps = [c.step for c in checkpoints]
    if len(set(steps)) != len(steps):
        raise ValueError(f"checkpoint steps must be unique, got {sorted(steps)}")
    protect = _reasons(protected)
    ordered = sorted(checkpoints, key=lambda c: c.step)
    newest = ordered[-1].step if ordered else None
    last_n = {c.step for c in ordered[-policy.keep_last:]} if policy.keep_last else set()
    best = _best_steps(policy, ordered)

    decisions: list[RetentionDecision] = []
    for c in ordered:
        keep: list[str] = []
        if c.step == newest:
            keep.append("newest checkpoint (never deleted)")
        if c.step in protect:
            keep.append(protect[c.step])
        if c.step in last_n:
            keep.append(f"among the last {policy.keep_last}")
        if c.step in best:
            keep.append(f"among the best {policy.keep_best} by {policy.best_metric} "
                        f"({c.metrics[policy.best_metric]:g})")
        if policy.keep_every_steps and c.step % policy.keep_every_steps == 0:
            keep.append(f"milestone (step is a multiple of {policy.keep_every_steps})")
        age = now - c.created_at
        if age < policy.min_age:
            keep.append(f"younger than the minimum age ({_fmt(age)} < {_fmt(policy.min_age)})")
        if keep:
            decisions.append(RetentionDecision(c.step, True, tuple(keep)))
        else:
            decisions.append(RetentionDecision(c.step, False, (_why_not(policy, c, age),)))
    return decisions


def _reasons(protected: Mapping[int, str] | Collection[int]) -> dict[int, str]:
    """`protected` as step → why it is kept (a plain collection of steps says "protected")."""
    if isinstance(protected, Mapping):
        return dict(protected)
    return dict.fromkeys(protected, "protected")


def _best_steps(policy: RetentionPolicy, ordered: Sequence[RetentionCandidate]) -> set[int]:
    if not policy.best_metric or not policy.keep_best:
        return set()
    scored = [c for c in ordered if _finite(c.metrics.get(policy.best_metric))]
    # Lower is better; on a tie the newer checkpoint wins (it has seen more data).
    scored.sort(key=lambda c: (c.metrics[policy.best_metric], -c.step))
    return {c.step for c in scored[:policy.keep_best]}


def _finite(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def _why_not(policy: RetentionPolicy, c: RetentionCandidate, age: timedelta) -> str:
    parts = [f"not among the last {policy.keep_last}"]
    if policy.best_metric and policy.keep_best:
        value = c.metrics.get(policy.best_metric)
        shown = "no value" if not _finite(value) else f"{value:g}"
        parts.append(f"not among the best {policy.keep_best} by {policy.best_metric} ({shown})")
    if policy.keep_every_steps:
        parts.append(f"not a multiple of {policy.keep_every_steps}")
    parts.append(f"older than {_fmt(policy.min_age)} ({_fmt(age)})")
    return "no rule keeps it: " + ", ".join(parts)


def _fmt(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


@dataclass
class RetentionReport:
    decisions: list[RetentionDecision]
    deleted: list[int] = field(default_factory=list)
    """Steps whose checkpoints were deleted (empty in a dry run)."""
    orphans: dict[str, str] = field(default_factory=dict)
    """Uncommitted folders (no manifest) → what was (or would be) done and why."""
    newest_valid: int | None = None
    dry_run: bool = False


def apply_retention(
    store_or_uri: ObjectStore | str,
    policy: RetentionPolicy,
    *,
    now: datetime | None = None,
    protected: Mapping[int, str] | Collection[int] = (),
    dry_run: bool = False,
    verify_hashes: bool = True,
    orphan_grace: timedelta | None = timedelta(hours=6),
    endpoint_url: str | None = None,
    known_valid: int | None = None,
) -> RetentionReport:
    """List, find the newest valid checkpoint (verified), decide, and delete.

    Deletion removes each checkpoint's manifest first. Folders without a manifest (a save that
    crashed before its commit) are removed once their newest object is older than
    `orphan_grace` — a save still uploading is younger than that; `None` leaves them alone.
    `known_valid` names a step the caller has just verified (a sensor that verifies each new
    checkpoint): it is protected as the newest valid one without hashing it again.
    """
    store = as_store(store_or_uri, endpoint_url=endpoint_url)
    now = now or utc_now()
    found = scan(store)
    protect = _reasons(protected)
    newest_valid = known_valid if known_valid is not None else \
        _newest_valid(store, found.committed, verify_hashes)
    if newest_valid is not None:
        protect.setdefault(newest_valid, "newest valid checkpoint (never deleted)")
    decisions = plan_retention(policy, found.committed, now, protect)
    report = RetentionReport(decisions, newest_valid=newest_valid, dry_run=dry_run)
    by_step = {r.step: r for r in found.committed}
    for decision in decisions:
        if decision.keep:
            continue
        if not dry_run:
            delete_checkpoint(store, by_step[decision.step].folder)
            report.deleted.append(decision.step)
        log.info("checkpoint step %d %s: %s", decision.step,
                 "would be deleted" if dry_run else "deleted", decision.reasons[0])
    if orphan_grace is not None:
        for folder, objects in found.uncommitted.items():
            newest = max((o.mtime or now.timestamp()) for o in objects)
            age = timedelta(seconds=now.timestamp() - newest)
            if age < orphan_grace:
                report.orphans[folder] = f"kept: no manifest yet, last written {_fmt(age)} ago"
                continue
            report.orphans[folder] = (f"{'would delete' if dry_run else 'deleted'}: no manifest "
                                      f"(save never committed), untouched for {_fmt(age)}")
            if not dry_run:
                for info in objects:
                    store.delete(info.key)
    return report


def _newest_valid(store: ObjectStore, committed: Sequence[CheckpointRecord],
                  verify_hashes: bool) -> int | None:
    for record in reversed(committed):
        report = verify(store, record, hashes=verify_hashes)
        if report.ok:
            return record.step
        log.warning("retention: checkpoint step %d does not verify (%s)", record.step,
                    report.reason)
    return None

