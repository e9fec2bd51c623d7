"""The verifier trial of a task: :func:`task_trial_spec` (and the cached base tree of a
bundled task's repository that it ships into the sandbox: the agent's checkout, not a
``git archive``), with its limits from :func:`trial_limits`."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from eval.tasks.protection import protected_set
from eval.tasks.schema import Task
from sandbox.snapshots.basetree import base_tree_tar
from sandbox.trials.trial import Limits, TrialSpec

HARNESS_TIMEOUT_S = 1800.0
"""swebench's harness (``swebench.harness.run_evaluation``, ``--timeout`` default 1800 s)."""
HARNESS_MIN_MEMORY = "8g"
"""The harness caps no container's memory; ours never defaults below 8 GB for such tasks."""
BUNDLED_TIMEOUT_S = 600.0
"""Bundled tasks' trial timeout in ``eval.run`` / ``eval.controls`` / the pilot (the trainer
passes its own, :data:`ecredit_trl.trainer.trials.TRAIN_BUNDLED_TIMEOUT_S`)."""


@dataclass(frozen=True)
class TrialLimits:
    """The limits one verifier trial runs under, and where each came from.

    Attributes:
        timeout_s: wall-clock limit of apply + eval, seconds.
        memory: memory limit as podman takes it (``"8g"``), no extra swap.
        pids: process limit. cpus: CPUs (fractional allowed).
        source: ``"harness"`` (a SWE-bench-format image task), ``"bundled"``, or ``"row"``
            (the task row's own ``trial_defaults``), with ``+flags`` when an explicit value
            replaced one of them.
    """

    timeout_s: float
    memory: str
    pids: int
    cpus: float
    source: str

    def sandbox_limits(self):
        """The :class:`sandbox.trials.trial.Limits` of these limits."""
        return Limits(memory=self.memory, pids=self.pids, cpus=self.cpus)

    def to_json(self) -> dict:
        return asdict(self)


HARNESS_LIMITS = TrialLimits(HARNESS_TIMEOUT_S, HARNESS_MIN_MEMORY, 4096, 2.0, "harness")
"""SWE-bench-format tasks (official500, holdout100, SWE-Gym, SWE-smith): the harness's
timeout, 8 GB memory, the nproc ulimit as pid limit, 2 CPUs."""
_TRIAL_DEFAULT_KEYS = {"timeout_s": float, "memory": str, "pids": int, "cpus": float}


def trial_limits(task: Task, *, timeout_s: float | None = None, memory: str | None = None,
                 cpus: float | None = None,
                 bundled_timeout_s: float = BUNDLED_TIMEOUT_S) -> TrialLimits:
    """The limits of ``task``'s verifier trials (pure).

    Rule, per field, first match wins:

    1. an explicit value (``timeout_s`` / ``memory`` / ``cpus`` not None: a user flag);
    2. the task row's own ``trial_defaults`` (``task.extra["trial_defaults"]``, a dict with
       any of ``timeout_s``, ``memory``, ``pids``, ``cpus``, set by a loader);
    3. the split: a task whose image holds the repository (``repo_dir`` None: official500,
       holdout100, SWE-Gym, SWE-smith rows) gets :data:`HARNESS_LIMITS` (source: swebench
       harness ``run_evaluation`` timeout 1800 s; it sets no memory cap, so none below 8 GB);
       a bundled task (``repo_dir`` set) keeps today's :class:`sandbox.trials.trial.Limits` defaults
       (2 GB, 1024 pids, 1 CPU) and ``bundled_timeout_s``.

    Raises: ValueError naming ``trial_defaults`` (a bad key or type) or the flag (timeout
    or cpus not > 0).
    """
    if task.repo_dir is None:
        base = HARNESS_LIMITS
    else:
        d = Limits()
        base = TrialLimits(float(bundled_timeout_s), d.memory, d.pids, d.cpus, "bundled")
    row = task.extra.get("trial_defaults") if isinstance(task.extra, dict) else None
    if row is not None:
        where = f"task {task.instance_id}: field 'trial_defaults'"
        if not isinstance(row, dict) or set(row) - set(_TRIAL_DEFAULT_KEYS):
            raise ValueError(f"{where}: expected an object with keys among "
                             f"{sorted(_TRIAL_DEFAULT_KEYS)}, got {row!r:.80}")
        vals = asdict(base)
        for key, typ in _TRIAL_DEFAULT_KEYS.items():
            if key in row:
                if isinstance(row[key], bool) or not isinstance(row[key], (typ, int)):
                    raise ValueError(f"{where}: {key} must be {typ.__name__}, got {row[key]!r}")
                vals[key] = typ(row[key])
        base = TrialLimits(**{**vals, "source": "row"})
    flags = {k: v for k, v in (("timeout_s", timeout_s), ("memory", memory), ("cpus", cpus))
             if v is not None}
    for key in ("timeout_s", "cpus"):
        if key in flags and not flags[key] > 0:
            raise ValueError(f"{key}: must be > 0, got {flags[key]}")
    if not flags:
        return base
    return TrialLimits(**{**asdict(base), **flags,
                          "source": base.source + "+" + ",".join(sorted(flags))})

