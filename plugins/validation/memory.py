"""INSUFFICIENT_GPU_MEMORY: does the job fit in device memory? Answered by the advisor.

Interim (until the advisor lands in this tree): no memory check is made and nothing is
reported. The advisor engineer replaces this module with the real check.
"""

from __future__ import annotations

from config.cluster import Cluster
from config.problems import Problem
from config.spec import TrainingJob


def check_memory(job: TrainingJob, cluster: Cluster, *, memory_fraction: float) -> list[Problem]:
    return []
