"""The budget that would detect a measured difference: tasks × n × seeds (pure).

:func:`eval.stats.power.mdd` gives the minimum detectable difference of the design that ran, from
the spread s_d of the paired per-task differences d_t = a_t − b_t. To say what *another*
design would detect, s_d² is split into what more rollouts shrink and what only more tasks
shrink (one-way random-effects decomposition of a mean of Bernoulli rollouts):

    s_d² ≈ σ²_between + v_a / k_a + v_b / k_b

* v = the per-rollout variance within a task, mean over tasks of p_t(1 − p_t)·k/(k − 1)
  (p_t the task's rate over its k rollouts; the unbiased Bernoulli variance);
* k_a = n × seeds rollouts per task on side a (an arm pooled over its seeds), k_b = n on the
  baseline's side;
* σ²_between = max(0, s_d² − v_a/k_a − v_b/k_b): how much the true per-task difference
  varies between tasks (only more tasks average it out). When the within-task part exceeds
  s_d² (small samples), v_a and v_b are scaled down by s_d² / (v_a/k_a + v_b/k_b) so the design
  that ran reproduces its measured s_d² (``within_scale`` < 1 says so).

A design with T tasks, n rollouts per task and S seeds then has

    MDD(T, n, S) = (z_{1−α/2} + z_power) · √((σ²_between + v_a/(n·S) + v_b/n) / T)

and detects |Δ| with T(Δ) = ⌈(z_{1−α/2} + z_power)² · (σ²_between + v_a/(n·S) + v_b/n) / Δ²⌉
tasks. Source: the paired-mean sample size of :mod:`eval.stats.power` (Chow, Shao & Wang 2008,
§3.1) with the variance of a two-stage (tasks, rollouts) mean (Cochran, *Sampling
Techniques*, 3rd ed., 1977, §10.2, two-stage sampling with equal cluster sizes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from eval.stats.power import z_factor

__all__ = ["budget_grid", "design_mdd", "variance_parts"]


def _rollout_var(per: Mapping[str, float], tasks: list[str], k: int) -> float:
    if k < 2:
        return 0.0
    return sum(per[t] * (1 - per[t]) for t in tasks) / len(tasks) * k / (k - 1)


def variance_parts(a: Mapping[str, float], b: Mapping[str, float], k_a: int, k_b: int
                   ) -> dict | None:
    """The decomposition of the module docstring for the tasks both sides have.

    Args:
        a, b: task id → rate in [0, 1] over the task's k_a / k_b rollouts.
        k_a, k_b: rollouts per task behind each side's rate (n × seeds; n).

    Returns: ``{"tasks", "sd2", "between", "v_a", "v_b", "k_a", "k_b", "within_scale"}`` or None with
    fewer than 2 paired tasks. Raises: ValueError naming ``k_a``/``k_b`` below 1.
    """
    for name, k in (("k_a", k_a), ("k_b", k_b)):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {k!r}")
    tasks = sorted(set(a) & set(b))
    if len(tasks) < 2:
        return None
    d = [a[t] - b[t] for t in tasks]
    mean = sum(d) / len(d)
    sd2 = sum((x - mean) ** 2 for x in d) / (len(d) - 1)
    v_a, v_b = _rollout_var(a, tasks, k_a), _rollout_var(b, tasks, k_b)
    within = v_a / k_a + v_b / k_b
    scale = sd2 / within if within > sd2 else 1.0
    return {"tasks": len(tasks), "sd2": sd2, "between": max(0.0, sd2 - within),
            "v_a": v_a * scale, "v_b": v_b * scale, "k_a": k_a, "k_b": k_b,
            "within_scale": scale}


def design_mdd(parts: dict, tasks: int, n: int, seeds: int, *, alpha: float = 0.05,
               power: float = 0.8) -> float:
    """MDD(T, n, S) of the module docstring (success units)."""
    var = parts["between"] + parts["v_a"] / (n * seeds) + parts["v_b"] / n
    return z_factor(alpha, power) * math.sqrt(var / tasks)


def budget_grid(parts: dict, delta: float, tasks: int, n: int, seeds: int, *,
                alpha: float = 0.05, power: float = 0.8) -> list[dict]:
    """For n × {1, 2, 4} rollouts and seeds × {1, 2, 4}: the MDD with ``tasks`` tasks and the
    tasks T(|delta|) that would detect the measured difference (None when delta is 0).

    Returns: rows ``{"tasks", "n", "seeds", "mdd", "tasks_needed"}``, the design that ran first.
    """
    z2 = z_factor(alpha, power) ** 2
    rows = []
    for fn in (1, 2, 4):
        for fs in (1, 2, 4):
            nn, ss = n * fn, seeds * fs
            var = parts["between"] + parts["v_a"] / (nn * ss) + parts["v_b"] / nn
            need = math.ceil(z2 * var / delta ** 2) if delta and var > 0 else None
            rows.append({"tasks": tasks, "n": nn, "seeds": ss, "tasks_needed": need,
                         "mdd": design_mdd(parts, tasks, nn, ss, alpha=alpha, power=power)})
    return rows
