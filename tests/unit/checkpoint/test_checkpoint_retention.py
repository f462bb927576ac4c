"""Retention: the kept set satisfies every rule, and nothing is kept that no rule wants."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.checkpoint.fabricate import make_checkpoint
from trainyard.plugins.checkpoint.catalog import list_checkpoints, scan
from trainyard.plugins.checkpoint.manifest import step_dir
from trainyard.plugins.checkpoint.retention import RetentionPolicy, apply_retention, plan_retention
from trainyard.plugins.storage.store import LocalStore, ObjectStore

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Ckpt:
    step: int
    created_at: datetime
    metrics: dict[str, float] = field(default_factory=dict)


metric_values = st.one_of(st.none(), st.just(math.nan),
                          st.floats(min_value=0, max_value=10, allow_nan=False))


@st.composite
def checkpoint_sets(draw: st.DrawFn) -> list[Ckpt]:
    steps = draw(st.lists(st.integers(0, 5000), min_size=0, max_size=25, unique=True))
    out = []
    for step in steps:
        age = draw(st.integers(0, 10_000))
        value = draw(metric_values)
        out.append(Ckpt(step, NOW - timedelta(minutes=age),
                        {} if value is None else {"eval_loss": value}))
    return out


policies = st.builds(
    RetentionPolicy,
    keep_last=st.integers(0, 6),
    best_metric=st.sampled_from([None, "eval_loss"]),
    keep_best=st.integers(0, 4),
    keep_every_steps=st.one_of(st.none(), st.integers(1, 1000)),
    min_age=st.integers(0, 3000).map(lambda m: timedelta(minutes=m)),
)


def _rank_by_metric(c: Ckpt, all_: list[Ckpt], metric: str) -> int | None:
    """How many checkpoints beat `c` (lower metric; newer on a tie). None: not ranked."""
    value = c.metrics.get(metric)
    if value is None or math.isnan(value):
        return None
    return sum(1 for d in all_ if (v := d.metrics.get(metric)) is not None and not math.isnan(v)
               and (v, -d.step) < (value, -c.step))


def _rules_keeping(c: Ckpt, all_: list[Ckpt], policy: RetentionPolicy,
                   protected: set[int]) -> list[str]:
    """The rules, restated independently of the implementation."""
    rules = []
    if c.step == max(d.step for d in all_):
        rules.append("newest")
    if c.step in protected:
        rules.append("protected")
    if sum(1 for d in all_ if d.step > c.step) < policy.keep_last:
        rules.append("last-n")
    if policy.best_metric and policy.keep_best:
        rank = _rank_by_metric(c, all_, policy.best_metric)
        if rank is not None and rank < policy.keep_best:
            rules.append("best-k")
    if policy.keep_every_steps and c.step % policy.keep_every_steps == 0:
        rules.append("every-m")
    if NOW - c.created_at < policy.min_age:
        rules.append("min-age")
    return rules


@settings(max_examples=300, deadline=None)
@given(checkpoints=checkpoint_sets(), policy=policies, data=st.data())
def test_kept_set_satisfies_every_rule_and_only_the_rules(
        checkpoints: list[Ckpt], policy: RetentionPolicy, data: st.DataObject) -> None:
    steps = [c.step for c in checkpoints]
    protected = set(data.draw(st.lists(st.sampled_from(steps), max_size=3))) if steps else set()
    decisions = plan_retention(policy, checkpoints, NOW, protected)
    assert [d.step for d in decisions] == sorted(steps)
    for d in decisions:
        c = next(c for c in checkpoints if c.step == d.step)
        rules = _rules_keeping(c, checkpoints, policy, protected)
        assert d.keep == bool(rules), (d, rules)
        assert d.reasons  # every decision explains itself
    kept = {d.step for d in decisions if d.keep}
    if checkpoints:
        assert max(steps) in kept
    assert protected <= kept
    assert set(sorted(steps)[max(0, len(steps) - policy.keep_last):] if policy.keep_last else []) <= kept


@given(checkpoints=checkpoint_sets(), policy=policies)
def test_planning_is_deterministic_and_order_independent(checkpoints: list[Ckpt],
                                                         policy: RetentionPolicy) -> None:
    a = plan_retention(policy, checkpoints, NOW)
    b = plan_retention(policy, list(reversed(checkpoints)), NOW)
    assert a == b


def test_reasons_name_the_rules() -> None:
    ckpts = [Ckpt(s, NOW - timedelta(hours=10 - s), {"eval_loss": float(abs(s - 4))})
             for s in range(1, 10)]
    policy = RetentionPolicy(keep_last=2, best_metric="eval_loss", keep_best=1,
                             keep_every_steps=3, min_age=timedelta(hours=1, minutes=30))
    by_step = {d.step: d for d in plan_retention(policy, ckpts, NOW, {1: "being restored"})}
    assert by_step[9].reasons == ("newest checkpoint (never deleted)", "among the last 2",
                                  "milestone (step is a multiple of 3)",
                                  "younger than the minimum age (60m < 90m)")
    assert by_step[4].reasons == ("among the best 1 by eval_loss (0)",)
    assert by_step[1].reasons == ("being restored",)
    assert by_step[6].reasons == ("milestone (step is a multiple of 3)",)
    assert not by_step[5].keep
    assert by_step[5].reasons[0].startswith("no rule keeps it: not among the last 2, not among "
                                            "the best 1 by eval_loss (1)")
    with pytest.raises(ValueError, match="unique"):
        plan_retention(policy, [ckpts[0], ckpts[0]], NOW)


def test_policy_from_spec() -> None:
    from trainyard.config.spec import Checkpoint

    spec = Checkpoint(max_keep=3, keep_best_metric="eval_loss", keep_best_count=2,
                      keep_every_m_steps=1000, min_age_minutes=30)
    policy = RetentionPolicy.from_spec(spec)
    assert policy == RetentionPolicy(keep_last=3, best_metric="eval_loss", keep_best=2,
                                     keep_every_steps=1000, min_age=timedelta(minutes=30))
    assert RetentionPolicy.from_spec(Checkpoint(keep_best_count=2)).keep_best == 0


def test_apply_retention_deletes_manifest_first_and_protects_newest_valid(
        store: ObjectStore) -> None:
    old = NOW - timedelta(days=1)
    for step in (100, 200, 300, 400):
        make_checkpoint(store, step, created_at=old)
    # the newest is corrupt: the newest *valid* one (300) must survive keep_last=1
    data = bytearray(store.get_bytes(f"{step_dir(400)}/__0_0.distcp"))
    data[0] ^= 1
    store.put_bytes(f"{step_dir(400)}/__0_0.distcp", bytes(data))
    policy = RetentionPolicy(keep_last=1)

    dry = apply_retention(store, policy, now=NOW, dry_run=True, protected={100: "being restored"})
    assert dry.newest_valid == 300
    assert [(d.step, d.keep) for d in dry.decisions] == [(100, True), (200, False), (300, True),
                                                         (400, True)]
    assert dry.deleted == []
    assert [r.step for r in list_checkpoints(store)] == [100, 200, 300, 400]

    real = apply_retention(store, policy, now=NOW, protected={100: "being restored"})
    assert real.deleted == [200]
    assert [r.step for r in list_checkpoints(store)] == [100, 300, 400]
    assert list(store.list(step_dir(200))) == []


def test_orphans_are_removed_only_after_the_grace_period(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)  # mtimes are set by hand on local files
    make_checkpoint(store, 1)
    make_checkpoint(store, 2, commit=False)  # crashed save
    make_checkpoint(store, 3, commit=False)  # a save still uploading
    stale = time.time() - 7 * 3600
    for info in store.list(step_dir(2)):
        os.utime(store.path_of(info.key), (stale, stale))
    report = apply_retention(store, RetentionPolicy(), orphan_grace=timedelta(hours=6))
    assert report.orphans["step-00000002"].startswith("deleted: no manifest")
    assert report.orphans["step-00000003"].startswith("kept: no manifest yet")
    assert list(scan(store).uncommitted) == ["step-00000003"]
    assert [r.step for r in list_checkpoints(store)] == [1]


def test_a_known_valid_step_is_protected_without_hashing(store: ObjectStore) -> None:
    old = NOW - timedelta(days=1)
    for step in (1, 2, 3):
        make_checkpoint(store, step, created_at=old)
    report = apply_retention(store, RetentionPolicy(keep_last=1), now=NOW, dry_run=True,
                             known_valid=2)
    assert report.newest_valid == 2
    assert [(d.step, d.keep) for d in report.decisions] == [(1, False), (2, True), (3, True)]
