"""Is the sandbox service still there? The trainer's collective health check.

Checked before every generation round and after a round whose trials or episodes failed
for infrastructure reasons (bounded retries with backoff, by the runtime's
``check_available``). When any rank's service stays unreachable, every rank raises
:class:`~ecredit_trl.runs.faults.SandboxUnavailable` before anything of the round is
recorded or applied, and the session ends with an emergency checkpoint of the last
completed step (design page, "Who caused a failure decides the reward": a sandbox failure
is never a reward). The agent containers' own health is :mod:`sandbox.workspace.health`.
"""

from __future__ import annotations

import torch

from ecredit_trl.runs.faults import SandboxUnavailable

INFRA_EPISODE_FAILURES = ("sandbox_setup", "sandbox_error", "exec_garbled")
"""``failure[0]`` of an episode the sandbox service may have caused (when not charged to
the policy): worth a health check after the round."""


def any_rank(accelerator, flag: bool) -> bool:
    """True when ``flag`` is True on any rank (a collective: every rank must call it)."""
    if accelerator.num_processes <= 1:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.gather(t).max().item() > 0)


def round_had_infra_errors(trials, records) -> bool:
    """True when a trial of the round failed as ``infra_error`` or an episode ended on a
    sandbox failure nobody charged to the policy (``trials``: ``(kind, TrialResult)``)."""
    return (any(r.exit_class == "infra_error" for _, r in trials)
            or any(r.failure and r.failure[0] in INFRA_EPISODE_FAILURES and not r.failure_class
                   for r in records))


def probe_sandbox(runtime, *, attempts: int, backoff_s: float) -> tuple[int, str | None]:
    """Health-check this rank's ``runtime`` with its bounded retries (``sandbox_retries``,
    ``sandbox_retry_backoff_s``). A runtime without ``check_available`` is taken as there.

    Returns: ``(retries it needed, error)``; ``error`` is None when the service answered,
    else one line naming the exception.
    """
    probe = getattr(runtime, "check_available", None)
    if probe is None:
        return 0, None
    try:
        return probe(attempts=attempts, backoff_s=backoff_s), None
    except Exception as exc:  # PodmanUnavailable, or anything the client raised
        return 0, f"{type(exc).__name__}: {exc}"


def require_sandbox(accelerator, error: str | None, *, where: str, step: int) -> None:
    """Agree across ranks on this rank's :func:`probe_sandbox` ``error`` (a collective).

    Args:
        where: what the check precedes or follows (in the message).
        step: the optimizer step the round feeds (1-based, in the message).

    Raises: SandboxUnavailable on every rank when any rank's runtime stayed unreachable.
    """
    if any_rank(accelerator, error is not None):
        raise SandboxUnavailable(f"sandbox service unavailable {where} (step {step}): "
                                 f"{error or 'reported by another rank'}")


__all__ = ["INFRA_EPISODE_FAILURES", "any_rank", "probe_sandbox", "require_sandbox",
           "round_had_infra_errors"]
