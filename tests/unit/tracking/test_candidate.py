"""`candidate_decision`: `candidate` moves only under the spec's rule, and says why (issue 57)."""

from __future__ import annotations

import pytest

from trainyard.config.spec import CandidateRule
from trainyard.plugins.tracking.candidate import Holder, candidate_decision

RULE = CandidateRule()


def decide(rule: CandidateRule = RULE, **kw: object) -> tuple[bool, str]:
    fields: dict = {"alias": "candidate", "step": 200, "max_steps": 200, "loss": 1.8, "holder": Holder("4", 1.85),
                    **kw}
    return candidate_decision(rule, **fields)


def test_a_full_run_no_worse_than_the_holder_takes_it() -> None:
    assert decide() == (True, "candidate moved from version 4 (step 200 ≥ maxSteps 200, loss 1.8 ≤ 1.85)")


def test_the_first_version_takes_it_when_it_reached_max_steps() -> None:
    assert decide(holder=None) == (True, "candidate moved: no version held it")


def test_a_smoke_run_does_not_take_it_from_the_long_run() -> None:
    # the case: a 20-step run, loss 3.14, against the 200-step model's 1.85
    move, why = decide(step=20, loss=3.14)
    assert not move
    assert why == ("candidate not moved (it stays on version 4): the run reached step 20 of the spec's maxSteps 200; "
                   "its final loss 3.14 is worse than version 4's 1.85")


def test_a_short_first_run_does_not_take_it_either() -> None:
    assert decide(step=20, holder=None) == (
        False, "candidate not moved: the run reached step 20 of the spec's maxSteps 200")


@pytest.mark.parametrize(("rule", "step", "loss", "move"), [
    (CandidateRule(require_max_steps=False), 20, 1.0, True),
    (CandidateRule(require_no_worse_loss=False), 200, 9.0, True),
    (CandidateRule(require_max_steps=False, require_no_worse_loss=False), 1, 9.0, True),
    (CandidateRule(), 200, 1.9, False),
])
def test_each_check_can_be_turned_off_in_the_spec(rule: CandidateRule, step: int, loss: float, move: bool) -> None:
    assert decide(rule=rule, step=step, loss=loss)[0] is move


def test_unknown_losses_do_not_block_and_a_spec_without_max_steps_passes() -> None:
    assert decide(loss=None, max_steps=None, step=None)[0]
    assert decide(holder=Holder("4", None), loss=5.0)[0]
