"""How an agent episode ends on a failure, and who caused it (the agent rule,
:mod:`eval.integrity.agent`, reached through training's adapter :mod:`ecredit_trl.runs.outcomes`;
design page, "Who caused a failure decides the reward").

:class:`EpisodeFailures` is mixed into :class:`~ecredit_trl.agent.env.SWEAgentEnv`: after
every call its workspace (:meth:`sandbox.workspace.rollout.RolloutWorkspace.after_call`) measures the
tree against the disk limits and snapshots it; this class ends the episode on a failure
(``failure`` = ``(reason, detail)``, first reason wins, the container released at once) and
records who caused it: ``failure_class`` (one of
:data:`eval.integrity.agent.AGENT_FAILURE_CLASSES`, or None for the infrastructure) with
its ``failure_evidence``.

* ``disk_budget`` (tree growth past ``tree_budget_bytes``, a file past ``max_file_bytes``):
  always the policy's (``agent_disk_budget``); the evidence is the limit and the bytes; the
  rollout's files are removed at once.
* ``sandbox_error`` (a tool call raised outside the editor: an exec the runtime could not
  start, an API error): the session's :meth:`~sandbox.workspace.session.PodmanSession.diagnose`
  gathers the evidence and :func:`eval.integrity.agent.classify_exec_failure` decides:
  ``agent_pids`` / ``agent_oom`` when the agent's own processes filled its container's limit
  while the service was healthy, else None.
* ``exec_garbled``: an exec's output came back garbled
  (:class:`sandbox.workspace.session.ExecOutputGarbled`) and it was not re-run (it changed
  the tree) or came back garbled twice: ours, never the policy's (None); a read-only call
  re-run once is counted in ``exec_retries``.
* ``sandbox_setup``, ``snapshot_error``: ours, never the policy's (None).

:func:`apply_episode_failure` turns an ended episode into the trainer's record: excluded
(infrastructure) or scored with the failure value (:mod:`eval.integrity.agent`).
"""

from __future__ import annotations

from ecredit_trl.runs.outcomes import AGENT_DISK_BUDGET, agent_failure_verdict, exec_failure_class
from sandbox.workspace.session import is_garbled

FAILURE_REASONS = ("sandbox_setup", "sandbox_error", "exec_garbled", "snapshot_error",
                   "disk_budget")
"""``failure[0]`` of an ended episode: what happened (``failure_class`` says who caused it)."""


class EpisodeFailures:
    """Failure handling of one rollout's environment (see the module docstring). Uses the
    environment's ``ws`` (its :class:`sandbox.workspace.rollout.RolloutWorkspace`, local or on a Ray
    node: the budget is measured there), ``calls``, ``base_tree``, ``failure``,
    ``failure_class``, ``failure_evidence``."""

    def _fail(self, reason: str, detail: str, failure_class: str | None = None,
              evidence: dict | None = None) -> None:
        """End the episode on ``reason`` (first reason wins) and release the container."""
        if self.failure is None:
            self.failure = (reason, detail)
            self.failure_class, self.failure_evidence = failure_class, evidence
        self._close_session()

    def _exec_failed(self, error: str, exc: BaseException | None = None) -> None:
        """A tool call raised outside the editor: a garbled output ends the episode as
        ``exec_garbled`` (the transport's, no diagnosis); else diagnose before the container
        goes (its cgroup dies with it), then end the episode as ``sandbox_error``."""
        if exc is not None and is_garbled(exc):
            self._fail("exec_garbled", error)
            return
        evidence = None
        if self.ws is not None:
            try:
                evidence = self.ws.diagnose()
            except Exception as exc:  # noqa: BLE001 - no evidence: infrastructure
                evidence = {"diagnose_error": f"{type(exc).__name__}: {exc}"}
        cls = None
        if evidence is not None:  # the verdict is kept with its evidence
            cls = exec_failure_class(evidence)
            evidence = {**evidence, "failure_class": cls}
        self._fail("sandbox_error", error, cls, evidence)

    def _last_tree(self) -> str:
        return self.calls[-1].tree if self.calls else getattr(self, "base_tree", "")

    def _snapshot_after(self) -> str:
        """Measure, then snapshot the tree (:meth:`RolloutWorkspace.after_call`); never
        raises. A failure or an exhausted disk budget ends the episode and keeps the last
        good tree."""
        if self.ws is None:
            return self._last_tree()
        try:
            after = self.ws.after_call()
        except Exception as exc:  # noqa: BLE001 - the workspace itself is gone (a lost node)
            self._fail("snapshot_error", f"{type(exc).__name__}: {exc}")
            return self._last_tree()
        self._generated = after.generated
        self.exec_retries = getattr(self, "exec_retries", 0) + after.exec_retries
        if after.over_budget is not None:  # the policy wrote it: a scored failure
            self._fail("disk_budget", after.over_budget[0], AGENT_DISK_BUDGET,
                       after.over_budget[1])
            return self._last_tree()
        if after.snapshot_error is not None:
            self._fail("snapshot_error", after.snapshot_error)
            return self._last_tree()
        return after.tree if after.tree is not None else self._last_tree()

    def _remove_files(self) -> None:
        """Remove the rollout's working tree and snapshot store now."""
        if self.ws is not None:
            self.ws.remove_files()


def apply_episode_failure(rec, env, task, cfg, truncated: bool):
    """Fill the trainer's record ``rec`` of an episode that ended on ``env.failure``.

    Infrastructure (``env.failure_class`` None): ``exclusion`` = the reason, reward None
    (TRL masks the row). Agent-caused: not excluded (except ``truncated`` with
    ``cfg.mask_truncated_completions``: TRL masks such a row anyway), ``failure_class`` /
    ``failure_evidence`` set, resolved False, ``utility`` = the failure value, ``reward`` per
    ``cfg.terminal_reward`` (:class:`eval.integrity.agent.AgentFailureVerdict`); no trial, so
    no contrast: C = 0, and the reward takes part in the group baseline.

    Returns: ``rec``. Raises: ValueError for an unknown failure class.
    """
    rec.failure = list(env.failure)
    cls = getattr(env, "failure_class", None)
    if cls is None:
        rec.exclusion = env.failure[0]
        return rec
    v = agent_failure_verdict(task, cls)
    rec.failure_class, rec.failure_evidence = cls, getattr(env, "failure_evidence", None)
    rec.resolved, rec.utility = v.resolved, v.utility
    rec.reward = v.reward(cfg.terminal_reward)
    if truncated and cfg.mask_truncated_completions:
        rec.exclusion = "truncated"
    return rec


__all__ = ["FAILURE_REASONS", "EpisodeFailures", "apply_episode_failure"]
