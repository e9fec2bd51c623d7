"""What each trial exit class decides: graded, possibly the artifact's, or the infrastructure's.

The classes themselves (the one list, and what the sandbox saw for each) are
:data:`sandbox.trials.trial.EXIT_CLASSES`; this module gives every class its decision
(design page, "Who caused a failure decides the reward"):

* ``ok`` → ``graded``: the log is graded (tests it lacks: :mod:`eval.integrity.missing`).
* ``timeout``, ``oom``, ``pids``, ``output_limit``, ``apply_failed``, ``truncated_log`` →
  ``attributable``: charged to the artifact with the failure value when the controls are
  healthy under the same limits and the retry fails too (:mod:`eval.integrity.attribution`);
  else unavailable. The retry policy runs each once more (:mod:`eval.integrity.retry`).
* ``infra_error`` → ``infrastructure``: unavailable (utility None, the rollout excluded and
  counted by reason); the retry policy runs it again up to the caller's infra retries.

An attributable class is one that code running in the trial can cause: the resource
classes (:data:`sandbox.trials.trial.RESOURCE_CLASSES`), an apply failure (the artifact is
the policy's bytes) and a test log cut inside a trial that otherwise ran to its end.
"""

from __future__ import annotations

from sandbox.trials.trial import (
    APPLY_FAILED,
    EXIT_CLASSES,
    INFRA_ERROR,
    OK,
    RESOURCE_CLASSES,
    TRUNCATED_LOG,
)

GRADED = "graded"
"""Decision of a trial whose log is graded."""
ATTRIBUTABLE = "attributable"
"""Decision of a failure the artifact rule may charge to the artifact."""
INFRASTRUCTURE = "infrastructure"
"""Decision of a failure that is never the policy's: the utility is unavailable."""
DECISIONS = (GRADED, ATTRIBUTABLE, INFRASTRUCTURE)

ATTRIBUTABLE_CLASSES = (*RESOURCE_CLASSES, APPLY_FAILED, TRUNCATED_LOG)
"""Exit classes the artifact rule may charge to the artifact
(:func:`eval.integrity.attribution.attribute_failure`) and the retry policy runs again
(:class:`eval.integrity.retry.RetryPolicy`)."""
INFRA_CLASSES = (INFRA_ERROR,)
"""Exit classes of the infrastructure: never charged to the policy, retried as infra."""

EXIT_RULE = {OK: GRADED, **{c: ATTRIBUTABLE for c in ATTRIBUTABLE_CLASSES},
             **{c: INFRASTRUCTURE for c in INFRA_CLASSES}}
"""Exit class → decision, one entry per class of :data:`sandbox.trials.trial.EXIT_CLASSES`."""


def exit_rule(exit_class: str) -> str:
    """The decision (:data:`DECISIONS`) of ``exit_class``.

    Raises: ValueError naming ``exit_class`` when it is not in
    :data:`sandbox.trials.trial.EXIT_CLASSES`.
    """
    if exit_class not in EXIT_RULE:
        raise ValueError(f"exit_class: expected one of {EXIT_CLASSES}, got {exit_class!r}")
    return EXIT_RULE[exit_class]


__all__ = ["ATTRIBUTABLE", "ATTRIBUTABLE_CLASSES", "DECISIONS", "EXIT_RULE", "GRADED",
           "INFRASTRUCTURE", "INFRA_CLASSES", "exit_rule"]
