"""VerifierPool: concurrent verifier trials with queue wait measured apart.

A thread pool over one runtime (which may itself spread trials over several
Podman endpoints). Queue wait (submit → a worker picks the trial up) is kept
apart from service time. Trials that end in ``infra_error`` are retried up to
``max_retries`` times; every retry is counted on the result, never hidden.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from sandbox.trial import TrialResult, TrialSpec

#: infra errors a retry cannot fix (the image lacks the task's base branch): not retried
NOT_TRANSIENT = ("checkout:",)


class VerifierPool:
    """Run trials on ``runtime`` with at most ``max_concurrency`` at once.

    Args:
        runtime: an object with ``run_trial(spec) -> TrialResult``
            (:class:`~sandbox.podman_runtime.PodmanRuntime` or
            :class:`~sandbox.local_runtime.LocalRuntime`).
        max_concurrency: worker threads (≥ 1).
        max_retries: extra attempts after an ``infra_error`` (≥ 0).
        retry_backoff_s: sleep before retry ``i`` is ``retry_backoff_s * 2**(i-1)`` seconds.

    Raises: ValueError for a non-positive concurrency or negative retries.
    """

    def __init__(self, runtime, max_concurrency: int = 2, max_retries: int = 1,
                 retry_backoff_s: float = 0.5) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency: must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries: must be >= 0, got {max_retries}")
        self.runtime = runtime
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self._executor = ThreadPoolExecutor(max_workers=max_concurrency,
                                            thread_name_prefix="verifier")
        self._lock = threading.Lock()
        self.stats = {"submitted": 0, "completed": 0, "retries": 0, "infra_errors": 0}

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
        attempt = 0
        while True:
            attempt += 1
            res = self.runtime.run_trial(spec)
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
