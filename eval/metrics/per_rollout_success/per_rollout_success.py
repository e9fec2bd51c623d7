"""Per-rollout success with a fixed denominator, as an ``evaluate`` module.

Loaded by local path (``eval.metrics.load_metric("per_rollout_success")``, which calls
``evaluate.load`` on this folder); never fetched from a hub. Self-contained on purpose:
``evaluate`` copies this file into its modules cache and imports it from there, so it
imports only numpy, datasets and evaluate.

The rule (design page, "Evaluation"): success = resolved slots / (tasks × n), the mean over
every rollout, never best-of-n. A slot is one (task, rollout index) of ``tasks × range(n)``;
a slot without a row stays in the denominator as not resolved and counts as unknown
(``missing``, the evaluation's ``no_rollout``); a row marked unknown is never resolved and is
counted apart.
"""

from __future__ import annotations

import evaluate
import numpy as np

import datasets

_CITATION = """\
@misc{ecredit_trl_design,
  title = {ecredit-trl design, section 4: Evaluation},
  note  = {Success = mean over every rollout (n per task, fixed task denominator),
           never best-of-n; unknown slots stay in the denominator and are listed apart.}
}
"""

_DESCRIPTION = """\
Per-rollout success of a policy on a split with a fixed denominator. Every (task, rollout
index) slot of ``tasks × range(n)`` counts once: success = resolved slots / (len(tasks) × n).
A slot with no row is not dropped: it counts as not resolved and as unknown (``missing``).
A row marked ``unknown`` is not resolved, whatever its ``resolved`` field says. For a slot
with several rows the last one wins. Never best-of-n.
"""

_KWARGS_DESCRIPTION = """\
Args (one value per rollout row, all the same length):
    task_id (list of str): the row's task.
    rollout_index (list of int): the row's rollout index in 0..n-1.
    resolved (list of bool): the verifier's verdict for the row.
    unknown (list of bool): the outcome is unknown (incomplete report, infra error, ...).
Keyword arguments:
    tasks (list of str): every task of the split in split order: the fixed denominator.
    n (int >= 1): rollouts per task.
    denominator (int, optional): the split's fixed task count; must equal len(tasks).
    ignore_outside (bool, default False): rows outside ``tasks × range(n)`` are counted in
        ``ignored_rows`` instead of raising.
Returns:
    success (float): resolved / slots. resolved, failed, unknown, missing (int): slot
    counts; failed = slots - resolved - unknown; missing slots are included in unknown.
    slots, tasks, n (int). success_bounds ([float, float]): every unknown as failed / as
    resolved. per_task ({task: {n, resolved, unknown, failed, success}}) in split order.
    task_success_distribution ({"k/n": tasks}). ignored_rows, duplicate_rows (int).
Examples:
    >>> m = eval.metrics.load_metric("per_rollout_success")
    >>> m.compute(task_id=["a", "a", "b"], rollout_index=[0, 1, 0], resolved=[True, False, True],
    ...           unknown=[False, False, False], tasks=["a", "b"], n=2)["success"]
    0.5
"""

FEATURES = ("task_id", "rollout_index", "resolved", "unknown")
# slot states in the (tasks, n) grid
_FAILED, _RESOLVED, _UNKNOWN, _MISSING = 0, 1, 2, 3


