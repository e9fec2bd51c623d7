"""How a verifier trial's result becomes (or does not become) a utility.

Kept apart from the trainer so the rule can be checked against real trials
without importing TRL.
"""

from __future__ import annotations

TRIAL_OUTCOMES = ("graded", "attributed", "incomplete", "truncated_log", "timeout",
                  "apply_failed", "infra_error", "oom")
"""How a verifier trial's result was used. ``graded``/``attributed`` give a utility
(``attributed``: missing tests counted as failures because the empty-patch control
observed them, DESIGN.md §3); every other outcome leaves the utility unavailable
(None), never 0."""


def trial_outcome(task, res, control_log: str | None):
    """Utility, resolved flag and outcome class of one verifier trial.

    Args:
        task: ``eval.tasks.Task`` (FAIL_TO_PASS, PASS_TO_PASS, log_parser).
        res: :class:`sandbox.TrialResult` or None (not run).
        control_log: the task's empty-patch control log (for attribution) or None.

    Returns: ``(utility: float | None, resolved: bool | None, outcome: str)`` with
    ``outcome`` in :data:`TRIAL_OUTCOMES`. A trial that did not end ``ok`` (timeout,
    artifact that does not apply, sandbox killed, an OOM kill of any process in the
    sandbox) and a test log cut off between SWE-bench's start and end markers
    (``truncated_log``) give
    ``(None, None, outcome)``: the reward is unavailable, not 0.
    """
    from eval.grading import grade

    if res is None:
        return None, None, "infra_error"
    if res.exit_class != "ok":
        return None, None, res.exit_class
    rep = grade(res.log, f2p=task.FAIL_TO_PASS, p2p=task.PASS_TO_PASS, parser=task.log_parser,
                control_log=control_log)
    if rep.log_rejected == "truncated":
        return None, None, "truncated_log"
    if rep.utility is None:
        return None, None, "incomplete"
    return rep.utility, rep.resolved, "attributed" if rep.attributed else "graded"


__all__ = ["TRIAL_OUTCOMES", "trial_outcome"]
