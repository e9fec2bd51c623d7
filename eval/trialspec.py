"""The verifier trial of a task: :func:`task_trial_spec` (and the cached ``git archive`` of a
bundled task's repository that it ships into the sandbox)."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from eval.tasks import Task

_ARCHIVES: dict[tuple[str, str], bytes] = {}
_ARCHIVE_LOCK = threading.Lock()


def repo_archive(repo_dir: str | Path, commit: str) -> bytes:
    """``git archive --format=tar <commit>`` of ``repo_dir`` (bytes), cached per
    ``(resolved repo_dir, commit)`` for the life of the process.

    Raises: ValueError naming ``repo_dir``/``base_commit`` when git cannot archive it.
    """
    key = (str(Path(repo_dir).resolve()), commit)
    with _ARCHIVE_LOCK:
        hit = _ARCHIVES.get(key)
    if hit is not None:
        return hit
    proc = subprocess.run(["git", "-C", key[0], "archive", "--format=tar", commit],
                          capture_output=True)
    if proc.returncode != 0:
        raise ValueError(f"repo_dir/base_commit: git archive {commit} in {key[0]} failed: "
                         f"{proc.stderr.decode(errors='replace').strip()[:300]}")
    with _ARCHIVE_LOCK:
        _ARCHIVES[key] = proc.stdout
    return proc.stdout


def task_trial_spec(task: Task, artifact: str, trial_id: str, *, timeout_s: float = 600.0,
                    limits=None, labels: dict[str, str] | None = None):
    """The :class:`sandbox.TrialSpec` that verifies ``artifact`` (a ``git diff`` from base,
    may be empty) on ``task``.

    ``repo_archive`` is the ``git archive`` of ``task.repo_dir`` at ``base_commit`` for
    bundled tasks (cached), ``None`` for SWE-bench images that hold ``/testbed`` already.

    Args:
        timeout_s: wall-clock limit of apply + eval, seconds.
        limits: :class:`sandbox.Limits` (default limits when None).

    Raises:
        ValueError: the task has no eval script, or its repository cannot be archived.
    """
    from sandbox import Limits, TrialSpec

    if not task.eval_script:
        raise ValueError(f"eval_script: task {task.instance_id} has none (its source row had no "
                         "'eval_script'; swebench 5 takes eval scripts from the dataset rows, "
                         "e.g. SWE-bench/SWE-bench_Verified)")
    archive = repo_archive(task.repo_dir, task.base_commit) if task.repo_dir else None
    return TrialSpec(trial_id=trial_id, image=task.image, eval_script=task.eval_script,
                     artifact=artifact or "", repo_archive=archive, workdir=task.workdir,
                     timeout_s=timeout_s, limits=limits or Limits(),
                     labels={"ecredit.task": task.instance_id[:60], **(labels or {})})
