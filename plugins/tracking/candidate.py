"""Whether a newly registered version takes the `candidate` alias — under the rule the spec
states (`spec.registration.candidate`), never by default (issue 57: a 20-step smoke run took
`candidate` from the 200-step model, loss 3.14 over 1.85).

`candidate_decision` is the rule, pure; `apply_candidate_rule` reads its inputs from MLflow
(the run's last `loss` and its step, the holder's run's last `loss`), moves the alias or not,
and writes the reason on the version (tag `trainyard.candidate`), so a retried registration
reads the first decision back and every surface can say why the alias did or did not move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from trainyard.config.spec import CandidateRule
    from trainyard.plugins.tracking.registry import ModelVersionInfo

DECISION_TAG = "trainyard.candidate"
"""The model-version tag holding why `candidate` did or did not move to it."""


class Holder(NamedTuple):
    version: str
    loss: float | None


class Decision(NamedTuple):
    move: bool
    reason: str


def candidate_decision(rule: CandidateRule, *, alias: str, step: int | None, max_steps: int | None,
                       loss: float | None, holder: Holder | None) -> Decision:
    """Move `alias` to the new version? Each check of `rule` that fails is named, with both values."""
    held: list[str] = []
    if rule.require_max_steps and max_steps is not None and (step is None or step < max_steps):
        held.append(f"the run reached step {step if step is not None else '?'} of the spec's maxSteps {max_steps}")
    if (rule.require_no_worse_loss and holder is not None and holder.loss is not None and loss is not None
            and loss > holder.loss):
        held.append(f"its final loss {loss:.4g} is worse than version {holder.version}'s {holder.loss:.4g}")
    if held:
        where = f" (it stays on version {holder.version})" if holder is not None else ""
        return Decision(False, f"{alias} not moved{where}: " + "; ".join(held))
    if holder is None:
        return Decision(True, f"{alias} moved: no version held it")
    why = [f"step {step} ≥ maxSteps {max_steps}"] if rule.require_max_steps and max_steps is not None else []
    if rule.require_no_worse_loss and loss is not None and holder.loss is not None:
        why.append(f"loss {loss:.4g} ≤ {holder.loss:.4g}")
    return Decision(True, f"{alias} moved from version {holder.version}" + (f" ({', '.join(why)})" if why else ""))


def last_loss(client: object, run_id: str | None) -> tuple[int | None, float | None]:
    """(step, value) of a run's last `loss` point, (None, None) when it has none (the candidate
    rule's final loss; the runs list's steps and final loss)."""
    if not run_id:
        return None, None
    history = client.get_metric_history(run_id, "loss")  # type: ignore[attr-defined]
    if not history:
        return None, None
    last = max(history, key=lambda m: (m.step, m.timestamp))
    return int(last.step), float(last.value)


def apply_candidate_rule(made: ModelVersionInfo, rule: CandidateRule, *, alias: str, max_steps: int | None,
                         mlflow_run_id: str, tracking_uri: str) -> tuple[ModelVersionInfo, str]:
    """Move `alias` to `made` when `rule` allows; returns the version as it now is and the reason.
    A version that already carries a decision (a retried registration) keeps it."""
    from mlflow.exceptions import MlflowException

    from trainyard.plugins.tracking.registry import ModelVersionInfo
    from trainyard.plugins.tracking.runs import client_for

    client = client_for(tracking_uri)
    mv = client.get_model_version(made.name, made.version)
    if (mv.tags or {}).get(DECISION_TAG):
        return ModelVersionInfo.from_mlflow(mv), mv.tags[DECISION_TAG]
    try:
        current = client.get_model_version_by_alias(made.name, alias)
    except MlflowException:
        current = None
    holder = None
    if current is not None and str(current.version) != made.version:
        holder = Holder(str(current.version), last_loss(client, current.run_id)[1])
    step, loss = last_loss(client, mlflow_run_id)
    decision = candidate_decision(rule, alias=alias, step=step, max_steps=max_steps, loss=loss, holder=holder)
    if decision.move:
        client.set_registered_model_alias(made.name, alias, made.version)
    client.set_model_version_tag(made.name, made.version, DECISION_TAG, decision.reason[:5000])
    return ModelVersionInfo.from_mlflow(client.get_model_version(made.name, made.version)), decision.reason
