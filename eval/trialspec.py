"""The verifier trial of a task: :func:`task_trial_spec` (and the cached base tree of a
bundled task's repository that it ships into the sandbox: the agent's checkout, not a
``git archive``; issue 11 §5)."""

from __future__ import annotations

import threading
from pathlib import Path

from eval.tasks import Task

_ARCHIVES: dict[tuple[str, str], bytes] = {}
_ARCHIVE_LOCK = threading.Lock()


def repo_archive(repo_dir: str | Path, commit: str) -> bytes:
    """The agent's starting tree of ``repo_dir`` at ``commit`` as tar bytes
    (:func:`sandbox.basetree.base_tree_tar`: a checkout, not ``git archive``, so export
    attributes and checkout conversions give the same bytes the agent starts from; issue
    11 §5), cached per ``(resolved repo_dir, commit)`` for the life of the process.

    Raises: ValueError naming ``repo_dir``/``base_commit`` when git cannot check it out.
    """
    from sandbox.basetree import base_tree_tar

    key = (str(Path(repo_dir).resolve()), commit)
    with _ARCHIVE_LOCK:
        hit = _ARCHIVES.get(key)
    if hit is not None:
        return hit
    try:
        data = base_tree_tar(key[0], commit)
    except ValueError as exc:
        raise ValueError(f"{exc} (repo_dir {key[0]}, base_commit {commit})") from None
    with _ARCHIVE_LOCK:
        _ARCHIVES[key] = data
    return data


def task_trial_spec(task: Task, artifact: str, trial_id: str, *, timeout_s: float = 600.0,
                    limits=None, labels: dict[str, str] | None = None,
                    swebench_pass: bool | None = None):
    """The :class:`sandbox.TrialSpec` that verifies ``artifact`` (a ``git diff`` from base,
    may be empty) on ``task``.

    ``repo_archive`` is the agent's starting tree of ``task.repo_dir`` at ``base_commit``
    for bundled tasks (:func:`repo_archive`, cached), ``None`` for SWE-bench images that hold
    ``/testbed`` already. ``protected`` is :func:`eval.protection.protected_set`.

    Args:
        timeout_s: wall-clock limit of apply + eval, seconds.
        limits: :class:`sandbox.Limits` (default limits when None).
        swebench_pass: also run the eval script without protection when the artifact touched
            a protected path (for ``resolved_swebench``); default: for tasks whose image
            holds the repository (SWE-bench rows), not for ``repo_dir`` tasks.

    Raises:
        ValueError: the task has no eval script, needs its base branch checked out in the
            image first (``checkout_base``: not supported by the verifier yet), or its
            repository cannot be archived.
    """
    from eval.protection import protected_set
    from sandbox import Limits, TrialSpec

    if not task.eval_script:
        raise ValueError(f"eval_script: task {task.instance_id} has none (its source row had no "
                         "'eval_script'; swebench 5 takes eval scripts from the dataset rows, "
                         "e.g. SWE-bench/SWE-bench_Verified)")
    if task.checkout_base:
        raise ValueError(f"checkout_base: task {task.instance_id} starts from branch "
                         f"{task.base_commit!r} of its image's repository (SWE-smith), and the "
                         "verifier cannot check a branch out before applying the artifact yet")
    archive = repo_archive(task.repo_dir, task.base_commit) if task.repo_dir else None
    return TrialSpec(trial_id=trial_id, image=task.image, eval_script=task.eval_script,
                     artifact=artifact or "", repo_archive=archive, workdir=task.workdir,
                     timeout_s=timeout_s, limits=limits or Limits(),
                     labels={"ecredit.task": task.instance_id[:60], **(labels or {})},
                     protected=protected_set(task),
                     swebench_pass=(task.repo_dir is None) if swebench_pass is None
                     else swebench_pass)
