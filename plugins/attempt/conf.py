"""What an attempt is told: its conf, its effective spec, its plan, where it resumes.

The attempt engine's steps (`plugins/attempt/steps.py`) decide these through the functions here:

- `parse_conf`       the attempt's conf: a first trigger opens a new run (its id derived from the
                     Airflow run, so a retried task gets the same one); later attempts carry theirs;
- `effective_job`    the spec with the trigger's overrides (max steps, learning rate);
- `plan_attempt`     the plan: the one a re-plan handed over, else the advisor's / the manual one;
- `resume_point`     the manifest the attempt restores (explicit, a registered model's, or none:
                     the run's newest valid checkpoint, which is a fresh start for a new run);
- `in_place_restarts` torchrun's own restarts the attempt may use (the fast path).
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trainyard.config.runs import check_run_id
from trainyard.plugins.errors import FatalError
from trainyard.plugins.recovery.model import AttemptConf

if TYPE_CHECKING:
    from pathlib import Path

    from trainyard.config.cluster import Cluster
    from trainyard.config.spec import TrainingJob
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.advisor.planner import PlanResult


class InvalidConf(FatalError):
    """A DAG run's conf (or trigger form) that does not parse as an `AttemptConf`."""


class NoPlan(FatalError):
    """Nothing fits: the advisor's suggestions say what to change."""


def run_id_for_trigger(dag_id: str, trigger_run_id: str, when: datetime) -> str:
    """The training run a first trigger opens: its start time plus a digest of the Airflow run,
    so every task (and every retry) of that DAG run derives the same id without a lookup."""
    digest = hashlib.sha256(f"{dag_id}/{trigger_run_id}".encode()).hexdigest()[:6]
    return check_run_id(f"{when:%Y%m%dt%H%M%S}-{digest}")


FAULT_PARAM_PREFIX = "fault_"
"""The trigger form shows each `FaultParams` field as a flat Param `fault_<field>`."""


def trigger_conf(params: dict[str, Any], conf: dict[str, Any] | None) -> dict[str, Any]:
    """One conf from the trigger form's Params and the DAG run's conf (the conf wins): the flat
    `fault_*` Params become the nested `faults`, unset (None) values are dropped."""
    merged = {**params, **(conf or {})}
    faults = dict(merged.get("faults") or {})
    for key in [k for k in merged if k.startswith(FAULT_PARAM_PREFIX)]:
        value = merged.pop(key)
        if value not in (None, "", False):
            faults[key.removeprefix(FAULT_PARAM_PREFIX)] = value
    merged["faults"] = faults
    return {k: v for k, v in merged.items() if v is not None}


def parse_conf(conf: dict[str, Any] | None, *, dag_id: str, trigger_run_id: str, when: datetime
               ) -> AttemptConf:
    """Parse a DAG run's conf (Airflow hands Params and conf over together; unknown keys are
    errors, templated strings are coerced) and give a first attempt its run id."""
    from pydantic import ValidationError

    from trainyard.config.safe_yaml import preview_value

    if conf is not None and not isinstance(conf, dict):
        raise InvalidConf(f"the run's conf is {type(conf).__name__}, not a mapping: {preview_value(conf)}")
    try:
        parsed = AttemptConf.model_validate({k: v for k, v in (conf or {}).items() if v is not None})
    except ValidationError as e:
        errors = e.errors(include_url=False)
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))[:100] or 'conf'}: {err['msg']} "
                             f"(got {preview_value(err.get('input'))})" for err in errors[:5])
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        raise InvalidConf(f"the run's conf is invalid: {problems}{more}") from e
    if parsed.run:
        return parsed
    if parsed.attempt:
        raise InvalidConf(f"attempt {parsed.attempt} names no run: only a first attempt opens one")
    return parsed.model_copy(update={"run": run_id_for_trigger(dag_id, trigger_run_id, when)})


MANAGED_SCRIPT = re.compile(r"^[ \t]*(import trainyard\b|from trainyard\b)", re.M)
"""A script that imports Trainyard's runtime: managed (it reports its steps, checkpoints through
the session, applies the fault Params); one that does not is plain (docs/bring-your-own.md)."""


def managed_only_params(conf: AttemptConf, script: Path | None) -> list[str]:
    """The trigger form's Params that only a managed script can honour, set for a first attempt
    of a script known to be plain (`script`: its file, when this host can read it): they would be
    ignored without a word, so the trigger is refused instead."""
    if conf.attempt != 0 or script is None or not script.is_file():
        return []
    try:
        if MANAGED_SCRIPT.search(script.read_text(errors="replace")):
            return []
    except OSError:
        return []
    f = conf.faults
    named = {"max_steps": conf.max_steps is not None, "fault_kill_at_step": f.kill_at_step is not None,
             "fault_hang_at_step": f.hang_at_step is not None, "fault_nan_at_step": f.nan_at_step is not None,
             "fault_oom_at_step": f.oom_at_step is not None}
    return [name for name, given in named.items() if given]


