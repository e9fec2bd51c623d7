"""The evaluation metrics as ``evaluate`` modules shipped inside the package.

* ``per_rollout_success`` — success = resolved slots / (tasks × n), fixed denominator, unknown
  counted apart (design page, "Evaluation"); used by :func:`eval.evaluation.report.summarize`.
* ``paired_bootstrap`` — task-paired difference a − b and its percentile bootstrap CI; used
  by :mod:`eval.compare` (and through it the study).

Each lives in ``eval/metrics/<name>/<name>.py`` and is loaded with ``evaluate.load`` on that
*local folder*; a bare name is never passed to ``evaluate`` (it would try the Hugging Face
Hub). ``evaluate`` is imported lazily: importing it costs seconds (it imports
``transformers.pipelines``), paid once per process on the first metric call.
"""

from __future__ import annotations

import threading
from pathlib import Path

__all__ = ["METRICS", "MetricInputError", "compute_metric", "load_metric", "metric_path",
           "paired_bootstrap", "per_rollout_success"]

#: Names of the shipped modules (folder = file stem = name).
METRICS = ("per_rollout_success", "paired_bootstrap")

_HERE = Path(__file__).resolve().parent
_cache: dict[str, object] = {}
_lock = threading.Lock()


class MetricInputError(ValueError):
    """Bad input to a metric (the message names the field)."""


def metric_path(name: str) -> Path:
    """The local folder of metric ``name`` (holds ``<name>.py``).

    Raises: ValueError for a name that is not one of :data:`METRICS` (never looked up on a
        hub); FileNotFoundError when the module file is missing from the installation.
    """
    if name not in METRICS:
        raise ValueError(f"metric: {name!r} is not one of {METRICS} (only the modules "
                         "shipped in eval/metrics are loaded, never a hub name)")
    path = _HERE / name
    if not (path / f"{name}.py").is_file():
        raise FileNotFoundError(f"metric {name!r}: {path / (name + '.py')} missing from this "
                                "installation (package data of eval.metrics)")
    return path


def load_metric(name: str):
    """``evaluate.load`` of the shipped module ``name`` from its local folder, cached per
    process (``keep_in_memory=True``: no cache files, no locks).

    Returns: an ``evaluate.Metric`` instance, shared by every caller of this process (its
        ``compute`` is not thread-safe: use :func:`compute_metric` from threads).

    Raises: see :func:`metric_path`.
    """
    with _lock:
        if name not in _cache:
            import evaluate

            _cache[name] = evaluate.load(str(metric_path(name)), keep_in_memory=True)
        return _cache[name]


def compute_metric(name: str, **inputs) -> dict:
    """``load_metric(name).compute(**inputs)`` under a process-wide lock.

    Raises: MetricInputError (a ValueError) for bad inputs, naming the field.
    """
    metric = load_metric(name)
    with _lock:
        try:
            return metric.compute(**inputs)
        except ValueError as exc:
            if isinstance(exc, MetricInputError):
                raise
            raise MetricInputError(str(exc)) from exc


def per_rollout_success(rows, tasks, n: int, *, denominator: int | None = None,
                        ignore_outside: bool = False) -> dict:
    """Per-rollout success of slot rows through the ``per_rollout_success`` module.

    Args:
        rows: one dict per rollout row with ``task_id``, ``rollout_index``, ``resolved`` and
            either ``unknown`` (bool) or ``classification["unknown"]`` (eval.run's slot rows).
        tasks: the split's task ids in split order (the fixed denominator); n: rollouts per
            task (>= 1); denominator: the split's fixed task count (checked when given).
        ignore_outside: rows outside ``tasks × range(n)`` are counted in ``ignored_rows``
            instead of refused.

    Returns: the module's dict (``success``, ``resolved``, ``failed``, ``unknown``,
        ``missing``, ``slots``, ``success_bounds``, ``per_task``, ...).

    Raises: MetricInputError naming the field (``rows[i].resolved``, ``tasks``, ``n``,
        ``task_id``, ``rollout_index``).
    """
    cols: dict[str, list] = {"task_id": [], "rollout_index": [], "resolved": [], "unknown": []}
    for i, r in enumerate(rows):
        for k in ("task_id", "rollout_index", "resolved"):
            if k not in r:
                raise MetricInputError(f"rows[{i}].{k}: missing")
        if "unknown" in r:
            unk = r["unknown"]
        elif isinstance(r.get("classification"), dict) and "unknown" in r["classification"]:
            unk = r["classification"]["unknown"]
        else:
            raise MetricInputError(f"rows[{i}].unknown: missing (nor classification.unknown)")
        try:
            cols["rollout_index"].append(int(r["rollout_index"]))
        except (TypeError, ValueError):
            raise MetricInputError(f"rows[{i}].rollout_index: not an int: "
                                   f"{r['rollout_index']!r}") from None
        cols["task_id"].append(str(r["task_id"]))
        cols["resolved"].append(bool(r["resolved"]))
        cols["unknown"].append(bool(unk))
    return compute_metric("per_rollout_success", **cols, tasks=list(tasks), n=n,
                          denominator=denominator, ignore_outside=ignore_outside)


def paired_bootstrap(a, b, *, n_boot: int = 10000, alpha: float = 0.05, seed: int = 0) -> dict:
    """Task-paired difference ``a − b`` with its percentile bootstrap CI through the
    ``paired_bootstrap`` module.

    Args:
        a, b: task id → per-task figure (e.g. success in [0, 1]); tasks only one side has
            are listed in ``only_in_a`` / ``only_in_b``, never paired.
        n_boot (>= 1), alpha (in (0, 1)), seed: bootstrap settings.

    Returns: ``{"tasks", "diffs", "n_tasks", "mean", "ci", "only_in_a", "only_in_b",
        "n_boot", "alpha", "seed"}`` (``mean``/``ci`` None when nothing is paired).

    Raises: MetricInputError naming ``n_boot``, ``alpha``, ``seed`` or a value that is not a
        finite number.
    """
    import math
    import numbers

    ids = sorted(set(a) | set(b))
    for side, m in (("a", a), ("b", b)):
        for t, v in m.items():
            if not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise MetricInputError(f"{side}[{t!r}]: not a finite number: {v!r}")
    return compute_metric("paired_bootstrap", task_id=ids,
                          a=[float(a[t]) if t in a else None for t in ids],
                          b=[float(b[t]) if t in b else None for t in ids],
                          n_boot=n_boot, alpha=alpha, seed=seed)
