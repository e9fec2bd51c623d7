"""Comparison rendering: ``compare.md`` and the figures ``arm_success.png``,
``cost_vs_success.png`` from a :func:`eval.stats.paired.compare` dict.

A missing figure prints :data:`PENDING`, never 0.
"""

from __future__ import annotations

from pathlib import Path

from eval.files import save_figure

__all__ = ["PENDING", "render_markdown", "write_plots"]

#: Printed where a figure is missing (never 0).
PENDING = "Pending"


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


def write_plots(cmp: dict, out_dir: str | Path) -> list[str]:
    """``arm_success.png`` (success per arm with CI error bars) and ``cost_vs_success.png``
    (per run: service hours — or generated tokens when service hours are pending — against
    success; runs without any cost figure are drawn at x = 0 with a "pending" note)."""
    # start-up cost: matplotlib loads only when figures are drawn, not for --help,
    # the markdown or the study's tables; Agg is chosen before pyplot is imported
    import matplotlib  # start-up cost: see above

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # start-up cost: see above
    import matplotlib.ticker  # start-up cost: see above

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
    save_figure(fig, out / "arm_success.png")
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
    save_figure(fig, out / "cost_vs_success.png")
    plt.close(fig)
    return ["arm_success.png", "cost_vs_success.png"]
