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

**Headroom before charging a timeout.** Wall time is the one limit load stretches (memory,
pids and output are what the code asks for, whatever else the node runs), so a timeout is
the artifact's only when, besides 1 and 2:

3. **the control left headroom**: every control's eval script took at most
   :data:`HEADROOM` (half) of the same timeout; and
4. **the retry ran where load cannot explain it**: under a raised limit,
   :data:`RETRY_TIMEOUT_FACTOR` (twice) the timeout (:class:`eval.integrity.retry.RetryPolicy`
   hands the pool that spec), and it still broke.

Why half and twice: an honest artifact runs the task's tests as the control does, so its
wall time is the control's stretched by the load it met. A control within half the limit
leaves room for the 2x stretch of an oversubscribed node (two busy processes per core)
before an honest artifact reaches the limit, and an honest artifact breaking the doubled
limit on its retry would need a 4x stretch. A control nearer the limit (585 s of 600), or a
retry that did not run under the raised limit, leaves the timeout *unavailable*
(``control_no_headroom``, ``retry_not_raised``); a retry that finished under the raised
limit but past the original one is unavailable too (``retry_over_limit``: it did not break,
yet its log was produced past the limit the rule grades under, so it is not graded).

Otherwise the trial is *unavailable* (utility None, the rollout excluded and counted by
reason): no control, a control that itself failed, limits that differ, no retry, or a retry
that ended ``infra_error``. A retry that ended ``ok`` within the original limits is graded
from its own log (the first failure did not recur; it stays on record).

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
                        "retry_infra_error", "control_no_headroom", "retry_not_raised",
                        "retry_over_limit")
"""Why an attributable failure stayed unavailable."""
HEADROOM = 0.5
"""Share of the timeout a control's eval script may take for a timeout to be charged to the
artifact (module docstring, "Headroom before charging a timeout": room for a 2x stretch)."""
RETRY_TIMEOUT_FACTOR = 2.0
"""The timeout of a timed-out trial's retry, as a multiple of its own (module docstring)."""
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


def _headroom(controls: list[ControlFacts], limits: dict) -> bool:
    """Every control's eval script took at most :data:`HEADROOM` of ``limits["timeout_s"]``
    (a control whose seconds are unknown shows no headroom)."""
    timeout = limits.get("timeout_s")
    return timeout is not None and all(c.test_s is not None and c.test_s <= HEADROOM * timeout
                                       for c in controls)


def _raised(limits: dict, retry_limits: dict | None) -> bool:
    """The retry ran under :data:`RETRY_TIMEOUT_FACTOR` times the timeout (or more) and
    otherwise the same limits."""
    if retry_limits is None or limits.get("timeout_s") is None:
        return False
    same = all(retry_limits.get(k) == limits.get(k) for k in LIMIT_KEYS if k != "timeout_s")
    return same and (retry_limits.get("timeout_s") or 0) >= (
        RETRY_TIMEOUT_FACTOR * limits["timeout_s"] - 1e-9)


def attribute_failure(exit_class: str, *, failed_attempts: list[dict], limits: dict | None,
                      test_s: float | None, controls: list[ControlFacts],
                      retry_limits: dict | None = None) -> Attribution:
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
        retry_limits: the limits record the retry ran under when the retry policy raised
            them (:attr:`sandbox.trials.trial.TrialResult.retry_limits`), else None.

    Returns: :class:`Attribution`; ``failure_class`` None for an exit class the rule does not
    cover (``ok``, ``infra_error``: :data:`eval.integrity.exits.EXIT_RULE`) or when a
    condition fails (``unattributed`` says which). An ``ok`` retry of a timeout that ran
    past the original limit (under the raised one) is ``retry_over_limit``: not graded.
    """
    first = failed_attempts[0] if failed_attempts else None
    cls = first["exit_class"] if first else exit_class
    if (first is not None and exit_class == OK and cls == TIMEOUT and limits is not None
            and retry_limits is not None and test_s is not None
            and test_s > (limits.get("timeout_s") or float("inf"))):
        return Attribution(None, "retry_over_limit", {
            "exit_class": cls, "retry_exit_class": OK, "test_s": first["test_s"],
            "retry_test_s": test_s, "limit": {"timeout_s": limits.get("timeout_s")},
            "limits": limits, "retry_limits": retry_limits, "controls": []})
    if cls not in ATTRIBUTABLE_CLASSES or exit_class not in (*ATTRIBUTABLE_CLASSES,
                                                              *INFRA_CLASSES):
        return Attribution(None)
    key = _LIMIT_OF.get(cls)
    evidence = {
        "exit_class": cls, "retry_exit_class": exit_class if first else None,
        "test_s": first["test_s"] if first else test_s,
        "retry_test_s": test_s if first else None,
        "limit": None if key is None or limits is None else {key: limits.get(key)},
        "limits": limits, "retry_limits": retry_limits,
        "controls": [{"kind": c.kind, "exit_class": c.exit_class, "test_s": c.test_s,
                      "limits": c.limits} for c in controls]}
    if not controls:
        return Attribution(None, "no_control", evidence)
    if any(c.exit_class != OK for c in controls):
        return Attribution(None, "control_failed", evidence)
    if not all(_same_limits(c.limits, limits) for c in controls):
        return Attribution(None, "limits_differ", evidence)
    if cls == TIMEOUT and not _headroom(controls, limits):
        return Attribution(None, "control_no_headroom", {**evidence, "headroom": HEADROOM})
    if first is None:
        return Attribution(None, "not_retried", evidence)
    if exit_class in INFRA_CLASSES:
        return Attribution(None, "retry_infra_error", evidence)
    if cls == TIMEOUT and not _raised(limits, retry_limits):
        return Attribution(None, "retry_not_raised", evidence)
    return Attribution(f"artifact_{cls}", None, evidence)


__all__ = ["FAILURE_CLASSES", "HEADROOM", "LIMIT_KEYS", "RETRY_TIMEOUT_FACTOR",
           "UNATTRIBUTED_REASONS", "Attribution", "attribute_failure"]
