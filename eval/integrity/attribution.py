"""The artifact rule: who caused a failed verifier trial, the artifact (a scored failure) or
the infrastructure (unavailable). One pure rule for training, the pilot and ``eval.run``
(design page, "Who caused a failure decides the reward").

**The rule.** A trial of an artifact that ended in an attributable exit class
(:data:`eval.integrity.exits.ATTRIBUTABLE_CLASSES`) is charged to the artifact, and scored
with the failure value (:func:`eval.integrity.failure_value.failure_utility`), when both
hold:

1. **the controls are healthy under the same limits**: the task's empty-patch control
   (and the gold control too, when one ran) ended ``ok`` under the same timeout, memory,
   pids, CPU and output limits; and
2. **the failure recurs**: the trial's one retry (:class:`eval.integrity.retry.RetryPolicy`
   ``failure_retries``) also ended in an attributable class. The retry rules out a one-off
   slow, starved or overloaded node; "the same way" is read as *the same family* (any
   attributable class), the first attempt's class naming the outcome and both recorded: a
   policy that picks a random way to break its trial (hang or memory blow-up) must not
   escape by making the two attempts differ.

Otherwise the trial is *unavailable* (utility None, the rollout excluded and counted by
reason): no control, a control that itself failed, limits that differ, no retry, or a retry
that ended ``infra_error``. A retry that ended ``ok`` is graded from its own log (the first
failure did not recur; it stays on record).

Infrastructure failures are never attributed: ``infra_error`` (a container that could not
start, a dead service, an end marker missing without a deadline) is not an attributable
class, and a failed control makes every failure of the task's trials unavailable.

**Apply failures.** Our own snapshotter writes the artifact (``git diff`` of the policy's
tree from the base) and the verifier applies it to the same base, so an honest pipeline
always applies. An apply failure is therefore either a bug of ours or bytes the policy
chose (e.g. a ``.gitattributes`` or path layout that the apply chain rejects). Masking it
would pay a policy that finds such bytes, so it is charged to the artifact like the
resource classes, under the same two conditions (the empty control applying on the same
base shows the base and image are sound); every one is counted (``artifact_apply_failed``)
so a snapshotter bug cannot hide.

**Counterfactual trials** follow the same rule: an ablated artifact P\\b that hangs, OOMs,
floods or fails to apply while the control is healthy (and recurs on retry) has
U(P\\b) = the failure value, so D = U(P) − U(P\\b) exists. This is the missing-observation
rule's reading (tests the control observed and the artifact lost count as failures): the
ablation caused the failure. A block whose removal makes the artifact break (a repair of
damage an earlier turn did) earns positive D, exactly as a repaired deleted module does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eval.integrity.controls import ControlFacts
from eval.integrity.exits import ATTRIBUTABLE_CLASSES, INFRA_CLASSES
from sandbox.trials.trial import OK, OOM, OUTPUT_LIMIT, PIDS, TIMEOUT

FAILURE_CLASSES = tuple(f"artifact_{c}" for c in ATTRIBUTABLE_CLASSES)
"""Outcome classes of a failure charged to the artifact (``artifact_timeout``, ...)."""
UNATTRIBUTED_REASONS = ("no_control", "control_failed", "limits_differ", "not_retried",
                        "retry_infra_error")
"""Why an attributable failure stayed unavailable."""
LIMIT_KEYS = ("timeout_s", "memory", "pids", "cpus", "output_bytes")
"""The limits a control must share with the trial (their ``source`` label may differ)."""
_LIMIT_OF = {TIMEOUT: "timeout_s", OOM: "memory", PIDS: "pids", OUTPUT_LIMIT: "output_bytes"}
"""The limit an attributable class ran out of (none for an apply failure or a cut log)."""


@dataclass(frozen=True)
class Attribution:
    """The rule's answer for one trial.

    Attributes:
        failure_class: ``artifact_<class>`` when charged to the artifact, else None.
        unattributed: a reason of :data:`UNATTRIBUTED_REASONS` when an attributable failure
            stayed unavailable; None otherwise.
        evidence: exit classes of both attempts, their eval seconds, the limit that was hit
            and its value, the limits, and each control's class, seconds and limits.
    """

    failure_class: str | None
    unattributed: str | None = None
    evidence: dict = field(default_factory=dict)


def _same_limits(a: dict | None, b: dict | None) -> bool:
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in LIMIT_KEYS)


def attribute_failure(exit_class: str, *, failed_attempts: list[dict], limits: dict | None,
                      test_s: float | None, controls: list[ControlFacts]) -> Attribution:
    """Apply the module's rule to one trial's result (pure).

    Args:
        exit_class: the trial's final exit class (the retry's, when there was one).
        failed_attempts: :attr:`sandbox.trials.trial.TrialResult.failed_attempts` (the retried first
            attempt(s); each a dict with ``exit_class``, ``test_s``).
        limits: the trial's limits record (``timeout_s``, ``memory``, ``pids``, ``cpus``,
            ``output_bytes``), or None.
        test_s: seconds the final attempt's eval script ran.
        controls: the task's control facts (empty-patch, and gold when one ran); may be
            empty.

    Returns: :class:`Attribution`; ``failure_class`` None for an exit class the rule does not
    cover (``ok``, ``infra_error``: :data:`eval.integrity.exits.EXIT_RULE`) or when a
    condition fails (``unattributed`` says which).
    """
    first = failed_attempts[0] if failed_attempts else None
    cls = first["exit_class"] if first else exit_class
    if cls not in ATTRIBUTABLE_CLASSES or exit_class not in (*ATTRIBUTABLE_CLASSES,
                                                              *INFRA_CLASSES):
        return Attribution(None)
    key = _LIMIT_OF.get(cls)
    evidence = {
        "exit_class": cls, "retry_exit_class": exit_class if first else None,
        "test_s": first["test_s"] if first else test_s,
        "retry_test_s": test_s if first else None,
        "limit": None if key is None or limits is None else {key: limits.get(key)},
        "limits": limits,
        "controls": [{"kind": c.kind, "exit_class": c.exit_class, "test_s": c.test_s,
                      "limits": c.limits} for c in controls]}
    if not controls:
        return Attribution(None, "no_control", evidence)
    if any(c.exit_class != OK for c in controls):
        return Attribution(None, "control_failed", evidence)
    if not all(_same_limits(c.limits, limits) for c in controls):
        return Attribution(None, "limits_differ", evidence)
    if first is None:
        return Attribution(None, "not_retried", evidence)
    if exit_class in INFRA_CLASSES:
        return Attribution(None, "retry_infra_error", evidence)
    return Attribution(f"artifact_{cls}", None, evidence)


__all__ = ["FAILURE_CLASSES", "LIMIT_KEYS", "UNATTRIBUTED_REASONS", "Attribution",
           "attribute_failure"]
