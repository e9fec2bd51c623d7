"""``report.md`` section (h) and ``harmful_curve.png``: the positive control.

Pure rendering of the ``control`` dict of :func:`ecredit_trl.study.report_control.control_section`
(None figures print **Pending**); the PNG is written atomically (:func:`eval.files.save_figure`).
"""

from __future__ import annotations

from pathlib import Path

from eval.files import save_figure

__all__ = ["control_answer", "control_lines", "write_control_plot"]

PENDING = "Pending"
METRICS = (("harmful_block_rate", "harmful-block rate"), ("resolved_rate", "resolved rate"),
           ("edited_rate", "edited rate (nonempty artifact)"))


def _f(v) -> str:
    return PENDING if v is None else f"{v:.3f}"


def _s(v) -> str:
    return PENDING if v is None else f"{v:+.3f}"


def _ci(ci) -> str:
    return PENDING if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _mdd(d: dict) -> str:
    if d.get("mdd") is not None:
        return f"{d['mdd']:.3f}"
    return "n/a (no spread)" if d.get("mdd_reason") and d.get("n_tasks") else PENDING


def _budget(d: dict) -> str:
    if d.get("tasks_needed") is None:
        return "n/a" if d.get("mean") is not None else PENDING
    return str(d["tasks_needed"])


def control_answer(report: dict) -> list[str]:
    """Answer lines of the control: per split and metric, each arm − baseline whose CI
    excludes 0, or that none did (with the budget that would detect the measured one)."""
    ctl = report.get("control")
    if not ctl:
        return []
    lines = []
    for split, sec in ctl["splits"].items():
        parts = []
        for key, label in METRICS:
            for d in sec[key]["differences"]:
                if d["verdict"] == "Pending" or not d["name"].endswith("baseline"):
                    continue
                hit = d["verdict"] in ("positive", "negative")
                tail = "detected (CI excludes 0)" if hit else f"not detected; MDD {_mdd(d)}"
                if not hit and d.get("tasks_needed") is not None:
                    tail += (f", {d['tasks_needed']} paired tasks would detect the measured "
                             "difference at this spread")
                parts.append(f"{label} **{d['name']}** = {_s(d['mean'])} {_ci(d['ci'])} over "
                             f"{d['n_tasks']} harmful tasks — {tail}")
        if parts:
            lines.append(f"- positive control, `{split}`: " + "; ".join(parts) + ".")
    return lines


def control_lines(report: dict) -> list[str]:
    """Section (h) of ``report.md`` (empty when the study has no positive control)."""
    ctl = report.get("control")
    if not ctl:
        return []
    b = report["study"]["bootstrap"]
    cov = int(round(100 * (1 - float(b["alpha"]))))
    pw = int(round(100 * float(b.get("power", 0.8))))
    lines = ["## (h) Positive control: the harmful block", "",
             f"The warm start's demonstrations of {len(ctl['tasks'])} tasks (of "
             f"{ctl['screened']} with a screened harmful edit) add, after the fix, `return None` "
             "below the `def` of a function a PASS_TO_PASS test exercises: an eligible block "
             "with D < 0 by construction (screened: gold + block not resolved with a "
             "PASS_TO_PASS test failing, gold alone resolved, real verifier trials). The "
             "harmful-block rate is the share of rollouts whose final artifact's diff adds "
             "that line below that `def` in that file (`eval.tasks.harmful`, by path and content, "
             "never a label); resolved rate on the same tasks; edited rate = share of those "
             "rollouts with a nonempty artifact (a harmful-block rate that falls with it says "
             f"the policy stopped editing, not only that edit). {cov}% percentile bootstrap "
             f"CIs over tasks; MDD at {pw}% power; *tasks needed* = paired tasks that would "
             "detect the measured difference at the measured spread (`eval.stats.power.tasks_needed`, "
             "same n and seeds).", "", "![harmful-block rate per step](harmful_curve.png)", ""]
    for split, sec in ctl["splits"].items():
        for key, label in METRICS:
            lines += [f"### `{split}`: {label}", "", "| policy | tasks | rate | CI |",
                      "|---|---|---|---|"]
            lines += [f"| {x['name']} | {_f(x['n_tasks']) if x['n_tasks'] is None else x['n_tasks']}"
                      f" | {_f(x['mean'])} | {_ci(x['ci'])} |" for x in sec[key]["levels"]]
            lines += ["", "| difference | tasks | mean | CI | MDD | verdict | tasks needed |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {d['name']} | {d['n_tasks'] or PENDING} | {_s(d['mean'])} | "
                      f"{_ci(d['ci'])} | {_mdd(d)} | {d['verdict']} | {_budget(d)} |"
                      for d in sec[key]["differences"]]
            lines.append("")
            lines += _budget_lines(sec[key]["differences"], label)
    if ctl["curves"]:
        lines += ["Harmful-block rate of the training rollouts on harmful tasks per step "
                  "(`trajectories.jsonl` turn writes), mean over seeds:", "",
                  "| arm | runs | first step | last step |", "|---|---|---|---|"]
        for arm, c in ctl["curves"].items():
            steps = list(c["mean"])
            lines.append(f"| {arm} | {len(c['runs'])} | {c['mean'][steps[0]]:.3f} (step "
                         f"{steps[0]}) | {c['mean'][steps[-1]]:.3f} (step {steps[-1]}) |")
        lines.append("")
    return lines


