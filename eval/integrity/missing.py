"""The missing-observation rule: when a test report that lacks listed tests still has a utility.

A trial's report is *complete* when every listed FAIL_TO_PASS / PASS_TO_PASS test has an
observed status. An incomplete report gives a utility only when the same task's
empty-patch control observed every listed test under the same parser: then the tests the
artifact lost count as failures (*attributed*: the artifact's doing, since the control shows
the task runs them). Otherwise the utility is unavailable (None), never 0 (design page,
"Utility and the missing-observation rule"). :func:`eval.grading.grader.grade` applies it.
"""

from __future__ import annotations

COMPLETE = "complete"
"""Every listed test observed: the utility is computed from the report."""
ATTRIBUTED = "attributed"
"""Listed tests missing, the control observed them all: missing tests count as failures."""
UNAVAILABLE = "unavailable"
"""Listed tests missing and no complete control: the utility is None."""
READINGS = (COMPLETE, ATTRIBUTED, UNAVAILABLE)


def missing_observations(complete: bool, control_complete: bool | None) -> str:
    """How a report is read (one of :data:`READINGS`).

    Args:
        complete: the trial's report observed every listed test.
        control_complete: the task's empty-patch control report did (None: no control log).
    """
    if complete:
        return COMPLETE
    return ATTRIBUTED if control_complete else UNAVAILABLE


def has_utility(reading: str) -> bool:
    """Whether a report read as ``reading`` gives a utility (not :data:`UNAVAILABLE`)."""
    return reading != UNAVAILABLE


__all__ = ["ATTRIBUTED", "COMPLETE", "READINGS", "UNAVAILABLE", "has_utility",
           "missing_observations"]