def effective_job(job: TrainingJob, conf: AttemptConf) -> TrainingJob:
    """The spec as this run trains it: the trigger form's overrides applied, revalidated."""
    from trainyard.config.spec import TrainingJob as Model

    training: dict[str, Any] = {}
    if conf.max_steps is not None:
        training["maxSteps"] = conf.max_steps
    if conf.learning_rate is not None:
        training["learningRate"] = conf.learning_rate
    if not training:
        return job
    data = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spec"]["training"] = {**data["spec"].get("training", {}), **training}
    return Model.model_validate(data)


def plan_attempt(job: TrainingJob, cluster: Cluster, conf: AttemptConf, *, memory_fraction: float,
                 advice: PlanResult | None = None) -> tuple[Plan, str]:
    """(plan, where it came from): a re-plan handed over by the previous attempt wins; else the
    advisor's best in `advice` (the attempt's one search), or the advisor asked now."""
    from trainyard.plugins.advisor.plan import Plan
    from trainyard.plugins.advisor.plans import plan_for_job

    if conf.plan:
        plan = Plan.model_validate_json(conf.plan)
        plan.layout.check_world_size(job.spec.hardware.gpu_count)
        return plan, f"re-planned after attempt {conf.attempt - 1}"
    try:
        return plan_for_job(job, cluster, memory_fraction=memory_fraction, advice=advice)
    except ValueError as e:
        raise NoPlan(str(e)) from e


def resume_point(conf: AttemptConf, job: TrainingJob, *, tracking_uri: str, object_store: str) -> str:
    """The manifest URI the attempt restores, or '' for the run's newest valid checkpoint.

    A later attempt restores what the recovery decision named (a rollback, a fall-back) or, with
    nothing named, the newest valid checkpoint of its own run. A first attempt starts fresh unless
    its trigger asked to start from a checkpoint or a registered model (`models:/name@alias`:
    the checkpoint the version was exported from, recorded in its lineage tags) — or, with no
    `start_from`, `job`'s `retrain.startFromAlias` names an alias some version of its model holds.

    Whatever its source, the point must lie inside the job's own area (`uris.resolve_for_job`:
    `<store>/jobs/<job>/…` by path structure, or the spec's storage folder) or be the spec's
    read-only `checkpoint.initFrom`; anything else is `InvalidConf` here, before a gang starts.
    """
    return check_resume_point(_named_point(conf, job, tracking_uri=tracking_uri), job, object_store)


def check_conf_points(conf: AttemptConf, job: TrainingJob, *, object_store: str) -> None:
    """Refuse (`InvalidConf`) a conf whose resume or start point is a URI outside the job's
    area, at `validate_spec` — before a gang is placed. A `models:/` alias needs the registry
    and is resolved (and checked the same way) by `resume_point` at launch."""
    point = conf.resume_from if conf.attempt > 0 else conf.start_from.strip()
    if point and not point.startswith("models:/"):
        check_resume_point(point, job, object_store)


def _named_point(conf: AttemptConf, job: TrainingJob, *, tracking_uri: str) -> str:
    if conf.attempt > 0:
        return conf.resume_from
    start = conf.start_from.strip() or _retrain_start(job, tracking_uri=tracking_uri)
    if not start.startswith("models:/"):
        return start
    from trainyard.plugins.tracking.runs import client_for

    name, sep, alias = start.removeprefix("models:/").partition("@")
    if not sep or not name or not alias:
        raise InvalidConf(f"start_from {start[:200]!r}: write models:/<name>@<alias>")
    version = client_for(tracking_uri).get_model_version_by_alias(name, alias)
    uri = version.tags.get("trainyard.checkpoint.uri", "")
    if not uri:
        raise InvalidConf(f"model {name} version {version.version} (alias {alias!r}) records no "
                          "checkpoint it was exported from (tag trainyard.checkpoint.uri)")
    return uri


def _retrain_start(job: TrainingJob | None, *, tracking_uri: str) -> str:
    """`models:/<job>@<alias>` when the spec's `retrain.startFromAlias` is held by a version, else
    '' (a first retraining run, before anything was promoted, starts fresh)."""
    alias = job.spec.retrain.start_from_alias if job is not None and job.spec.retrain is not None else None
    if not alias:
        return ""
    from trainyard.plugins.tracking.registry import version_at

    return f"models:/{job.name}@{alias}" if version_at(job.name, alias, tracking_uri=tracking_uri) else ""


def check_resume_point(uri: str, job: TrainingJob, object_store: str) -> str:
    """`uri` when it names a manifest inside the job's area (or is its `initFrom`), '' for '';
    else `InvalidConf` naming the URI and why (`trainyard launch --resume-from` calls it too)."""
    if not uri:
        return ""
    from trainyard.plugins.checkpoint.uris import resolve_for_job, split_manifest_uri
    from trainyard.plugins.errors import TrainyardError

    try:
        split_manifest_uri(uri)
        return resolve_for_job(uri, job, object_store)
    except (TrainyardError, ValueError) as e:
        raise InvalidConf(f"resume point {uri[:300]!r} refused: {str(e)[:400]}") from e


def in_place_restarts(job: TrainingJob, conf: AttemptConf) -> int:
    """torchrun's `--max-restarts` for the attempt: the spec's fast path, never more than the
    restart budget has left (each in-place restart counts against it)."""
    ft = job.spec.fault_tolerance
    return max(0, min(ft.in_place_restarts, ft.max_restarts - conf.restarts_used))


