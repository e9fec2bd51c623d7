"""VerifierPool: concurrent verifier trials with queue wait measured apart.

A thread pool over one runtime (which may itself spread trials over several
Podman endpoints). Queue wait (submit → a worker picks the trial up) is kept
apart from service time.

The pool runs a trial again only when its ``retry`` policy says so; it decides nothing
itself. After every attempt it asks ``retry(result, failure_retries_done, infra_retries_done)``
and executes the answer:

* :data:`RETRY_FAILURE`: run once more at once, under the spec the policy's optional
  ``failure_spec(spec, result)`` gives (else the same spec; the retry's limits are then
  kept in ``retry_limits``); the attempt is kept in
  ``failed_attempts`` (:meth:`~sandbox.trials.trial.TrialResult.attempt_summary`) and counted
  in ``stats["failure_retries"]``, not in ``attempts``;
* :data:`RETRY_INFRA`: run once more after a backoff; the error is kept in
  ``retried_errors`` and counted in ``attempts`` and ``stats["retries"]``;
* None: the attempt is the result.

Every retry is counted on the result, never hidden. The default, :func:`no_retry`, never
retries; the policy that training, the pilot and evaluation use (which classes, how many
times) is :class:`eval.integrity.retry.RetryPolicy` (design page, "Query bound").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from sandbox.trials.trial import INFRA_ERROR, TrialResult, TrialSpec

RETRY_FAILURE = "failure"
"""A retry answer: run the trial again and keep this attempt in ``failed_attempts``."""
RETRY_INFRA = "infra"
"""A retry answer: run the trial again after a backoff, counted in ``attempts``."""
Retry = Callable[[TrialResult, int, int], "str | None"]
"""``retry(result, failure_retries_done, infra_retries_done)`` → :data:`RETRY_FAILURE`,
:data:`RETRY_INFRA` or None (keep this result)."""


def no_retry(result: TrialResult, failure_retries_done: int, infra_retries_done: int) -> None:
    """The pool's default :data:`Retry`: every first attempt is the result."""
    return None


class VerifierPool:
    """Run trials on ``runtime`` with at most ``max_concurrency`` at once.

    Args:
        runtime: an object with ``run_trial(spec) -> TrialResult``
            (:class:`~sandbox.runtimes.podman_runtime.PodmanRuntime` or
            :class:`~sandbox.runtimes.local_runtime.LocalRuntime`).
        max_concurrency: worker threads (≥ 1).
        retry: the :data:`Retry` policy to execute (default :func:`no_retry`; training,
            the pilot and evaluation pass :class:`eval.integrity.retry.RetryPolicy`).
        retry_backoff_s: sleep before infra retry ``i`` is ``retry_backoff_s * 2**(i-1)``
            seconds.

    Raises: ValueError for a non-positive concurrency; TypeError for a ``retry`` that is
    not callable.
    """

    def __init__(self, runtime, max_concurrency: int = 2, *, retry: Retry = no_retry,
                 retry_backoff_s: float = 0.5) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency: must be >= 1, got {max_concurrency}")
        if not callable(retry):
            raise TypeError(f"retry: expected a callable retry policy, got {retry!r}")
        self.runtime = runtime
        self.retry = retry
        self.retry_backoff_s = retry_backoff_s
        self._executor = ThreadPoolExecutor(max_workers=max_concurrency,
                                            thread_name_prefix="verifier")
        self._lock = threading.Lock()
        self.stats = {"submitted": 0, "completed": 0, "retries": 0, "infra_errors": 0,
                      "failure_retries": 0}

    def submit(self, spec: TrialSpec) -> Future:
        """Queue one trial; the future resolves to its :class:`TrialResult`."""
        submitted = time.monotonic()
        with self._lock:
            self.stats["submitted"] += 1
        return self._executor.submit(self._run, spec, submitted)

    def map(self, specs: list[TrialSpec]) -> list[TrialResult]:
        """Run ``specs`` concurrently; results in the same order."""
        futures = [self.submit(s) for s in specs]
        return [f.result() for f in futures]

    def _run(self, spec: TrialSpec, submitted: float) -> TrialResult:
        wait = time.monotonic() - submitted
        errors: list[str] = []
        failed: list[dict] = []
        attempt = 0
        run_spec = spec
        reshape = getattr(self.retry, "failure_spec", None)
        while True:
            attempt += 1
            res = self.runtime.run_trial(run_spec)
            action = self.retry(res, len(failed), attempt - 1)
            if action == RETRY_FAILURE:
                failed.append(res.attempt_summary())
                with self._lock:
                    self.stats["failure_retries"] += 1
                attempt -= 1  # not an infra retry: counted apart
                if reshape is not None:  # e.g. a raised timeout (the policy's decision)
                    run_spec = reshape(spec, res)
                continue
            if action != RETRY_INFRA:
                break
            errors.append(res.error or INFRA_ERROR)
            with self._lock:
                self.stats["retries"] += 1
            time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
        # a runtime may report its own queueing (the ray backend's cluster-wide cap)
        res.queue_wait_s = wait + res.queue_wait_s
        res.limits = spec.limits_record()
        res.retry_limits = run_spec.limits_record() if run_spec is not spec else None
        res.attempts = attempt
        res.retried_errors = errors
        res.failed_attempts = failed
        with self._lock:
            self.stats["completed"] += 1
            if res.exit_class == INFRA_ERROR:
                self.stats["infra_errors"] += 1
        return res

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
