"""Execution: git snapshots + restore, Podman / local runtimes, images, verifier trials.

Knows nothing of training or grading (DESIGN.md §1).
"""

from sandbox.pool import VerifierPool
from sandbox.trial import Limits, TrialResult, TrialSpec

__all__ = ["Limits", "TrialResult", "TrialSpec", "VerifierPool", "make_runtime"]


def make_runtime(kind: str = "podman", *, endpoints: list[str] | None = None,
                 run_id: str | None = None, agent_endpoints: list[str] | None = None):
    """Build a runtime by name: ``"podman"`` or ``"local"`` (never chosen implicitly).
    ``endpoints`` serve verifier trials, ``agent_endpoints`` (local only) agent sessions
    (:class:`sandbox.podman_runtime.PodmanRuntime`).

    Raises: ValueError for any other name or a remote agent endpoint; PodmanUnavailable
    when Podman cannot start.
    """
    if kind == "podman":
        from sandbox.podman_runtime import PodmanRuntime

        return PodmanRuntime(endpoints=endpoints, run_id=run_id,
                             agent_endpoints=agent_endpoints)
    if kind == "local":
        from sandbox.local_runtime import LocalRuntime

        return LocalRuntime(run_id=run_id or "local")
    raise ValueError(f"runtime: expected 'podman' or 'local', got {kind!r}")