_ARCHIVES: dict[tuple[str, str], bytes] = {}
_ARCHIVE_LOCK = threading.Lock()


def repo_archive(repo_dir: str | Path, commit: str) -> bytes:
    """The agent's starting tree of ``repo_dir`` at ``commit`` as tar bytes
    (:func:`sandbox.snapshots.basetree.base_tree_tar`: a checkout, not ``git archive``, so export
    attributes and checkout conversions give the same bytes the agent starts from),
    cached per ``(resolved repo_dir, commit)`` for the life of the process.

    Raises: ValueError naming ``repo_dir``/``base_commit`` when git cannot check it out.
    """
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


def task_trial_spec(task: Task, artifact: str, trial_id: str, *, timeout_s: float | None = None,
                    limits=None, labels: dict[str, str] | None = None,
                    swebench_pass: bool | None = None, memory: str | None = None,
                    cpus: float | None = None, bundled_timeout_s: float = BUNDLED_TIMEOUT_S):
    """The :class:`sandbox.trials.trial.TrialSpec` that verifies ``artifact`` (a ``git diff`` from base,
    may be empty) on ``task``.

    ``repo_archive`` is the agent's starting tree of ``task.repo_dir`` at ``base_commit``
    for bundled tasks (:func:`repo_archive`, cached), ``None`` for SWE-bench images that hold
    ``/testbed`` already. ``protected`` is :func:`eval.tasks.protection.protected_set`.

    Args:
        timeout_s, memory, cpus: explicit limits (user flags); None: from the task
            (:func:`trial_limits`, which also takes ``bundled_timeout_s``).
        limits: a whole :class:`sandbox.trials.trial.Limits` instead (wins over the rule's memory /
            pids / CPUs).
        swebench_pass: also run the eval script without protection when the artifact touched
            a protected path (for ``resolved_swebench``); default: for tasks whose image
            holds the repository (SWE-bench rows), not for ``repo_dir`` tasks.

    A task with ``checkout_base`` (SWE-smith: its base is the instance branch
    ``base_commit`` of the image's repository) gets ``checkout=base_commit``: the trial checks
    that branch out in ``workdir`` before applying the artifact, and an image without it
    ends the trial as ``infra_error`` with a ``checkout:`` error (:class:`sandbox.trials.trial.TrialSpec`).

    Raises:
        ValueError: the task has no eval script, has ``checkout_base`` together with a
            ``repo_dir``, a base branch git cannot check out, or its repository cannot be
            archived.
    """
    if not task.eval_script:
        raise ValueError(f"eval_script: task {task.instance_id} has none (its source row had no "
                         "'eval_script'; swebench 5 takes eval scripts from the dataset rows, "
                         "e.g. SWE-bench/SWE-bench_Verified)")
    checkout = None
    if task.checkout_base:
        if task.repo_dir is not None:
            raise ValueError(f"checkout_base: task {task.instance_id} has a repo_dir; a base "
                             "branch is checked out only in an image's repository")
        checkout = task.base_commit
    rule = trial_limits(task, timeout_s=timeout_s, memory=memory, cpus=cpus,
                        bundled_timeout_s=bundled_timeout_s)
    archive = repo_archive(task.repo_dir, task.base_commit) if task.repo_dir else None
    return TrialSpec(trial_id=trial_id, image=task.image, eval_script=task.eval_script,
                     artifact=artifact or "", repo_archive=archive, workdir=task.workdir,
                     timeout_s=rule.timeout_s, limits=limits or rule.sandbox_limits(),
                     limits_source="explicit limits" if limits else rule.source,
                     labels={"ecredit.task": task.instance_id[:60], **(labels or {})},
                     protected=protected_set(task), checkout=checkout,
                     swebench_pass=(task.repo_dir is None) if swebench_pass is None
                     else swebench_pass)