class PerRolloutInputError(ValueError):
    """Bad input to the per-rollout success metric (the message names the field)."""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class PerRolloutSuccess(evaluate.Metric):
    """``evaluate`` module: per-rollout success, fixed denominator (see the module doc)."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({
                "task_id": datasets.Value("string"),
                "rollout_index": datasets.Value("int64"),
                "resolved": datasets.Value("bool"),
                "unknown": datasets.Value("bool"),
            }),
            # no "numpy" format: datasets' numpy formatter casts float64 to float32
            format=None,
            reference_urls=["docs/design.md, Evaluation (per-rollout mean, never best-of-n)"],
        )

    def compute(self, **kwargs):
        """Check the inputs (naming the field), then ``evaluate.Metric.compute``.

        Raises: PerRolloutInputError for a missing feature, a feature that is not a list,
            features of different lengths, or bad ``tasks`` / ``n`` / ``denominator``.
        """
        check_inputs(kwargs)
        return super().compute(**kwargs)

    def _compute(self, task_id, rollout_index, resolved, unknown, tasks=None, n=None,
                 denominator=None, ignore_outside=False):
        return per_rollout_success(task_id, rollout_index, resolved, unknown, tasks=tasks, n=n,
                                   denominator=denominator, ignore_outside=ignore_outside)


def check_inputs(kwargs: dict) -> None:
    """Validate ``compute`` arguments before ``evaluate`` encodes them (pure).

    Raises: PerRolloutInputError naming the field.
    """
    lengths = {}
    for name in FEATURES:
        if kwargs.get(name) is None:
            raise PerRolloutInputError(f"{name}: missing (one value per rollout row is needed "
                                       f"for each of {', '.join(FEATURES)})")
        try:
            lengths[name] = len(kwargs[name])
        except TypeError:
            raise PerRolloutInputError(f"{name}: expected a list, got "
                                       f"{type(kwargs[name]).__name__}") from None
    if len(set(lengths.values())) > 1:
        raise PerRolloutInputError(f"task_id/rollout_index/resolved/unknown: lengths differ "
                                   f"({lengths})")
    _check_grid(kwargs.get("tasks"), kwargs.get("n"), kwargs.get("denominator"))


def _check_grid(tasks, n, denominator) -> None:
    if tasks is None or isinstance(tasks, (str, bytes)):
        raise PerRolloutInputError("tasks: missing (the split's task ids, the fixed "
                                   "denominator)")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise PerRolloutInputError(f"n: must be an int >= 1, got {n!r}")
    if denominator is not None and len(tasks) != denominator:
        raise PerRolloutInputError(f"tasks: {len(tasks)} given but the split's denominator "
                                   f"is {denominator}")
    if len(set(tasks)) != len(tasks):
        raise PerRolloutInputError("tasks: duplicate task ids")


def per_rollout_success(task_id, rollout_index, resolved, unknown, *, tasks, n,
                        denominator=None, ignore_outside=False) -> dict:
    """The metric's arithmetic (pure, numpy-vectorised); see the module docstring.

    Args:
        task_id, rollout_index, resolved, unknown: arrays of shape (R,), one per row.
        tasks: the split's task ids (T,), in split order; n: rollouts per task.
        denominator: when given, must equal ``len(tasks)``.
        ignore_outside: count rows outside ``tasks × range(n)`` instead of raising.

    Returns: the dict described in ``_KWARGS_DESCRIPTION``.

    Raises: PerRolloutInputError naming ``tasks``, ``n``, ``task_id`` or ``rollout_index``.
    """
    _check_grid(tasks, n, denominator)
    tasks = [str(t) for t in tasks]
    n = int(n)
    n_tasks, slots = len(tasks), len(tasks) * int(n)
    pos = {t: i for i, t in enumerate(tasks)}
    tid = np.fromiter((pos.get(str(t), -1) for t in task_id), dtype=np.int64,
                      count=len(task_id))
    ridx = np.asarray(rollout_index, dtype=np.int64).reshape(-1)
    inside = (tid >= 0) & (ridx >= 0) & (ridx < n)
    if not ignore_outside and not inside.all():
        i = int(np.flatnonzero(~inside)[0])
        field = "task_id" if tid[i] < 0 else "rollout_index"
        what = (f"task {str(task_id[i])!r} is not one of the {n_tasks} tasks" if tid[i] < 0
                else f"rollout_index {int(ridx[i])} is outside range(n={n})")
        raise PerRolloutInputError(
            f"{field}: row {i}: {what}; {int((~inside).sum())} row(s) fall outside the "
            f"{n_tasks} × {n} = {slots} slots of the fixed denominator")
    key = tid[inside] * n + ridx[inside]
    code = np.where(np.asarray(unknown, dtype=bool).reshape(-1)[inside], _UNKNOWN,
                    np.where(np.asarray(resolved, dtype=bool).reshape(-1)[inside],
                             _RESOLVED, _FAILED))
    grid = np.full(slots, _MISSING, dtype=np.int8)
    # the last row of a slot wins: take each key's last occurrence explicitly
    uniq, first_from_end = np.unique(key[::-1], return_index=True)
    grid[uniq] = code[::-1][first_from_end]
    grid = grid.reshape(n_tasks, n)
    res_t = (grid == _RESOLVED).sum(axis=1)
    unk_t = ((grid == _UNKNOWN) | (grid == _MISSING)).sum(axis=1)
    resolved_n, unknown_n = int(res_t.sum()), int(unk_t.sum())
    per_task = {t: {"n": n, "resolved": int(r), "unknown": int(u), "failed": n - int(r) - int(u),
                    "success": int(r) / n}
                for t, r, u in zip(tasks, res_t.tolist(), unk_t.tolist(), strict=True)}
    dist = np.bincount(res_t, minlength=n + 1) if n_tasks else np.zeros(n + 1, dtype=int)
    return {
        "success": resolved_n / slots if slots else None,
        "resolved": resolved_n,
        "failed": slots - resolved_n - unknown_n,
        "unknown": unknown_n,
        "missing": int((grid == _MISSING).sum()),
        "slots": slots, "tasks": n_tasks, "n": n,
        "success_bounds": ([resolved_n / slots, (resolved_n + unknown_n) / slots] if slots
                           else None),
        "per_task": per_task,
        "task_success_distribution": {f"{k}/{n}": int(dist[k]) for k in range(n + 1)},
        "ignored_rows": int((~inside).sum()),
        "duplicate_rows": int(key.size - uniq.size),
    }
