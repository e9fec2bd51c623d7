"""VerifierPool: concurrent verifier trials with queue wait measured apart.

A thread pool over one runtime (which may itself spread trials over several
Podman endpoints). Queue wait (submit → a worker picks the trial up) is kept
apart from service time. Trials that end in ``infra_error`` are retried up to
``max_retries`` times; every retry is counted on the result, never hidden.

A trial that ran out of one of its limits or whose artifact did not apply
(:data:`sandbox.trials.trial.ATTRIBUTABLE_CLASSES`: timeout, OOM kill, pids, output, apply failure)
is run once more (``failure_retries``) under the same spec:
the attribution rule (:func:`eval.integrity.attribution.attribute_failure`) charges such a
failure to the artifact only when it recurs, so a one-off slow or starved node is not read
as the policy's doing. The earlier attempt is kept in ``failed_attempts``; the result
returned is the retry's (graded normally when the retry ended ``ok``). Failure retries are
counted apart from infra retries (``stats["failure_retries"]``, design page "Query bound").
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from sandbox.trials.trial import ATTRIBUTABLE_CLASSES, TrialResult, TrialSpec

#: infra errors a retry cannot fix (the image lacks the task's base branch): not retried
NOT_TRANSIENT = ("checkout:",)


class VerifierPool:
    """Run trials on ``runtime`` with at most ``max_concurrency`` at once.

    Args:
        runtime: an object with ``run_trial(spec) -> TrialResult``
            (:class:`~sandbox.runtimes.podman_runtime.PodmanRuntime` or
            :class:`~sandbox.runtimes.local_runtime.LocalRuntime`).
        max_concurrency: worker threads (≥ 1).
        max_retries: extra attempts after an ``infra_error`` (≥ 0).
        retry_backoff_s: sleep before retry ``i`` is ``retry_backoff_s * 2**(i-1)`` seconds.
        failure_retries: extra attempts after a :data:`~sandbox.trials.trial.ATTRIBUTABLE_CLASSES`
            failure (0 or 1; 1 = the attribution rule's retry).

    Raises: ValueError for a non-positive concurrency or negative retries.
    """

    def __init__(self, runtime, max_concurrency: int = 2, max_retries: int = 1,
                 retry_backoff_s: float = 0.5, failure_retries: int = 1) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency: must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries: must be >= 0, got {max_retries}")
        if failure_retries not in (0, 1):
            raise ValueError(f"failure_retries: must be 0 or 1, got {failure_retries!r}")
        self.runtime = runtime
        self.max_retries = max_retries
        self.failure_retries = failure_retries
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
        while True:
            attempt += 1
            res = self.runtime.run_trial(spec)
            if res.exit_class in ATTRIBUTABLE_CLASSES and len(failed) < self.failure_retries:
                failed.append(res.attempt_summary())
                with self._lock:
                    self.stats["failure_retries"] += 1
                attempt -= 1  # not an infra retry: counted apart
                continue
            if (res.exit_class != "infra_error" or attempt > self.max_retries
                    or (res.error or "").startswith(NOT_TRANSIENT)):
                break
            errors.append(res.error or "infra_error")
            with self._lock:
                self.stats["retries"] += 1
            time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
        # a runtime may report its own queueing (the ray backend's cluster-wide cap)
        res.queue_wait_s = wait + res.queue_wait_s
        res.limits = spec.limits_record()
        res.attempts = attempt
        res.retried_errors = errors
        res.failed_attempts = failed
        with self._lock:
            self.stats["completed"] += 1
            if res.exit_class == "infra_error":
                self.stats["infra_errors"] += 1
        return res

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
