"""Training's one adapter to the integrity rules (:mod:`eval.integrity`): how a verifier trial's
result becomes (or does not become) a utility, who broke an agent episode, the control facts,
the retry policy of the trainer's pool and the outcome vocabulary the ledger counts.

Kept apart from the trainer so the rules can be checked against real trials without
importing TRL. Failures the artifact caused follow the artifact rule
(:mod:`eval.integrity.attribution`), the same function ``eval.run`` calls (design page, "Who
caused a failure decides the reward").
"""

from __future__ import annotations

from dataclasses import dataclass

from eval.integrity.agent import (
    AGENT_DISK_BUDGET,
    AGENT_FAILURE_CLASSES,
    agent_failure_verdict,
    classify_exec_failure,
)
from eval.integrity.attribution import FAILURE_CLASSES, attribute_failure
from eval.integrity.attribution import UNATTRIBUTED_REASONS as ARTIFACT_UNATTRIBUTED
from eval.integrity.controls import ControlFacts, control_facts
from eval.integrity.failure_value import failure_utility
from eval.integrity.nodes import NODE_UNHELD, exec_on_unheld_node, on_unheld_node
from eval.integrity.retry import RetryPolicy
from sandbox.trials.trial import EXIT_CLASSES, INFRA_ERROR, OK, TIMEOUT, TRUNCATED_LOG

UNATTRIBUTED_REASONS = (*ARTIFACT_UNATTRIBUTED, NODE_UNHELD)
"""Why an attributable failure stayed unavailable: the artifact rule's reasons and the node
rule's (:mod:`eval.integrity.nodes`)."""
TRIAL_OUTCOMES = ("graded", "attributed", *FAILURE_CLASSES, "incomplete",
                  *(c for c in EXIT_CLASSES if c != OK))
"""How a verifier trial's result was used. ``graded``/``attributed`` give a utility
(``attributed``: missing tests counted as failures because the empty-patch control observed
them, :mod:`eval.integrity.missing`); ``artifact_<class>``
(:data:`eval.integrity.attribution.FAILURE_CLASSES`) give the failure value (the artifact broke
its own trial while the control was healthy, and the retry broke too); every other outcome
(``incomplete``, and a non-``ok`` exit class of :data:`sandbox.trials.trial.EXIT_CLASSES` the
rule did not charge, ``truncated_log`` also for a cut log) leaves the utility unavailable
(None), never 0."""


@dataclass(frozen=True)
class TrialVerdict:
    """One trial's use: ``utility`` (float or None), ``resolved`` (bool or None), ``outcome``
    (in :data:`TRIAL_OUTCOMES`), ``failure_class`` (``artifact_*`` or None) and
    ``failure_evidence`` (dict or None: the attribution's evidence, with ``unattributed``
    naming why an attributable failure stayed unavailable, or ``not_reproduced`` holding a
    first attempt whose failure the retry did not repeat)."""

    utility: float | None
    resolved: bool | None
    outcome: str
    failure_class: str | None = None
    failure_evidence: dict | None = None


def trial_verdict(task, res, control_log: str | None,
                  controls: list[ControlFacts] | None = None) -> TrialVerdict:
    """Utility, resolved flag, outcome class and failure attribution of one verifier trial.

    Args:
        task: ``eval.tasks.schema.Task`` (FAIL_TO_PASS, PASS_TO_PASS, log_parser).
        res: :class:`sandbox.trials.trial.TrialResult` or None (not run).
        control_log: the task's empty-patch control log (for missing tests) or None.
        controls: the task's control facts (:func:`control_facts`) for
            :func:`eval.integrity.attribution.attribute_failure`; None or [] = no control
            known (no failure can be attributed).

    A trial that ended in an attributable class (:data:`eval.integrity.exits.ATTRIBUTABLE_CLASSES`)
    with healthy controls under the same limits (a timeout: with headroom, and a retry under
    the raised limit) and a retry that failed too is ``artifact_<class>``: resolved False, utility the failure value
    (:func:`eval.integrity.failure_value.failure_utility`). Any other non-``ok`` trial and a
    test log cut off between SWE-bench's start and end markers (``truncated_log``) give
    utility None: the reward is unavailable, not 0.
    """
    from eval.grading.grader import grade  # start-up: swebench, ~1 s

    if res is None:
        return TrialVerdict(None, None, INFRA_ERROR)
    att = attribute_failure(res.exit_class, failed_attempts=res.failed_attempts,
                            limits=res.limits, test_s=res.test_s, controls=controls or [],
                            retry_limits=getattr(res, "retry_limits", None))
    att = on_unheld_node(att, getattr(res, "node_unheld", None))
    if res.exit_class != OK or att.unattributed == "retry_over_limit":
        if att.failure_class is not None:
            return TrialVerdict(failure_utility(task.FAIL_TO_PASS, task.PASS_TO_PASS), False,
                                att.failure_class, att.failure_class, att.evidence)
        ev = {**att.evidence, "unattributed": att.unattributed} if att.unattributed else None
        # an ok retry past the original limit is that limit's failure, unavailable
        outcome = res.exit_class if res.exit_class != OK else TIMEOUT
        return TrialVerdict(None, None, outcome, None, ev)
    ev = {"not_reproduced": res.failed_attempts[0]} if res.failed_attempts else None
    rep = grade(res.log, f2p=task.FAIL_TO_PASS, p2p=task.PASS_TO_PASS, parser=task.log_parser,
                control_log=control_log)
    if rep.log_rejected == "truncated":
        return TrialVerdict(None, None, TRUNCATED_LOG, None, ev)
    if rep.utility is None:
        return TrialVerdict(None, None, "incomplete", None, ev)
    return TrialVerdict(rep.utility, rep.resolved, "attributed" if rep.attributed else "graded",
                        None, ev)


def trial_outcome(task, res, control_log: str | None,
                  controls: list[ControlFacts] | None = None):
    """``(utility, resolved, outcome)`` of :func:`trial_verdict` (same arguments)."""
    v = trial_verdict(task, res, control_log, controls)
    return v.utility, v.resolved, v.outcome


def trial_retry(max_retries: int) -> RetryPolicy:
    """The retry policy of a training or pilot pool: ``max_retries`` infra retries and the
    artifact rule's one failure retry (:class:`eval.integrity.retry.RetryPolicy`)."""
    return RetryPolicy(max_retries=max_retries)


def exec_failure_class(evidence: dict) -> str | None:
    """Who broke an agent exec, from the session's evidence
    (:func:`eval.integrity.agent.classify_exec_failure`): ``agent_pids``, ``agent_oom`` or
    None (infrastructure); None too on a node whose doctor report had a rule not held
    (:func:`eval.integrity.nodes.exec_on_unheld_node`)."""
    return exec_on_unheld_node(classify_exec_failure(evidence), evidence)


__all__ = ["AGENT_DISK_BUDGET", "AGENT_FAILURE_CLASSES", "FAILURE_CLASSES", "TRIAL_OUTCOMES",
           "UNATTRIBUTED_REASONS", "ControlFacts", "TrialVerdict", "agent_failure_verdict",
           "control_facts", "exec_failure_class", "trial_outcome", "trial_retry",
           "trial_verdict"]
