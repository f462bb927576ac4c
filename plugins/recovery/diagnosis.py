"""A failed attempt as a person reads it: the class, the failing rank and where, what was done,
and that rank's last log lines — the lines the task a person lands on logs (`attempt_failed`,
`give_up`) in place of a framework traceback (issue 57). Pure: from the `FailureReport` and the
`RecoveryAction` alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.plugins.recovery.model import FailureReport, RecoveryAction


def diagnosis_lines(report: FailureReport, action: RecoveryAction | None = None) -> list[str]:
    """`attempt 0 of run R: worker_crash at step 119`, the failing rank, the cause, the action
    (with the resume step), the telling line and the rank's last log lines."""
    from trainyard.plugins.run.exit_codes import describe

    where = f" at step {report.step}" if report.step is not None else ""
    lines = [f"attempt {report.attempt} of run {report.run}: {report.outcome}{where}"]
    if report.rank is not None:
        on = f" on {report.node}" if report.node else ""
        code = f": {describe(report.exit_code)}" if report.exit_code not in (None, 0) else ""
        lines.append(f"failing rank: {report.rank}{on}{code}")
    elif report.failed_nodes:
        lines.append(f"failed node(s): {', '.join(report.failed_nodes)}")
    lines.append(f"cause: {report.reason}")
    if action is not None:
        resume = f" from step {action.resume_step}" if action.retries and action.resume_step is not None else ""
        lines.append(f"action: {action.kind}{resume} — {action.reason}")
    if report.log_line:
        lines.append(f"telling line: {report.log_line}")
    if report.log_tail:
        who = f"rank {report.rank}" if report.rank is not None else "the failing rank"
        lines.append(f"last {len(report.log_tail)} log line(s) of {who}:")
        lines.extend(f"  | {ln}" for ln in report.log_tail)
    return lines
