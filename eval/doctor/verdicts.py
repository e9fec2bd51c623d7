"""The doctor's adapter to the reward-integrity rules: every probe is judged here, by the
same functions training's (``ecredit_trl/runs/outcomes.py``) and evaluation's
(:mod:`eval.evaluation.verification`) adapters call (design page, "Who caused a failure
decides the reward")."""

from __future__ import annotations

from eval.integrity.agent import AGENT_DISK_BUDGET, classify_exec_failure
from eval.integrity.attribution import attribute_failure
from eval.integrity.controls import control_facts
from eval.integrity.exits import ATTRIBUTABLE, exit_rule
from eval.integrity.retry import RetryPolicy


def exec_class(evidence: dict) -> str | None:
    """Who broke an agent's container: :func:`eval.integrity.agent.classify_exec_failure`
    of a failed exec's evidence (``agent_pids``, ``agent_oom``, or None: infrastructure)."""
    return classify_exec_failure(evidence)


def disk_class() -> str:
    """The class of a tree grown past its disk budget (always the policy's)."""
    return AGENT_DISK_BUDGET


def trial_retry() -> RetryPolicy:
    """The trainer's retry policy of a verifier pool (one infra retry, one failure retry)."""
    return RetryPolicy()


def trial_class(res, control) -> tuple[str | None, str | None, str]:
    """``(failure_class, unattributed reason, decision)`` of a probe trial ``res`` (a
    :class:`sandbox.trials.trial.TrialResult`) beside its empty-patch ``control`` (a result
    under the same limits): :func:`eval.integrity.attribution.attribute_failure` with the
    control's facts, and :func:`eval.integrity.exits.exit_rule` of its exit class."""
    verdict = attribute_failure(res.exit_class, failed_attempts=res.failed_attempts,
                                limits=res.limits, test_s=res.test_s,
                                controls=[control_facts(control)],
                                retry_limits=getattr(res, "retry_limits", None))
    return verdict.failure_class, verdict.unattributed, exit_rule(res.exit_class)


__all__ = ["ATTRIBUTABLE", "disk_class", "exec_class", "trial_class", "trial_retry"]
