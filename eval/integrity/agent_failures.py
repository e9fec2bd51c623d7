"""The score of an episode the policy broke in its own agent container.

One rule for training (:mod:`ecredit_trl.agent.failures`) and ``eval.run``
(:mod:`eval.evaluation.verification`); see the design page, "Who caused a failure decides the
reward":

* **agent-caused** (``failure_class`` in :data:`AGENT_FAILURE_CLASSES`): the tree grew past
  the rollout's disk budget or a file past the per-file limit (``agent_disk_budget``), or an
  exec failed because the agent's own processes filled its container's pids or memory limit
  while the service was healthy (``agent_pids``, ``agent_oom``: :mod:`sandbox.workspace.health`).
  The episode is a *failure*: resolved False and U = the fixed-list contract's failure
  value (as if no listed test passed: ``0 − 1[P2P non-empty]``), scored like any failing
  rollout, never masked. No factual trial runs: the policy ended its own episode by
  breaking its tool, so what it left behind is not a submission (a trial of the last good
  tree would make breaking the sandbox free: a fix followed by a fork bomb would keep the
  fix's reward), and after ``agent_disk_budget`` the files are gone. No counterfactual
  either, so the credit C is 0.
* **infrastructure** (no ``failure_class``: the container could not start, the service or
  node died, the container was removed or stopped from outside, a snapshot failed): the
  utility is unavailable, the rollout excluded and counted by reason, the reward None.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.workspace.health import AGENT_EXEC_CLASSES

AGENT_FAILURE_CLASSES = ("agent_disk_budget", *AGENT_EXEC_CLASSES)
"""``failure_class`` of an episode ended by the policy in its own container."""


def failure_utility(f2p, p2p) -> float:
    """The fixed-list contract's failure value (design page, "Utility and the
    missing-observation rule"): U as if no listed test passed,
    ``0 / |F2P| − 1[P2P non-empty]``: −1.0 when the task lists PASS_TO_PASS tests, else 0.0.
    (The same value as the attribution rule's for a trial charged to the artifact.)"""
    return 0.0 - (1.0 if len(p2p) else 0.0)


@dataclass(frozen=True)
class AgentFailureVerdict:
    """The verdict of an agent-caused failure: ``resolved`` False, ``utility`` the failure
    value, ``failure_class`` one of :data:`AGENT_FAILURE_CLASSES`."""

    failure_class: str
    utility: float
    resolved: bool = False

    def reward(self, terminal_reward: str) -> float:
        """The terminal reward as for a graded trial: the utility with
        ``terminal_reward="utility"``, else 0.0 (not resolved)."""
        return float(self.utility) if terminal_reward == "utility" else 0.0


def agent_failure_verdict(task, failure_class: str) -> AgentFailureVerdict:
    """The verdict of ``task`` (``FAIL_TO_PASS``, ``PASS_TO_PASS``) for an agent-caused failure.

    Raises: ValueError naming ``failure_class`` when it is not in :data:`AGENT_FAILURE_CLASSES`.
    """
    if failure_class not in AGENT_FAILURE_CLASSES:
        raise ValueError(f"failure_class: expected one of {AGENT_FAILURE_CLASSES}, "
                         f"got {failure_class!r}")
    return AgentFailureVerdict(failure_class,
                               failure_utility(task.FAIL_TO_PASS, task.PASS_TO_PASS))


def agent_failure_slot(task, failure_class: str, evidence: dict | None) -> dict:
    """Slot fields of an evaluation rollout the agent broke (``eval.run``): graded, not
    unknown; resolved False, the failure value, every classification False, no trial."""
    v = agent_failure_verdict(task, failure_class)
    return {"resolved": False, "utility": v.utility, "complete": False, "attributed": False,
            "classification": {"raw": False, "report_binary": False, "strict": False,
                               "unknown": False},
            "unknown_reason": None, "failure_class": failure_class,
            "failure_evidence": evidence, "trial_source": None}


__all__ = ["AGENT_FAILURE_CLASSES", "AgentFailureVerdict", "agent_failure_slot",
           "agent_failure_verdict", "failure_utility"]
