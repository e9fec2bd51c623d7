"""The study report's figures from records already read (pure; no I/O).

:mod:`ecredit_trl.study.report` reads a study folder and hands the rows to these functions:
learning curves from ``ledger.jsonl`` rows, the pilot's signal table from
``trajectories.jsonl`` rows, training costs from ledger rows + receipts, the paired
differences with their bootstrap CI (through :mod:`eval.compare`'s public functions) and the
"Answer" verdicts. ``None`` everywhere means *Pending* (not run / not recorded), never 0.

source: the design page, "Credit arms" (signal quantities) and "Evaluation" (comparison)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

from ecredit_trl.credit.pilot_report import EXCLUSIONS as PILOT_EXCLUSIONS
from ecredit_trl.credit.pilot_report import pilot_table
from eval.compare import bootstrap_ci, ledger_costs, paired_difference
from eval.stats.power import DEFAULT_POWER, mdd

__all__ = ["COST_KEYS", "arm_costs", "learning_curve", "mean_band",
           "pair_row", "run_costs", "signal_table", "verdict"]

COST_KEYS = ("trials_factual", "trials_counterfactual", "trials_control", "generated_tokens",
             "credited_tokens", "queue_wait_s", "round_wall_s", "gpu_hours", "service_hours",
             "steps", "train_wall_s", "cpu_hours", "eval_wall_s", "eval_trials")
"""The keys of :func:`run_costs` / :func:`arm_costs` (each None = Pending)."""
# trajectories.jsonl field → the pilot record field pilot_table reads
_SIGNAL_FIELDS = {"contrast": "D", "resolved": "resolved_P", "shrinkage": "s",
                  "cap_active": "cap_active", "m": "m", "L": "L", "ablation": "ablation"}


def learning_curve(ledger: Sequence[dict], trajectories: Sequence[dict] = ()) -> dict[int, float]:
    """Resolved rate per training step of one run: resolved rollouts / rollouts.

    Args:
        ledger: ``ledger.jsonl`` rows (``step``, ``resolved``, ``rollouts``; one per generation
            round, several rounds of one step are summed).
        trajectories: ``trajectories.jsonl`` rows (``step``, ``resolved``), used only when no
            ledger row carries ``resolved`` and ``rollouts``.

    Returns: step → rate in [0, 1], steps ascending; {} when neither source has a row.
    """
    num: Counter = Counter()
    den: Counter = Counter()
    for r in ledger:
        if isinstance(r.get("step"), int) and isinstance(r.get("resolved"), (int, float)) \
                and isinstance(r.get("rollouts"), (int, float)):
            num[r["step"]] += r["resolved"]
            den[r["step"]] += r["rollouts"]
    if not den:
        for r in trajectories:
            if isinstance(r.get("step"), int):
                num[r["step"]] += bool(r.get("resolved"))
                den[r["step"]] += 1
    return {s: num[s] / den[s] for s in sorted(den) if den[s] > 0}


def mean_band(curves: Mapping[str, Mapping[int, float]]) -> dict:
    """Mean over seeds with the min–max band, per step (pure).

    Args:
        curves: run label → (step → rate). A step counts the runs that reached it.

    Returns: ``{"steps": [...], "mean": [...], "min": [...], "max": [...], "n_runs": [...]}``
        (lists aligned with ``steps``; all empty when no run has a step).
    """
    steps = sorted({s for c in curves.values() for s in c})
    out: dict = {"steps": steps, "mean": [], "min": [], "max": [], "n_runs": []}
    for s in steps:
        xs = [c[s] for c in curves.values() if s in c]
        out["mean"].append(sum(xs) / len(xs))
        out["min"].append(min(xs))
        out["max"].append(max(xs))
        out["n_runs"].append(len(xs))
    return out


def signal_table(rows: Sequence[dict], arm: str) -> dict:
    """The pilot's signal table (:func:`ecredit_trl.credit.pilot_report.pilot_table`) of one
    credit arm's training trajectories.

    Args:
        rows: ``trajectories.jsonl`` rows (``exclusion``, ``contrast``, ``resolved``,
            ``shrinkage``, ``cap_active``, ``m``, ``L``, ``ablation``, ``selected_turn``).
        arm: ``B``, ``M`` or ``E``.

    Returns: the pilot table, with ``excluded`` extended by the training-only exclusion
        reasons (``truncated``, sandbox guards …, counted apart and in ``planned``). Arm E
        never queries D (design page, "Credit arms"): its
        ``nonzero``/``positive``/``negative``/``zero`` are None and
        ``cap_active``/``median_shrinkage`` are its clip factor on A over the
        rollouts whose credit applied (a selected turn with m > 0); ``d_measured`` says which.

    Raises: ValueError naming the row and field when a usable row lacks a field
        (:func:`pilot_table`).
    """
    records, extra = [], Counter()
    for i, r in enumerate(rows):
        ex = r.get("exclusion")
        if ex is not None and ex not in PILOT_EXCLUSIONS:
            extra[str(ex)] += 1
            continue
        rec = {"exclusion": ex, "row": i}
        rec.update({dst: r[src] for src, dst in _SIGNAL_FIELDS.items() if src in r})
        if "resolved_P" in rec:
            rec["resolved_P"] = bool(rec["resolved_P"])
        records.append(rec)
    try:
        table = pilot_table(records, [])
    except ValueError as exc:  # records[i] → the trajectory row (1-based line) it came from
        raise ValueError(re.sub(r"records\[(\d+)\]", lambda m: "trajectories row "
                                f"{records[int(m.group(1))]['row'] + 1}", str(exc))) from None
    table["planned"] += sum(extra.values())
    table["excluded"] = {**table["excluded"], **dict(sorted(extra.items()))}
    table["identities"]["planned_eq_excluded_plus_usable"] = (
        table["planned"] == sum(table["excluded"].values()) + table["usable"])
    table["d_measured"] = arm != "E"
    if arm == "E":
        applied = [r for r in records if r["exclusion"] is None and r.get("m")
                   and r.get("L")]
        for k in ("nonzero", "positive", "negative", "zero", "contrast_unavailable"):
            table[k] = None
        table["failed_original"] = dict.fromkeys(table["failed_original"])
        table["cap_active"] = sum(bool(r.get("cap_active")) for r in applied)
        ss = sorted(float(r["s"]) for r in applied if r.get("s") is not None)
        n = len(ss)
        table["median_shrinkage"] = (None if not n else ss[n // 2] if n % 2
                                     else (ss[n // 2 - 1] + ss[n // 2]) / 2)
    return table


def _sum(rows: Sequence[dict], key: str):
    if not rows or not all(isinstance(r.get(key), (int, float)) for r in rows):
        return None
    return sum(r[key] for r in rows)


def run_costs(ledger: Sequence[dict], *, session_seconds: Sequence[float | None],
              world_size: int | None, eval_results: Sequence[dict] = ()) -> dict:
    """Training (and evaluation) cost of one run (pure).

    Args:
        ledger: its ``ledger.jsonl`` rows.
        session_seconds: per session of the run, the termination receipt's ``seconds``
            (None: the session has no termination receipt yet).
        world_size: accelerate processes (``manifest.json``), None when unknown.
        eval_results: the ``results.json`` dicts of its evaluations (``wall_s``, ``cost``),
            None for an evaluation of the design that has not run (its figures Pending).

    Returns: ``trials_factual``, ``trials_counterfactual``, ``trials_control``,
        ``generated_tokens``, ``credited_tokens``, ``queue_wait_s`` (verifier queue, summed
        over trials), ``round_wall_s`` (generation rounds), ``gpu_hours`` (ledger),
        ``service_hours`` (:func:`eval.compare.ledger_costs`), ``steps``, ``train_wall_s``
        (sessions' seconds), ``cpu_hours`` (= train_wall_s × world_size / 3600, process
        hours), ``eval_wall_s``, ``eval_trials``. Each None (Pending) when a row, session or
        evaluation lacks it.
    """
    base = ledger_costs(list(ledger))
    out = {k: base[k] for k in ("generated_tokens", "trials_factual", "trials_counterfactual",
                                "gpu_hours", "service_hours")}
    out["steps"] = len({r.get("step") for r in ledger}) if ledger else None
    for k, key in (("trials_control", "trials_control"), ("credited_tokens", "credited_tokens"),
                   ("queue_wait_s", "queue_wait_s"), ("round_wall_s", "wall_s")):
        out[k] = _sum(ledger, key)
    secs = list(session_seconds)
    out["train_wall_s"] = sum(secs) if secs and all(s is not None for s in secs) else None
    out["cpu_hours"] = (out["train_wall_s"] * world_size / 3600.0
                        if out["train_wall_s"] is not None and world_size else None)
    ev = list(eval_results)
    walls = [(e or {}).get("wall_s") for e in ev]
    out["eval_wall_s"] = (sum(walls) if ev and all(isinstance(w, (int, float)) for w in walls)
                          else None)
    trials = [((e or {}).get("cost") or {}).get("trials_factual") for e in ev]
    out["eval_trials"] = (sum(trials) if ev and all(isinstance(t, int) for t in trials)
                          else None)
    return out


def arm_costs(per_run: Sequence[dict]) -> dict:
    """Sum of :func:`run_costs` over an arm's runs; a figure is None (Pending) when the arm
    has no run or any run lacks it. ``runs`` = how many runs were summed."""
    out: dict = {"runs": len(per_run)}
    for k in COST_KEYS:
        vals = [c.get(k) for c in per_run]
        out[k] = sum(vals) if vals and all(v is not None for v in vals) else None
    return out


def verdict(ci: Sequence[float] | None) -> str:
    """``"Pending"`` (no CI), ``"positive"`` / ``"negative"`` (the CI excludes 0 on that
    side) or ``"no difference detected"`` (0 inside the CI, bounds included)."""
    if not ci:
        return "Pending"
    lo, hi = ci
    if lo > 0:
        return "positive"
    if hi < 0:
        return "negative"
    return "no difference detected"


def pair_row(name: str, per_a: Mapping[str, float] | None, per_b: Mapping[str, float] | None,
             *, n_boot: int, alpha: float, boot_seed: int, power: float = DEFAULT_POWER,
             **extra) -> dict:
    """One task-paired difference ``per_a − per_b`` with its percentile bootstrap CI
    (:func:`eval.compare.paired_difference`, :func:`eval.compare.bootstrap_ci`) and its
    minimum detectable difference (:func:`eval.stats.power.mdd`, the paired-variance estimate:
    MDD = (z_{1−α/2} + z_power) · sd(d_t) / √T, two-sided α = ``alpha``).

    Args:
        per_a, per_b: task id → per-task success; None = that side was not evaluated
            (Pending).
        n_boot, alpha, boot_seed: the bootstrap (study.json ``bootstrap``: n_boot, alpha, seed).
        power: 1 − β of the MDD (study.json ``bootstrap.power``, default 0.8).
        extra: copied into the row (``a``, ``b``, ``seed``, ``seeds_a`` ...).

    Returns: ``{"name", "n_tasks", "mean", "ci", "verdict", "unpaired", "mdd", "mdd_se",
        "mdd_reason", "power", **extra}``; ``mean``, ``ci``, ``n_tasks`` and ``mdd`` None when
        a side is missing or nothing is paired (``mdd`` also None, with ``mdd_reason``, when
        the differences have no spread).
    """
    row = {"name": name, "n_tasks": None, "mean": None, "ci": None, "unpaired": None,
           "mdd": None, "mdd_se": None, "mdd_reason": "", "power": power, **extra}
    if per_a is not None and per_b is not None:
        pd = paired_difference(per_a, per_b)
        diffs = list(pd["diffs"].values())
        ci = bootstrap_ci(diffs, n_boot=n_boot, alpha=alpha, seed=boot_seed)
        pw = mdd(diffs, alpha=alpha, power=power)
        row.update(n_tasks=len(pd["tasks"]) or None, mean=pd["mean"],
                   ci=list(ci) if ci else None,
                   unpaired=len(pd["only_in_a"]) + len(pd["only_in_b"]),
                   mdd=pw.mdd, mdd_se=pw.se, mdd_reason=pw.reason)
    row["verdict"] = verdict(row["ci"])
    return row


def integrity_counts(ledger: Sequence[dict]) -> dict:
    """Reward integrity of one run from its ``ledger.jsonl`` rows (pure).

    Returns: ``rollouts``, ``masked`` (rollouts whose reward was None: TRL gives them
    advantage 0), ``masked_share`` (masked / rollouts, None without rollouts), ``excluded``
    (reason → rollouts), ``attributed`` (policy failure class → rollouts scored with the
    failure value), ``unattributed`` (reason → factual trials whose failure stayed
    unavailable), ``retries`` (infra), ``failure_retries`` (attribution retries) and
    ``failure_not_reproduced``. Rows of older ledgers lack the attribution keys (counted 0).
    """
    out: dict = {"rollouts": 0, "masked": 0, "excluded": {}, "attributed": {},
                 "unattributed": {}, "retries": 0, "failure_retries": 0,
                 "failure_not_reproduced": 0}
    for r in ledger:
        out["rollouts"] += int(r.get("rollouts", 0))
        out["masked"] += int(r.get("reward_unavailable", 0))
        for k in ("retries", "failure_retries", "failure_not_reproduced"):
            out[k] += int(r.get(k, 0))
        for key, src in (("excluded", "rollouts_excluded"), ("attributed", "failures_attributed"),
                         ("unattributed", "failures_unattributed")):
            for name, n in (r.get(src) or {}).items():
                out[key][name] = out[key].get(name, 0) + int(n)
    out["masked_share"] = out["masked"] / out["rollouts"] if out["rollouts"] else None
    return out


def arm_integrity(per_run: Sequence[dict]) -> dict:
    """:func:`integrity_counts` summed over an arm's runs (``runs`` = how many)."""
    total = integrity_counts([])
    for c in per_run:
        for k in ("rollouts", "masked", "retries", "failure_retries", "failure_not_reproduced"):
            total[k] += c[k]
        for k in ("excluded", "attributed", "unattributed"):
            for name, n in c[k].items():
                total[k][name] = total[k].get(name, 0) + n
    total["masked_share"] = total["masked"] / total["rollouts"] if total["rollouts"] else None
    return {"runs": len(per_run), **total}
