"""QUOTA_EXCEEDED / UNKNOWN_TEAM: may this team start this many more accelerators?

Usage comes from the platform state (reservations with unexpired leases); the caller passes it
in so this check stays a pure function and the dry run can be tested without a database.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainyard.config.problems import Code, Problem
from trainyard.config.spec import TrainingJob
from trainyard.config.teams import Teams


def check_quota(job: TrainingJob, teams: Teams, usage: Mapping[str, int]) -> list[Problem]:
    name = job.metadata.team
    team = teams.get(name)
    if team is None:
        import difflib

        close = difflib.get_close_matches(name, sorted(teams.teams), n=1)
        return [Problem(code=Code.UNKNOWN_TEAM, path="metadata.team",
                        message=f"team '{name}' is not declared in teams.yaml",
                        hint=f"did you mean '{close[0]}'?" if close else
                        f"known teams: {', '.join(sorted(teams.teams))}")]
    if team.quota_gpus is None:
        return []
    in_use = int(usage.get(name, 0))
    wanted = job.spec.hardware.gpu_count
    available = max(team.quota_gpus - in_use, 0)
    if wanted > available:
        return [Problem(
            code=Code.QUOTA_EXCEEDED, path="spec.hardware.gpuCount",
            message=f"requested {wanted} accelerators but team '{name}' has {available} of its "
                    f"quota of {team.quota_gpus} available ({in_use} in use)",
            hint=f"ask for at most {available}, wait for the team's running jobs, or raise the quota",
        )]
    return []
