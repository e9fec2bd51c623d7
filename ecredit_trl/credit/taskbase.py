"""Where a task's S_0 lives for host-side replay (the pilot, scripted rollouts).

A bundled task's S_0 is ``base_commit`` of its local ``repo_dir``. An image-held task
(no ``repo_dir``) has S_0 = *the tree at reset*: the image's ``workdir``
(tracked files as they are on disk + untracked files its ``.gitignore`` does not
ignore). The agent environment reads that tree once per image into a bare git store
with S_0 as one root commit (:func:`sandbox.workspace.imagetree.base_cache`); :func:`s0_source`
returns the same store and commit, so a replay clone of it starts from the very tree
the training rollouts start from (same tree id as ``SWEAgentEnv.base_tree``) and every
artifact S_0 → S_K applies in a fresh container of the image as the SWE-bench harness
applies a prediction. Ignored files (build outputs) are not in that clone; snapshots
never record them, so the trees, blocks and artifacts are the same.

source: the design page, "Trajectory and snapshots" (S_0 is the tree at reset)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sandbox.snapshots.snapshot import DEFAULT_SNAPSHOT_IGNORE
from sandbox.workspace.imagetree import base_cache

__all__ = ["s0_source"]


def s0_source(task, cache_dir: str | Path, *,
              ignore: Sequence[str] = DEFAULT_SNAPSHOT_IGNORE) -> tuple[str, str]:
    """``(git repository, commit)`` whose tree is ``task``'s S_0.

    Args:
        task: an :class:`eval.tasks.schema.Task`: ``repo_dir`` + ``base_commit`` (bundled), or
            ``image`` + ``workdir`` (image-held; the image must be present locally).
        cache_dir: where an image's base store is made (once per image id, workdir and
            ignore patterns; the caller owns and removes it).
        ignore: generated-file patterns of the snapshots (the agent context's
            ``snapshot_ignore``; the default is the trainer's).

    Returns: ``(task.repo_dir, task.base_commit)`` for a bundled task; for an image-held
    task the bare store of :func:`sandbox.workspace.imagetree.base_cache` and its S_0 commit
    (read-only for the caller: clone it, e.g. ``trajectory.checkout_base``).

    Raises:
        ValueError: naming ``image`` when the task has neither a ``repo_dir`` nor an image.
        sandbox.workspace.imagetree.ImageTreeError: the image is absent, cannot be mounted, or holds
            no git working tree at ``workdir`` (or, for a ``checkout_base`` task such as
            SWE-smith's, no branch ``base_commit``: S_0 is that branch's tree at reset).
    """
    if getattr(task, "repo_dir", None):
        return str(task.repo_dir), task.base_commit
    image = getattr(task, "image", None)
    if not image:
        raise ValueError(f"image: task {task.instance_id} has neither a repo_dir nor an image")

    branch = task.base_commit if getattr(task, "checkout_base", False) else None
    base = base_cache(image, getattr(task, "workdir", None) or "/testbed", cache_dir,
                      ignore=ignore, checkout=branch)
    return str(base.store), base.commit
