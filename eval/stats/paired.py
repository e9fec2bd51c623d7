"""Arm comparison statistics: task-paired differences of per-task success, bootstrap CIs.

Pure functions over :class:`RunResult` values (what :mod:`eval.stats.inputs` reads from
evaluation folders). The differences and intervals are computed by the ``paired_bootstrap``
``evaluate`` module shipped in :mod:`eval.metrics`; a pair's minimum detectable difference by
:mod:`eval.stats.power` (see the design page, "Evaluation": comparisons). A task only one side
has is listed, never paired; a task missing from some seed of an arm is *incomplete* for that
arm: listed, never paired, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from eval.metrics import paired_bootstrap
from eval.stats.pairs import STANDARD_PAIRS
from eval.stats.power import mdd

__all__ = [
    "COST_FIELDS",
    "STANDARD_PAIRS",
    "CompareInputError",
    "RunResult",
    "arm_task_success",
    "bootstrap_ci",
    "compare",
    "comparison_pairs",
    "paired_difference",
]

#: The training-cost figures a comparison carries per run and per arm
#: (:func:`eval.stats.inputs.ledger_costs`); None = pending.
COST_FIELDS = ("generated_tokens", "trials_factual", "trials_counterfactual", "service_hours",
               "gpu_hours")


class CompareInputError(ValueError):
    """Bad input to a comparison (names the argument, path or field)."""


@dataclass
class RunResult:
    """One evaluated run: its label, per-task success and training cost.

    Attributes:
        label: ``ARM:SEED`` as shown in tables.
        arm, seed: the training arm and seed (seed may be None).
        path: the ``results.json`` read.
        per_task: task id → success in [0, 1] (resolved rollouts / n).
        success: the run's overall success (fixed denominator), unknown: its unknown slots.
        split, n, tasks_sha256: what was evaluated.
        cost: :func:`eval.stats.inputs.ledger_costs` of the training run (values may be None = pending).
    """

    label: str
    arm: str
    seed: int | None
    path: str
    per_task: dict[str, float]
    success: float | None = None
    unknown: int | None = None
    split: str | None = None
    n: int | None = None
    tasks_sha256: str | None = None
    cost: dict = field(default_factory=dict)
    run_dir: str | None = None


def paired_difference(a: Mapping[str, float], b: Mapping[str, float]) -> dict:
    """Task-paired differences ``a[t] - b[t]`` over the tasks both have, computed by the
    ``paired_bootstrap`` ``evaluate`` module (:func:`eval.metrics.paired_bootstrap`).

    Args:
        a, b: task id → per-task success (finite numbers).

    Returns: ``{"tasks": [paired ids, sorted], "diffs": {id: a-b}, "mean": float | None,
        "only_in_a": [...], "only_in_b": [...]}`` (``mean`` None when nothing is paired).

    Raises: ValueError (MetricInputError) naming a value that is not a finite number.
    """
    pb = paired_bootstrap(a, b, n_boot=1)  # the interval is not asked for here
    return {k: pb[k] for k in ("tasks", "diffs", "mean", "only_in_a", "only_in_b")}


def bootstrap_ci(values: Sequence[float], *, n_boot: int = 10000, alpha: float = 0.05,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean of ``values`` (resampling items with replacement),
    computed by the ``paired_bootstrap`` ``evaluate`` module as the difference of
    ``values`` against a zero baseline (bit-identical to resampling ``values`` itself).

    Args:
        values: per-task figures (e.g. paired differences); shape (T,), resampled in the
            given order.
        n_boot: bootstrap resamples (>= 1).
        alpha: 1 - coverage (0.05 → 95%).
        seed: seeds ``numpy.random.default_rng`` (deterministic).

    Returns: ``(lo, hi)``; None for an empty list.

    Raises: ValueError for ``n_boot < 1``, ``alpha`` outside (0, 1) or a value that is not
        a finite number.
    """
    vals = list(values)
    # zero-padded positions as task ids: the module sorts by id, so the order is kept
    width = len(str(len(vals)))
    ids = [f"{i:0{width}d}" for i in range(len(vals))]
    pb = paired_bootstrap(dict(zip(ids, vals, strict=True)), dict.fromkeys(ids, 0.0), n_boot=n_boot,
                          alpha=alpha, seed=seed)
    return tuple(pb["ci"]) if pb["ci"] else None


def arm_task_success(runs: Sequence[RunResult]) -> dict[str, dict]:
    """Per-arm per-task success, mean over the arm's seeds (pure).

    A task is *complete* for an arm when every run (seed) of the arm has it; only complete
    tasks get a per-task mean. Others are listed in ``incomplete`` with the labels that lack
    them.

    Returns: arm → ``{"labels": [...], "seeds": [...], "per_task": {id: mean},
        "incomplete": {id: [labels missing it]}, "success": mean over complete tasks or None}``.
    """
    arms: dict[str, list[RunResult]] = {}
    for r in runs:
        arms.setdefault(r.arm, []).append(r)
    universe = sorted({t for r in runs for t in r.per_task})
    out = {}
    for arm, rs in arms.items():
        per_task, incomplete = {}, {}
        for t in universe:
            lacking = [r.label for r in rs if t not in r.per_task]
            if lacking:  # some run (of any arm) has it, so this arm is missing it
                incomplete[t] = lacking
                continue
            per_task[t] = sum(r.per_task[t] for r in rs) / len(rs)
        out[arm] = {"labels": [r.label for r in rs], "seeds": [r.seed for r in rs],
                    "per_task": per_task, "incomplete": incomplete,
                    "success": (sum(per_task.values()) / len(per_task)) if per_task else None}
    return out


