"""The signal pilot's table and report (pure; no I/O): :func:`pilot_table` aggregates the
pilot's records and trials, :func:`render_markdown` writes ``pilot.md``.

The pilot itself (replay, selection, trials) is :mod:`ecredit_trl.credit.pilot`.

source: the design page, "Query bound"
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = ["EXCLUSIONS", "pilot_table", "render_markdown"]

EXCLUSIONS: tuple[str, ...] = ("format_error", "no_eligible_block", "no_original_utility")
"""Exclusion reasons, in the order they are applied (design page, "Exclusion reasons")."""


def _median(xs: Sequence[float]) -> float | None:
    xs = sorted(xs)
    n = len(xs)
    if n == 0:
        return None
    mid = n // 2
    return float(xs[mid]) if n % 2 else (xs[mid - 1] + xs[mid]) / 2.0


def _quantile(xs: Sequence[float], q: float) -> float | None:
    """Linear-interpolation quantile (numpy's default); None for an empty list."""
    xs = sorted(xs)
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def _mean(xs: Sequence[float]) -> float | None:
    return float(sum(xs) / len(xs)) if xs else None


def pilot_table(records: Sequence[dict], trials: Sequence[dict]) -> dict:
    """Aggregate the pilot's records into its table (pure; no I/O).

    Args:
        records: one dict per planned trajectory with at least ``exclusion``
            (None or one of :data:`EXCLUSIONS`) and, when constructed,
            ``ablation`` (``artifact_empty``, ``touched_fraction``,
            ``off_final_diff``); when usable: ``D`` (float or None),
            ``resolved_P`` (bool), ``s`` (float), ``cap_active`` (bool), ``m``,
            ``L`` (tokens).
        trials: one dict per submitted trial with ``role`` (``control``,
            ``factual``, ``counterfactual``), ``task_id``, ``rollout_index``
            (None for controls), ``attempts``, ``service_s`` (seconds),
            ``queue_wait_s``, ``exit_class``; ``cached: true`` for a control
            read from the cache (not run).

    Returns:
        dict with ``planned``, ``excluded`` {format_error, no_eligible_block,
        no_original_utility}, ``usable``, ``nonzero``, ``positive``, ``negative``,
        ``zero``, ``contrast_unavailable``, ``failed_original`` {queried, nonzero,
        positive, negative}, ``cap_active``, ``median_m_over_L``,
        ``median_shrinkage``, ``artifacts_constructed``, ``empty_patch_artifacts``,
        ``median_touched_fraction``, ``off_final_diff``, ``service_time_s``
        {mean, p95} (factual + counterfactual trials run, seconds), ``trials``
        {factual, counterfactual, control, control_cached, retries,
        retries_by_role}, ``exit_classes``, ``query_bound``
        {max_factual_per_rollout, max_counterfactual_per_rollout, ok} and
        ``identities`` {planned_eq_excluded_plus_usable,
        nonzero_eq_positive_plus_negative}. Medians are None when empty.

    Raises:
        ValueError: a record with an unknown exclusion, or a usable record
            without the fields above.

    source: the design page, "Query bound"
    """
    excluded, usable, constructed = _sort_records(records)
    all_signs = _signs(usable)
    failed = [r for r in usable if not r["resolved_P"]]
    f_signs = _signs(failed)
    with_d = [r for r in usable if r["D"] is not None]
    run_fc = [t for t in trials if not t.get("cached")
              and t["role"] in ("factual", "counterfactual")]
    table = {
        "planned": len(records),
        "excluded": excluded,
        "usable": len(usable),
        "nonzero": all_signs["nonzero"],
        "positive": all_signs["positive"],
        "negative": all_signs["negative"],
        "zero": all_signs["zero"],
        "contrast_unavailable": len(usable) - len(with_d),
        "failed_original": {"queried": len(failed), "nonzero": f_signs["nonzero"],
                            "positive": f_signs["positive"], "negative": f_signs["negative"]},
        "cap_active": sum(bool(r["cap_active"]) for r in with_d),
        "median_m_over_L": _median([r["m"] / r["L"] for r in usable if r["L"]]),
        "median_shrinkage": _median([r["s"] for r in with_d]),
        "artifacts_constructed": len(constructed),
        "empty_patch_artifacts": sum(bool(r["ablation"]["artifact_empty"]) for r in constructed),
        "median_touched_fraction": _median([r["ablation"]["touched_fraction"] for r in constructed
                                            if r["ablation"]["touched_fraction"] is not None]),
        "off_final_diff": sum(bool(r["ablation"]["off_final_diff"]) for r in constructed),
        "service_time_s": {"mean": _mean([t["service_s"] for t in run_fc]),
                           "p95": _quantile([t["service_s"] for t in run_fc], 0.95)},
        "queue_wait_s": {"mean": _mean([t.get("queue_wait_s", 0.0) for t in run_fc]),
                         "p95": _quantile([t.get("queue_wait_s", 0.0) for t in run_fc], 0.95)},
        **_trial_counts(trials),
    }
    table["identities"] = {
        "planned_eq_excluded_plus_usable":
            table["planned"] == sum(excluded.values()) + table["usable"],
        "nonzero_eq_positive_plus_negative":
            table["nonzero"] == table["positive"] + table["negative"],
    }
    return table


def _sort_records(records: Sequence[dict]) -> tuple[dict[str, int], list[dict], list[dict]]:
    """(count per exclusion reason, usable records, records with a constructed ablation).

    Raises: ValueError for an unknown exclusion or a usable record lacking a field.
    """
    excluded = dict.fromkeys(EXCLUSIONS, 0)
    usable: list[dict] = []
    constructed: list[dict] = []
    for i, r in enumerate(records):
        ex = r.get("exclusion")
        if ex is not None and ex not in excluded:
            raise ValueError(f"records[{i}].exclusion: unknown reason {ex!r}")
        if r.get("ablation") is not None:
            constructed.append(r)
        if ex is None:
            for k in ("D", "resolved_P", "s", "cap_active", "m", "L"):
                if k not in r:
                    raise ValueError(f"records[{i}]: usable record lacks {k!r}")
            usable.append(r)
        else:
            excluded[ex] += 1
    return excluded, usable, constructed


def _signs(rs: Iterable[dict]) -> dict:
    """Counts of D ≠ 0, > 0, < 0, = 0 among records whose D is available."""
    ds = [r["D"] for r in rs if r["D"] is not None]
    return {"nonzero": sum(d != 0 for d in ds), "positive": sum(d > 0 for d in ds),
            "negative": sum(d < 0 for d in ds), "zero": sum(d == 0 for d in ds)}


def _trial_counts(trials: Sequence[dict]) -> dict:
    """The table's ``trials``, ``exit_classes`` and ``query_bound`` entries: trials by role
    (controls run vs read from the cache), infra retries by role (trials run), exit
    classes of trials run, and the most factual / counterfactual trials of one rollout."""
    run = [t for t in trials if not t.get("cached")]
    per_rollout: dict[str, Counter] = {"factual": Counter(), "counterfactual": Counter()}
    for t in trials:
        if t["role"] in per_rollout:
            per_rollout[t["role"]][(t["task_id"], t["rollout_index"])] += 1
    max_f = max(per_rollout["factual"].values(), default=0)
    max_cf = max(per_rollout["counterfactual"].values(), default=0)
    retries_by_role = {role: sum(max(0, int(t.get("attempts", 1)) - 1)
                                 for t in run if t["role"] == role)
                       for role in ("control", "factual", "counterfactual")}
    return {
        "trials": {
            "factual": sum(t["role"] == "factual" for t in trials),
            "counterfactual": sum(t["role"] == "counterfactual" for t in trials),
            "control": sum(t["role"] == "control" and not t.get("cached") for t in trials),
            "control_cached": sum(t["role"] == "control" and bool(t.get("cached"))
                                  for t in trials),
            "retries": sum(retries_by_role.values()),
            "retries_by_role": retries_by_role,
        },
        "exit_classes": dict(sorted(Counter(t["exit_class"] for t in run).items())),
        "query_bound": {"max_factual_per_rollout": max_f,
                        "max_counterfactual_per_rollout": max_cf,
                        "ok": max_f <= 1 and max_cf <= 1},
    }


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render_markdown(table: dict, meta: dict | None = None) -> str:
    """``pilot.md``: the pilot table as a Markdown document (pure)."""
    meta = meta or {}
    ex = table["excluded"]
    fo = table["failed_original"]
    rows = [
        ("planned trajectories", table["planned"]),
        ("excluded: format_error", ex["format_error"]),
        ("excluded: no_eligible_block", ex["no_eligible_block"]),
        ("excluded: no_original_utility", ex["no_original_utility"]),
        ("usable", table["usable"]),
        ("D ≠ 0 (nonzero)", table["nonzero"]),
        ("D > 0", table["positive"]),
        ("D < 0", table["negative"]),
        ("D = 0", table["zero"]),
        ("D unavailable", table["contrast_unavailable"]),
        ("failed original: queried", fo["queried"]),
        ("failed original: D ≠ 0", fo["nonzero"]),
        ("failed original: D > 0", fo["positive"]),
        ("failed original: D < 0", fo["negative"]),
        ("cap active (s < 1)", table["cap_active"]),
        ("median m/L", table["median_m_over_L"]),
        ("median shrinkage s", table["median_shrinkage"]),
        ("ablated artifacts constructed", table["artifacts_constructed"]),
        ("empty ablated artifacts", table["empty_patch_artifacts"]),
        ("median touched fraction", table["median_touched_fraction"]),
        ("blocks off the final diff", table["off_final_diff"]),
        ("service time mean (s)", table["service_time_s"]["mean"]),
        ("service time p95 (s)", table["service_time_s"]["p95"]),
        ("queue wait mean (s)", table["queue_wait_s"]["mean"]),
        ("trials: factual", table["trials"]["factual"]),
        ("trials: counterfactual", table["trials"]["counterfactual"]),
        ("trials: control (run / cached)",
         f"{table['trials']['control']} / {table['trials']['control_cached']}"),
        ("infra retries", table["trials"]["retries"]),
        ("max counterfactual trials per rollout",
         table["query_bound"]["max_counterfactual_per_rollout"]),
    ]
    ids = table["identities"]
    lines = ["# Signal pilot", ""]
    for k in ("tasks", "trajectories", "seed", "credit_lambda", "credit_cap", "runtime",
              "concurrency", "wall_s"):
        if k in meta:
            lines.append(f"- {k}: `{_fmt(meta[k])}`")
    lines += ["", "| quantity | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in rows]
    lines += [
        "",
        f"- planned = excluded + usable: **{'yes' if ids['planned_eq_excluded_plus_usable'] else 'NO'}**",
        f"- nonzero = positive + negative: **{'yes' if ids['nonzero_eq_positive_plus_negative'] else 'NO'}**",
        f"- query bound (≤ 1 factual, ≤ 1 counterfactual per rollout): "
        f"**{'holds' if table['query_bound']['ok'] else 'VIOLATED'}**",
        "",
        "D = U(P) − U(P\\b); U = f2p_passed/|F2P| − 1[any P2P not passing]. "
        "s, m, L as arm M's shared shrinkage.",
        "",
    ]
    return "\n".join(lines)
