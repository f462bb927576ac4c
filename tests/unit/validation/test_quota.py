from __future__ import annotations

from pathlib import Path

from trainyard.config.loader import load_spec_file
from trainyard.config.problems import Code
from trainyard.config.teams import Teams
from trainyard.plugins.validation.quota import check_quota

JOB = load_spec_file(Path(__file__).resolve().parents[3] / "config" / "examples" / "llama-7b-finetune.yaml")
TEAMS = Teams.model_validate({"teams": {"nlp-research": {"share": 0.25, "quotaGpus": 100},
                                        "vision": {"share": 0.1}}})


def test_within_quota() -> None:
    assert check_quota(JOB, TEAMS, {"nlp-research": 36}) == []


def test_over_quota_names_the_numbers() -> None:
    (p,) = check_quota(JOB, TEAMS, {"nlp-research": 40})
    assert p.code == Code.QUOTA_EXCEEDED
    assert p.message == ("requested 64 accelerators but team 'nlp-research' has 60 of its quota of "
                         "100 available (40 in use)")
    assert "at most 60" in p.hint


def test_unknown_team_suggests() -> None:
    job = JOB.model_copy(update={"metadata": JOB.metadata.model_copy(update={"team": "nlp-reserch"})})
    (p,) = check_quota(job, TEAMS, {})
    assert p.code == Code.UNKNOWN_TEAM and p.hint == "did you mean 'nlp-research'?"


def test_no_cap_means_no_quota_problem() -> None:
    job = JOB.model_copy(update={"metadata": JOB.metadata.model_copy(update={"team": "vision"})})
    assert check_quota(job, TEAMS, {"vision": 10_000}) == []