def comparison_pairs(arms: Sequence[str]) -> list[tuple[str, str]]:
    """Which differences to report, in order: M−B, M−O, M−E when both arms are present;
    when none is, every other arm against the first given."""
    present = set(arms)
    pairs = [(a, b) for a, b in STANDARD_PAIRS if a in present and b in present]
    if not pairs and len(arms) > 1:
        pairs = [(a, arms[0]) for a in arms[1:]]
    return pairs


def _mean_or_none(xs: Sequence) -> float | None:
    if not xs or any(x is None for x in xs):
        return None
    return sum(xs) / len(xs)


def _pair_sides(runs, arms: dict, a: str, b: str, pooled_seeds: str):
    """Per-task maps and seeds of both sides of ``a − b``: the seeds both share when
    ``pooled_seeds == "shared"`` and they share one (M−E on E's seeds when M has more),
    else every seed."""
    sa = sorted({r.seed for r in runs if r.arm == a}, key=str)
    sb = sorted({r.seed for r in runs if r.arm == b}, key=str)
    common = sorted(set(sa) & set(sb), key=str)
    if pooled_seeds == "shared" and common and None not in common and (sa, sb) != (common,) * 2:
        pick = [r for r in runs if r.arm in (a, b) and r.seed in common]
        sub = arm_task_success(pick)
        return sub[a]["per_task"], sub[b]["per_task"], common, common
    return arms[a]["per_task"], arms[b]["per_task"], sa, sb


def compare(runs: Sequence[RunResult], *, n_boot: int = 10000, seed: int = 0,
            alpha: float = 0.05, power: float = 0.8, pooled_seeds: str = "shared") -> dict:
    """The whole comparison (pure; see the module docstring). A pair pools the seeds both
    arms share (``pooled_seeds="shared"``; ``"all"``: every seed) and carries its minimum
    detectable difference at ``power`` (:func:`eval.stats.power.mdd`, two-sided ``alpha``).

    Returns: ``{"arms": {arm: {... , "ci": [lo, hi] | None, "cost": {mean over seeds |
        None}}}, "pairs": [{"a", "b", "name", "n_tasks", "mean", "ci", "diffs",
        "only_in_a", "only_in_b", "incomplete_a", "incomplete_b"}], "seeds": [per-run rows],
        "warnings": [...]}``.

    Raises: CompareInputError when two runs share a label.
    """
    labels = [r.label for r in runs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise CompareInputError(f"runs: label(s) {dup} given twice (label as ARM:SEED=PATH)")
    arms = arm_task_success(runs)
    warnings = []
    shas = {r.tasks_sha256 for r in runs if r.tasks_sha256}
    if len(shas) > 1:
        warnings.append(f"runs were evaluated on {len(shas)} different task lists; pairing is "
                        "by task id")
    ns = {r.n for r in runs if r.n}
    if len(ns) > 1:
        warnings.append(f"runs used different n (rollouts per task): {sorted(ns)}")
    for arm, d in arms.items():
        vals = list(d["per_task"].values())
        d["ci"] = list(bootstrap_ci(vals, n_boot=n_boot, seed=seed, alpha=alpha) or []) or None
        rs = [r for r in runs if r.arm == arm]
        d["cost"] = {k: _mean_or_none([r.cost.get(k) for r in rs]) for k in COST_FIELDS}
        d["n_tasks"] = len(vals)
        if d["incomplete"]:
            warnings.append(f"arm {arm}: {len(d['incomplete'])} task(s) missing in some run "
                            f"({', '.join(list(d['incomplete'])[:5])}) — not paired")
    pairs = []
    for a, b in comparison_pairs(list(arms)):
        pa, pb, sa, sb = _pair_sides(runs, arms, a, b, pooled_seeds)
        pd = paired_bootstrap(pa, pb, n_boot=n_boot, seed=seed, alpha=alpha)
        pw = mdd(list(pd["diffs"].values()), alpha=alpha, power=power)
        pairs.append({"a": a, "b": b, "name": f"{a}−{b}", "n_tasks": pd["n_tasks"],
                      "mean": pd["mean"], "ci": pd["ci"], "mdd": pw.mdd,
                      "mdd_reason": pw.reason, "seeds_a": sa, "seeds_b": sb,
                      "mixed_seeds": sa != sb,
                      "diffs": pd["diffs"], "only_in_a": pd["only_in_a"],
                      "only_in_b": pd["only_in_b"],
                      "incomplete_a": sorted(arms[a]["incomplete"]),
                      "incomplete_b": sorted(arms[b]["incomplete"])})
    seeds = [{"label": r.label, "arm": r.arm, "seed": r.seed, "split": r.split, "n": r.n,
              "tasks": len(r.per_task), "success": r.success, "unknown": r.unknown,
              "path": r.path, **{k: r.cost.get(k) for k in COST_FIELDS}} for r in runs]
    return {"arms": arms, "pairs": pairs, "seeds": seeds, "warnings": warnings,
            "n_boot": n_boot, "seed": seed, "alpha": alpha, "power": power,
            "pooled_seeds": pooled_seeds}
