"""The retry policy: which trial exit classes run again, and how many times.

:class:`sandbox.trials.pool.VerifierPool` executes the answer of the policy it is handed
(``retry=``); the decisions are here (design page, "Query bound": every retry is counted):

* an **attributable** failure (:data:`eval.integrity.exits.ATTRIBUTABLE_CLASSES`) runs once
  more under the same spec (``failure_retries``, 0 or 1): the artifact rule charges such a
  failure to the artifact only when it recurs, so a one-off slow or starved node is not
  read as the policy's doing (:mod:`eval.integrity.attribution`). A timeout's retry runs
  under :data:`eval.integrity.attribution.RETRY_TIMEOUT_FACTOR` times its timeout
  (:meth:`RetryPolicy.failure_spec`), so that load cannot explain a second timeout. The
  first attempt stays on record (``failed_attempts``); the result is the retry's;
* an **infrastructure** failure (:data:`eval.integrity.exits.INFRA_CLASSES`) runs again up to
  ``max_retries`` times with backoff, except one a retry cannot fix
  (:data:`NOT_TRANSIENT`: the image lacks the task's base branch);
* anything else (``ok``, or retries spent) is the result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from eval.integrity.attribution import RETRY_TIMEOUT_FACTOR
from eval.integrity.exits import ATTRIBUTABLE_CLASSES, INFRA_CLASSES
from sandbox.trials.pool import RETRY_FAILURE, RETRY_INFRA
from sandbox.trials.trial import CHECKOUT_ERROR, TIMEOUT, TrialSpec

NOT_TRANSIENT = (CHECKOUT_ERROR,)
"""Prefixes of infra errors a retry cannot fix: not retried."""


def decide_retry(exit_class: str, error: str | None, failure_retries_done: int,
                 infra_retries_done: int, *, max_retries: int, failure_retries: int
                 ) -> str | None:
    """Whether a trial attempt runs again (pure).

    Args:
        exit_class: the attempt's exit class; ``error``: its infra error message or None.
        failure_retries_done, infra_retries_done: retries of each kind already run.
        max_retries: infra retries allowed; failure_retries: attributable retries allowed.

    Returns: :data:`sandbox.trials.pool.RETRY_FAILURE`, :data:`~sandbox.trials.pool.RETRY_INFRA`
    or None (keep this attempt).
    """
    if exit_class in ATTRIBUTABLE_CLASSES and failure_retries_done < failure_retries:
        return RETRY_FAILURE
    if (exit_class in INFRA_CLASSES and infra_retries_done < max_retries
            and not (error or "").startswith(NOT_TRANSIENT)):
        return RETRY_INFRA
    return None


@dataclass(frozen=True)
class RetryPolicy:
    """The retry policy as :class:`sandbox.trials.pool.VerifierPool` takes it (``retry=``).

    Attributes:
        max_retries: extra attempts after an ``infra_error`` (≥ 0).
        failure_retries: extra attempts after an attributable failure (0 or 1; 1 = the
            artifact rule's retry).

    Raises: ValueError for negative ``max_retries`` or ``failure_retries`` not 0 or 1.
    """

    max_retries: int = 1
    failure_retries: int = 1

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries: must be >= 0, got {self.max_retries}")
        if self.failure_retries not in (0, 1):
            raise ValueError(f"failure_retries: must be 0 or 1, got {self.failure_retries!r}")

    def failure_spec(self, spec: TrialSpec, result) -> TrialSpec:
        """The spec of a failure retry: ``spec`` with its timeout raised
        :data:`~eval.integrity.attribution.RETRY_TIMEOUT_FACTOR` times when ``result``
        timed out (design page, "Who caused a failure decides the reward"), else ``spec``."""
        if result.exit_class != TIMEOUT:
            return spec
        return replace(spec, timeout_s=spec.timeout_s * RETRY_TIMEOUT_FACTOR)

    def __call__(self, result, failure_retries_done: int, infra_retries_done: int
                 ) -> str | None:
        """:func:`decide_retry` of a :class:`sandbox.trials.trial.TrialResult`."""
        return decide_retry(result.exit_class, result.error, failure_retries_done,
                            infra_retries_done, max_retries=self.max_retries,
                            failure_retries=self.failure_retries)


__all__ = ["NOT_TRANSIENT", "RetryPolicy", "decide_retry"]