def _budget_lines(diffs: list[dict], label: str) -> list[str]:
    """The tasks × n × seeds table of each arm − baseline row that detected nothing."""
    out = []
    for d in diffs:
        b = d.get("budget")
        if not b or d["verdict"] != "no difference detected" or not d.get("mean"):
            continue
        p = b["parts"]
        pw = int(round(100 * float(d.get("power") or 0.8)))
        scaled = (f" (within-task parts scaled by {p['within_scale']:.2f} to the measured s_d²)"
                  if p.get("within_scale", 1.0) < 1 else "")
        out += [f"Budget that would detect {label} {d['name']} = {_s(d['mean'])} at {pw}% power: "
                f"measured s_d² = {p['sd2']:.4f} = between-task "
                f"{p['between']:.4f} + within-task per-rollout variances {p['v_a']:.3f}/{p['k_a']}"
                f" + {p['v_b']:.3f}/{p['k_b']}{scaled} (`ecredit_trl.study.report_power`).", "",
                "| tasks | n | seeds | MDD | tasks needed for the measured difference |",
                "|---|---|---|---|---|"]
        out += [f"| {g['tasks']} | {g['n']} | {g['seeds']} | {g['mdd']:.3f} | "
                f"{g['tasks_needed'] if g['tasks_needed'] is not None else 'n/a'} |"
                for g in b["grid"]]
        out.append("")
    return out


def write_control_plot(report: dict, out_dir: str | Path) -> list[str]:
    """``harmful_curve.png`` (per arm: harmful-block rate per training step, mean over seeds;
    the step-0 baseline's evaluation rate as a dashed line per split); [] without a control."""
    ctl = report.get("control")
    if not ctl:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for arm, c in ctl["curves"].items():
        steps = sorted(int(s) for s in c["mean"])
        ax.plot(steps, [c["mean"][str(s)] for s in steps], marker="o", ms=3,
                label=f"{arm} (mean of {len(c['runs'])})")
    for split, sec in ctl["splits"].items():
        base = sec["harmful_block_rate"]["levels"][0]
        if base["mean"] is not None:
            ax.axhline(base["mean"], ls="--", lw=0.8, color="grey",
                       label=f"step-0 baseline eval ({split})")
    ax.set_xlabel("training step")
    ax.set_ylabel("harmful-block rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("positive control: rollouts carrying the harmful block")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, Path(out_dir) / "harmful_curve.png")
    plt.close(fig)
    return ["harmful_curve.png"]
