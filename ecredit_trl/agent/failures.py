"""How an agent episode ends on a failure, and who caused it (issue 11 §2, §4; issue 21 §2).

:class:`EpisodeFailures` is mixed into :class:`~ecredit_trl.agent.env.SWEAgentEnv`: it
measures the tree against the disk limits at every snapshot, ends the episode on a failure
(``failure`` = ``(reason, detail)``, first reason wins, the container released at once) and
records who caused it: ``failure_class`` (one of
:data:`eval.agent_failures.AGENT_FAILURE_CLASSES`, or None for the infrastructure) with
its ``failure_evidence``.

* ``disk_budget`` (tree growth past ``tree_budget_bytes``, a file past ``max_file_bytes``):
  always the policy's (``agent_disk_budget``); the evidence is the limit and the bytes; the
  rollout's files are removed at once.
* ``sandbox_error`` (a tool call raised outside the editor: an exec the runtime could not
  start, an API error): the session's :meth:`~sandbox.session.PodmanSession.diagnose`
  decides (:mod:`sandbox.agent_health`): ``agent_pids`` / ``agent_oom`` when the agent's
  own processes filled its container's limit while the service was healthy, else None.
* ``sandbox_setup``, ``snapshot_error``: ours, never the policy's (None).

:func:`apply_episode_failure` turns an ended episode into the trainer's record: excluded
(infrastructure) or scored with the failure value (:mod:`eval.agent_failures`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from eval.agent_failures import agent_failure_verdict
from sandbox.disk import tree_usage
from sandbox.session import close_image_tree

FAILURE_REASONS = ("sandbox_setup", "sandbox_error", "snapshot_error", "disk_budget")
"""``failure[0]`` of an ended episode: what happened (``failure_class`` says who caused it)."""


class EpisodeFailures:
    """Failure handling of one rollout's environment (see the module docstring). Uses the
    environment's ``ctx``, ``task``, ``workdir``, ``image_tree``, ``snapshotter``, ``calls``,
    ``session``, ``usage_at_reset``, ``failure``, ``failure_class``, ``failure_evidence``."""

    def _fail(self, reason: str, detail: str, failure_class: str | None = None,
              evidence: dict | None = None) -> None:
        """End the episode on ``reason`` (first reason wins) and release the container."""
        if self.failure is None:
            self.failure = (reason, detail)
            self.failure_class, self.failure_evidence = failure_class, evidence
        self._close_session()

    def _exec_failed(self, error: str) -> None:
        """A tool call raised outside the editor: diagnose before the container goes (its
        cgroup dies with it), then end the episode as ``sandbox_error``."""
        evidence = None
        diagnose = getattr(self.session, "diagnose", None)
        if diagnose is not None:
            try:
                evidence = diagnose()
            except Exception as exc:  # noqa: BLE001 - no evidence: infrastructure
                evidence = {"failure_class": None,
                            "diagnose_error": f"{type(exc).__name__}: {exc}"}
        cls = (evidence or {}).get("failure_class")
        self._fail("sandbox_error", error, cls, evidence)

    def _stores(self) -> list[Path]:
        """Git object stores and snapshot directories of this rollout (counted in the
        budget; their compressed objects are not held to the per-file limit)."""
        out = []
        if self.workdir is not None:
            out.append(self.workdir / ".git" / "objects")
        store = getattr(self.snapshotter, "_tmp", None)
        if store is not None:
            out.append(Path(store))
        return out

    def _usage(self):
        if self.image_tree is not None:  # the tree container's upper layer: the changes only
            dirs, stores = self.image_tree.usage_dirs(getattr(self.task, "workdir", None) or "/testbed")
            snap = getattr(self.snapshotter, "_tmp", None)
            return tree_usage(dirs, stores + ([Path(snap)] if snap is not None else []))
        return tree_usage([self.workdir] if self.workdir is not None else [], self._stores())

    def _last_tree(self) -> str:
        return self.calls[-1].tree if self.calls else getattr(self, "base_tree", "")

    def _over_budget(self) -> tuple[str, dict] | None:
        """(detail, evidence) when the tree is over a disk limit, else None (bytes)."""
        use = self._usage()
        grown = use.total_bytes - self.usage_at_reset
        ev = {"tree_budget_bytes": self.ctx.tree_budget_bytes, "grown_bytes": grown,
              "max_file_bytes": self.ctx.max_file_bytes, "largest_file_bytes": use.largest_bytes}
        if use.largest_bytes > self.ctx.max_file_bytes:
            ev["largest_path"] = Path(use.largest_path).name
            return (f"file {Path(use.largest_path).name!r} holds {use.largest_bytes} bytes, "
                    f"over the per-file limit of {self.ctx.max_file_bytes}"), ev
        if grown > self.ctx.tree_budget_bytes:
            return (f"the tree grew by {grown} bytes, over the rollout budget of "
                    f"{self.ctx.tree_budget_bytes}"), ev
        return None

    def _snapshot_after(self) -> str:
        """Measure, then snapshot the tree; never raises. A failure or an exhausted disk
        budget ends the episode and keeps the last good tree."""
        if self.snapshotter is None or self.workdir is None:
            return self._last_tree()
        over = self._over_budget()
        if over is not None:  # the policy wrote it: a scored failure (issue 21 §2)
            self._fail("disk_budget", over[0], "agent_disk_budget", over[1])
            self._remove_files()
            return self._last_tree()
        try:
            return self.snapshotter.snapshot()
        except Exception as exc:  # noqa: BLE001 - a rollout's records never stop the run
            self._fail("snapshot_error", f"{type(exc).__name__}: {exc}")
            return self._last_tree()

    def _remove_files(self) -> None:
        """Remove the rollout's working tree and snapshot store now (disk budget)."""
        self._close_session()
        if self.snapshotter is not None:
            self.snapshotter.close()
            self.snapshotter = None
        if self.image_tree is not None:  # removes the tree's container and upper layer
            tree, self.image_tree = self.image_tree, None
            close_image_tree(self.ctx.runtime, tree)
        elif self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def apply_episode_failure(rec, env, task, cfg, truncated: bool):
    """Fill the trainer's record ``rec`` of an episode that ended on ``env.failure``.

    Infrastructure (``env.failure_class`` None): ``exclusion`` = the reason, reward None
    (TRL masks the row). Agent-caused: not excluded (except ``truncated`` with
    ``cfg.mask_truncated_completions``: TRL masks such a row anyway), ``failure_class`` /
    ``failure_evidence`` set, resolved False, ``utility`` = the failure value, ``reward`` per
    ``cfg.terminal_reward`` (:class:`eval.agent_failures.AgentFailureVerdict`); no trial, so
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
