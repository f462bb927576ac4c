"""Teams: guaranteed shares and hard quotas, for fair share, preemption and the dry run."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator
from pydantic.alias_generators import to_camel

TEAMS_FILE = Path(__file__).parent / "teams.yaml"


class Team(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              frozen=True)

    share: float = Field(ge=0, le=1)
    """Guaranteed fraction of the cluster when it is fully loaded (seed §4)."""
    quota_gpus: NonNegativeInt | None = None
    """Hard cap on the team's concurrent accelerators; none = no cap beyond the cluster."""
    can_borrow: bool = True
    """May run above its share on idle capacity (those jobs become preemptible)."""


class Teams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    teams: dict[str, Team]

    @model_validator(mode="after")
    def _shares_fit(self) -> Teams:
        total = sum(t.share for t in self.teams.values())
        if total > 1.0 + 1e-9:
            raise ValueError(f"team shares add up to {total:.2f}; they must not exceed 1.0")
        return self

    def get(self, name: str) -> Team | None:
        return self.teams.get(name)


def load_teams(path: str | Path = TEAMS_FILE) -> Teams:
    with Path(path).open() as f:
        return Teams.model_validate(yaml.safe_load(f))
