"""Arm comparison: task-paired differences of per-task success with a bootstrap CI.

``python -m eval.compare RUN_OR_RESULTS... [--out DIR --n-boot B --seed S]``

Each argument is an evaluation folder (``python -m eval.run --out``) or its ``results.json``,
optionally labelled ``ARM=PATH`` or ``ARM:SEED=PATH``; without a label the arm and seed come
from the results (the training run's ``config.json``: ``ecredit.arm``, ``ecredit.seed``).

* **Per-task success** of a run = resolved rollouts / n (``results.summary.per_task``). An
  arm's per-task success is the mean over its seeds; a task missing from any of the arm's
  seeds is *incomplete* for that arm: listed, never paired, never silently dropped.
* **Paired differences** over the tasks both arms have: M−B first, then M−O and M−E when
  present (other labels: every arm against the first one given). Mean difference and a
  percentile bootstrap 95% CI over tasks (seeded), computed by the ``paired_bootstrap``
  ``evaluate`` module shipped in :mod:`eval.metrics`; an arm's own CI is the same module
  against a zero baseline (:func:`bootstrap_ci`). Tasks only one side has are listed. A pair
  pools the seeds both arms share (M−E on E's seeds) and states its minimum detectable
  difference at 80% power (:mod:`eval.stats.power`).
* **Per-seed table** with cost columns from the training run's ``ledger.jsonl``: generated
  tokens, factual and counterfactual trials, service hours ((setup_s + verify_s +
  cleanup_s) / 3600), GPU hours. A missing ledger or field prints **Pending**, never 0.
* Plots: ``arm_success.png`` (per-arm success with its 95% CI), ``cost_vs_success.png``.

Outputs with ``--out``: ``compare.json``, ``compare.md`` and the PNGs (written atomically).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eval.metrics import paired_bootstrap
from eval.stats.pairs import STANDARD_PAIRS
from eval.stats.power import mdd

__all__ = [
    "PENDING",
    "RunResult",
    "arm_task_success",
    "bootstrap_ci",
    "compare",
    "comparison_pairs",
    "ledger_costs",
    "load_run",
    "main",
    "paired_difference",
    "render_markdown",
]

#: Printed where a figure is missing (never 0).
PENDING = "Pending"
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
        cost: :func:`ledger_costs` of the training run (values may be None = pending).
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


# ---------------------------------------------------------------------------
# pure statistics
# ---------------------------------------------------------------------------


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


def ledger_costs(rows: Sequence[dict] | None) -> dict:
    """Training cost from ledger rows (pure): sums of ``generated_tokens``,
    ``trials_factual``, ``trials_counterfactual``, ``gpu_hours`` and
    ``service_hours = sum(setup_s + verify_s + cleanup_s) / 3600``, plus ``steps``.

    A figure is None (pending) when there are no rows or any row lacks a field it needs.
    """
    out: dict = dict.fromkeys(COST_FIELDS)
    out["steps"] = None
    if not rows:
        return out
    out["steps"] = len(rows)
    for k in ("generated_tokens", "trials_factual", "trials_counterfactual", "gpu_hours"):
        if all(isinstance(r.get(k), (int, float)) for r in rows):
            s = sum(r[k] for r in rows)
            out[k] = s if k == "gpu_hours" else int(s)
    need = ("setup_s", "verify_s", "cleanup_s")
    if all(all(isinstance(r.get(k), (int, float)) for k in need) for r in rows):
        out["service_hours"] = sum(r["setup_s"] + r["verify_s"] + r["cleanup_s"]
                                   for r in rows) / 3600.0
    return out


def _mean_or_none(xs: Sequence) -> float | None:
    if not xs or any(x is None for x in xs):
        return None
    return sum(xs) / len(xs)


def _pair_sides(runs, arms: dict, a: str, b: str, pooled_seeds: str):
    """Per-task maps and seeds of both sides of ``a − b``: the seeds both share when
    ``pooled_seeds == "shared"`` and they share one (issue 24 §3), else every seed."""
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


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------


def _read_ledger(run_dir: str | None) -> list[dict] | None:
    if not run_dir:
        return None
    p = Path(run_dir) / "ledger.jsonl"
    if not p.is_file():
        return None
    rows = []
    lines = p.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines):  # a crash mid-write: the last line may be cut
                break
            raise CompareInputError(f"{p}:{i}: corrupt ledger line") from None
    return rows


def load_run(arg: str) -> RunResult:
    """Read one ``[ARM[:SEED]=]PATH`` argument (see the module docstring).

    Raises:
        FileNotFoundError: no ``results.json`` at the path.
        CompareInputError: unreadable results, no per-task table, or no arm (neither in the
            label nor in the results).
    """
    label = None
    path = arg
    if "=" in arg and not Path(arg).exists():
        label, path = arg.split("=", 1)
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise FileNotFoundError(f"{arg}: no results.json at {p}")
    try:
        res = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CompareInputError(f"{p}: not valid JSON ({exc.msg})") from None
    per = ((res.get("summary") or {}).get("per_task"))
    if not isinstance(per, dict):
        raise CompareInputError(f"{p}: field 'summary.per_task' missing (not an eval.run "
                                "results.json?)")
    arm, seed = res.get("arm"), res.get("train_seed")
    if label:
        a, _, s = label.partition(":")
        arm = a or arm
        if s:
            try:
                seed = int(s)
            except ValueError:
                raise CompareInputError(f"{arg}: label seed {s!r} is not an int") from None
    if not arm:
        raise CompareInputError(f"{arg}: no arm in {p} (field 'arm'); label it as ARM=PATH "
                                "or ARM:SEED=PATH")
    run_dir = res.get("run_dir")
    summ = res["summary"]
    return RunResult(label=f"{arm}:{seed}" if seed is not None else str(arm), arm=str(arm),
                     seed=seed, path=str(p),
                     per_task={t: float(d["success"]) for t, d in per.items()},
                     success=summ.get("success"), unknown=summ.get("unknown"),
                     split=res.get("split"), n=res.get("n"),
                     tasks_sha256=res.get("tasks_sha256"),
                     cost=ledger_costs(_read_ledger(run_dir)), run_dir=run_dir)


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------


def _f(v, spec: str = ".3f") -> str:
    if v is None:
        return PENDING
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _ci(ci) -> str:
    return "–" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def render_markdown(cmp: dict) -> str:
    """``compare.md`` (pure)."""
    cov = int(round(100 * (1 - cmp["alpha"])))
    lines = ["# Arm comparison", "",
             f"Per-task success = resolved rollouts / n; an arm's per-task success is the mean "
             f"over its seeds. Differences are task-paired; {cov}% percentile bootstrap CI over "
             f"tasks ({cmp['n_boot']} resamples, seed {cmp['seed']}).", "",
             "## Paired differences", "",
             f"| difference | seeds | paired tasks | mean | {cov}% CI | MDD "
             f"({round(100 * cmp.get('power', 0.8))}% power) | "
             "unpaired / incomplete |", "|---|---|---|---|---|---|---|"]
    for p in cmp["pairs"]:
        unp = len(set(p["only_in_a"]) | set(p["only_in_b"]) | set(p["incomplete_a"])
                  | set(p["incomplete_b"]))
        seeds = f"{p['seeds_a']} vs {p['seeds_b']}" + (" (mixed)" if p["mixed_seeds"] else "")
        lines.append(f"| {p['name']} | {seeds} | {p['n_tasks']} | "
                     f"{'–' if p['mean'] is None else format(p['mean'], '+.3f')} | "
                     f"{_ci(p['ci'])} | {'n/a' if p['mdd_reason'] else _f(p['mdd'])} | {unp} |")
    if not cmp["pairs"]:
        lines.append("| – | – | – | – | – | – | – |")
    lines += ["", "## Arms", "", f"| arm | seeds | tasks | success | {cov}% CI | "
              "generated tokens | factual trials | counterfactual trials | service h | GPU h |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for arm, d in cmp["arms"].items():
        c = d["cost"]
        ci = "–" if not d["ci"] else f"[{_pct(d['ci'][0])}, {_pct(d['ci'][1])}]"
        lines.append(f"| {arm} | {len(d['labels'])} | {d['n_tasks']} | {_pct(d['success'])} | "
                     f"{ci} | {_f(c['generated_tokens'], '.0f')} | "
                     f"{_f(c['trials_factual'], '.1f')} | {_f(c['trials_counterfactual'], '.1f')} "
                     f"| {_f(c['service_hours'], '.4f')} | {_f(c['gpu_hours'], '.4f')} |")
    lines += ["", "## Per seed", "", "| run | arm | seed | split | n | tasks | success | unknown "
              "| generated tokens | factual trials | counterfactual trials | service h | GPU h |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in cmp["seeds"]:
        lines.append(f"| {s['label']} | {s['arm']} | {_f(s['seed'])} | {s['split']} | {s['n']} | "
                     f"{s['tasks']} | {_pct(s['success'])} | {_f(s['unknown'])} | "
                     f"{_f(s['generated_tokens'])} | {_f(s['trials_factual'])} | "
                     f"{_f(s['trials_counterfactual'])} | {_f(s['service_hours'], '.4f')} | "
                     f"{_f(s['gpu_hours'], '.4f')} |")
    lines += ["", f"Costs come from each training run's `ledger.jsonl`; **{PENDING}** = no "
              "ledger or a missing field (not zero). Service hours = (setup_s + verify_s + "
              "cleanup_s) / 3600.", ""]
    missing_lines = []
    for p in cmp["pairs"]:
        for key, who in (("only_in_a", p["a"]), ("only_in_b", p["b"])):
            if p[key]:
                missing_lines.append(f"- {p['name']}: only arm {who} has "
                                     f"{len(p[key])} task(s): {', '.join(p[key][:10])}")
    for arm, d in cmp["arms"].items():
        if len(d["labels"]) < 2:  # a one-seed arm's gaps are the "only arm X has" lines
            continue
        for t, labels in list(d["incomplete"].items())[:20]:
            missing_lines.append(f"- arm {arm}: task {t} missing in {', '.join(labels)}")
    if missing_lines or cmp["warnings"]:
        lines += ["## Missing tasks and warnings", ""] + [f"- {w}" for w in cmp["warnings"]]
        lines += missing_lines + [""]
    lines += ["![per-arm success](arm_success.png)", "",
              "![cost vs success](cost_vs_success.png)", ""]
    return "\n".join(lines)


def _save(fig, path: Path) -> None:
    from eval.files import save_figure

    save_figure(fig, path)


def write_plots(cmp: dict, out_dir: str | Path) -> list[str]:
    """``arm_success.png`` (success per arm with CI error bars) and ``cost_vs_success.png``
    (per run: service hours — or generated tokens when service hours are pending — against
    success; runs without any cost figure are drawn at x = 0 with a "pending" note)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    out = Path(out_dir)
    arms = list(cmp["arms"])
    succ = [cmp["arms"][a]["success"] or 0.0 for a in arms]
    err = [[max(0.0, s - (cmp["arms"][a]["ci"] or [s, s])[0]) for a, s in zip(arms, succ, strict=True)],
           [max(0.0, (cmp["arms"][a]["ci"] or [s, s])[1] - s) for a, s in zip(arms, succ, strict=True)]]
    fig, ax = plt.subplots(figsize=(max(3.5, 1.1 * len(arms) + 2), 3.4))
    ax.bar(arms, succ, yerr=err, capsize=6, color="tab:blue")
    ax.set_ylim(0, 1)
    ax.set_ylabel("success (mean over tasks)")
    ax.set_title("per-arm success, 95% bootstrap CI")
    fig.tight_layout()
    _save(fig, out / "arm_success.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.6))
    use_service = all(s["service_hours"] is not None for s in cmp["seeds"])
    key = "service_hours" if use_service else "generated_tokens"
    for s in cmp["seeds"]:
        x = s[key]
        ax.scatter([x if x is not None else 0.0], [s["success"] or 0.0],
                   marker="o" if x is not None else "x")
        ax.annotate(s["label"] + ("" if x is not None else f" ({PENDING})"),
                    (x if x is not None else 0.0, s["success"] or 0.0), fontsize=8,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("service hours" if use_service else "generated tokens (training)")
    ax.set_ylabel("success")
    ax.set_ylim(0, 1)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
    ax.margins(x=0.25)
    ax.set_title("cost vs success (per run)")
    fig.tight_layout()
    _save(fig, out / "cost_vs_success.png")
    plt.close(fig)
    return ["arm_success.png", "cost_vs_success.png"]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI. Exit 0, or 2 on bad input (the message names the argument or path)."""
    ap = argparse.ArgumentParser(prog="python -m eval.compare",
                                 description="Task-paired arm comparison with bootstrap CI.")
    ap.add_argument("runs", nargs="+", help="eval folder or results.json, optionally "
                    "ARM=PATH or ARM:SEED=PATH")
    ap.add_argument("--out", default=None, help="write compare.json/.md and plots here")
    ap.add_argument("--n-boot", type=int, default=10000, help="bootstrap resamples")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = ap.parse_args(argv)
    try:
        runs = [load_run(a) for a in args.runs]
        cmp = compare(runs, n_boot=args.n_boot, seed=args.seed)
    except (CompareInputError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    md = render_markdown(cmp)
    if args.out:
        from eval.files import atomic_write_text, write_json

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "compare.json", cmp)
        atomic_write_text(out / "compare.md", md)
        write_plots(cmp, out)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
