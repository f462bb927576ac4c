"""The dry run: every check that must pass before an accelerator is allocated (seed App. A).

`validate_job` runs the spec's own rules, the rules against the cluster, what the worker runtime
can apply (`runtime.py`, needs no world), and — unless told to stay offline — the checks that need the world: memory fit (the advisor), the dataset in the
object store, the team's quota, and optionally data quality (Great Expectations). It never
raises for a bad spec; it returns every problem found.

The team's current usage comes from the caller (the attempt engine reads the reservations): the
platform's SQL state stores the engines' values, so the engines sit below it and never read it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainyard.config.cluster import Cluster
from trainyard.config.problems import Problem
from trainyard.config.rules import check_against_cluster, check_spec
from trainyard.config.settings import Settings
from trainyard.config.spec import TrainingJob
from trainyard.config.teams import Teams, load_teams
from trainyard.plugins.validation.dataset import check_dataset
from trainyard.plugins.validation.memory import check_memory
from trainyard.plugins.validation.quota import check_quota
from trainyard.plugins.validation.runtime import check_runtime

if TYPE_CHECKING:
    from trainyard.plugins.advisor.planner import PlanResult

log = logging.getLogger(__name__)


def validate_job(
    job: TrainingJob,
    *,
    cluster: Cluster,
    settings: Settings,
    teams: Teams | None = None,
    usage: Mapping[str, int] | None = None,
    offline: bool = False,
    data_quality: bool = False,
    advice: PlanResult | None = None,
) -> list[Problem]:
    """Every problem at once. `usage`: the accelerators each team holds now (the caller reads the
    reservations); None counts nothing reserved. `advice`: the advisor's answer the caller already
    asked for (`memory.advise`), so the memory check does not search again."""
    problems = check_spec(job)
    cluster_problems = check_against_cluster(job, cluster)
    problems += cluster_problems
    problems += check_runtime(job)
    if offline:
        return problems
    if not any(p.severity == "error" for p in cluster_problems):
        problems += check_memory(job, cluster, memory_fraction=settings.memory_fraction, advice=advice)
    problems += check_quota(job, teams or load_teams(settings.teams_file),
                            usage if usage is not None else {})
    dataset_problems = check_dataset(job, settings)
    problems += dataset_problems
    if data_quality and not dataset_problems and job.spec.dataset is not None and job.spec.dataset.quality.enabled:
        from trainyard.plugins.validation.data_quality import data_quality_problems

        problems += data_quality_problems(job, settings)
    return problems

