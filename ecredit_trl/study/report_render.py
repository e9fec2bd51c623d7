"""``report.md`` of a study from the ``report.json`` dict (pure; no I/O).

Every figure that is None prints **Pending** (not run or not recorded), never 0.

"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ecredit_trl.study.report_control_render import control_answer, control_lines

__all__ = ["PENDING", "answer_text", "power_words", "render_markdown", "split_title",
           "verdict_words"]

PENDING = "Pending"
_NA = "n/a"


def _f(v, spec: str = ".3f") -> str:
    if v is None:
        return PENDING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _ci(ci: Sequence[float] | None) -> str:
    return PENDING if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _signed(v) -> str:
    return PENDING if v is None else f"{v:+.3f}"


def _cov(report: dict) -> int:
    return int(round(100 * (1 - float(report["study"]["bootstrap"]["alpha"]))))


def power_words(row: dict) -> str:
    """"would have detected |Δ| ≥ X (80% power)" of a pair row, or why it cannot say."""
    pw = int(round(100 * float(row.get("power") or 0.8)))
    if row.get("mdd") is None:
        return (f"minimum detectable difference not estimable ({row['mdd_reason']})"
                if row.get("mdd_reason") else f"minimum detectable difference {PENDING}")
    return f"would have detected |Δ| ≥ {row['mdd']:.3f} ({pw}% power)"


def verdict_words(row: dict) -> str:
    """The verdict of a pair row in words, a null one with its minimum detectable
    difference ("no difference detected (CI contains 0) — would have detected |Δ| ≥ X")."""
    words = {"positive": "CI excludes 0 (positive)", "negative": "CI excludes 0 (negative)",
             "no difference detected": "no difference detected (CI contains 0)",
             "Pending": PENDING}
    w = words[row["verdict"]]
    if row["verdict"] == "no difference detected":
        w += " — " + power_words(row)
    elif row["verdict"] != "Pending":
        w += f"; MDD {row['mdd']:.3f} at {int(round(100 * float(row.get('power') or 0.8)))}% power" \
            if row.get("mdd") is not None else f"; {power_words(row)}"
    return w


def split_title(report: dict, split: str) -> str:
    """```split``` plus " (training tasks)" for a split in ``eval.in_distribution``."""
    ind = (report["study"].get("eval") or {}).get("in_distribution") or []
    return f"`{split}`" + (" (training tasks: in-distribution on purpose)" if split in ind
                           else "")


def answer_text(report: dict) -> list[str]:
    """The "Answer" lines: per split, M−B, M−O, M−E (mean, CI, whether the CI excludes 0,
    the minimum detectable difference) and O − baseline. A difference that was not
    measured says Pending; a row that mixes seed sets says so."""
    cov = _cov(report)
    lines = []
    for split, rows in report["answer"].items():
        if not rows:
            continue
        parts = []
        for r in rows:
            if r["verdict"] == "Pending":
                parts.append(f"**{r['name']}**: {PENDING}")
            else:
                mixed = f" ({r['seeds_note']})" if r.get("seeds_note") else ""
                parts.append(f"**{r['name']}** = {r['mean']:+.3f}, {cov}% CI "
                             f"{_ci(r['ci'])} over {r['n_tasks']} tasks{mixed} — "
                             f"{verdict_words(r)}")
        lines.append(f"- {split_title(report, split)}: " + "; ".join(parts) + ".")
    if not lines:
        lines.append(f"- {PENDING}: no evaluation split in the study.")

    return lines + control_answer(report)


def _design(report: dict) -> list[str]:
    st = report["study"]
    train = st.get("train") or {}
    ev = st.get("eval") or {}
    lines = ["## (a) Design and what ran", "",
             f"- study `{st.get('name')}`, config sha256 `{st.get('config_sha256')}`, started "
             f"{st.get('started_at')}",
             f"- model: {st.get('model') or 'embedded default (tiny warm-started policy)'}",
             f"- arms {', '.join(st['arms'])}; seeds {st.get('seeds')}"
             + (f"; per arm {st['seeds_by_arm']}" if st.get("seeds_by_arm") else ""),
             "- training: " + (", ".join(f"{k}={v}" for k, v in sorted(train.items()))
                               or "defaults"),
             "- evaluation: " + ", ".join(f"{k}={v}" for k, v in sorted(ev.items())),
             f"- bootstrap: {st['bootstrap']}",
             f"- accelerate config: {st.get('accelerate_config')}"]
    cmd = st.get("command")
    if cmd:
        lines.append(f"- command: `{shlex.join(cmd) if isinstance(cmd, list) else cmd}`")
    lines += ["", "| unit | kind | status | detail |", "|---|---|---|---|"]
    for u in report["units"]:
        detail = ""
        if u["kind"] == "train" and u["status"] != "pending":
            detail = f"class {u.get('class')}, step {u.get('step')}, sessions {u.get('sessions')}"
        status = PENDING if u["status"] == "pending" else u["status"]
        lines.append(f"| {u['name']} | {u['kind']} | {status} | {detail} |")
    return lines + [""]


def _curves(report: dict) -> list[str]:
    lines = ["## (b) Learning curves", "",
             "Resolved rate per training step (resolved rollouts / rollouts of the step, "
             "`ledger.jsonl`), mean over seeds with the min–max band.", "",
             "![learning curves](learning_curves.png)", "",
             "| arm | runs | steps | first step | last step (mean [min, max]) |",
             "|---|---|---|---|---|"]
    for arm, c in report["curves"].items():
        if not c or not c["steps"]:
            lines.append(f"| {arm} | {PENDING} | {PENDING} | {PENDING} | {PENDING} |")
            continue
        lines.append(f"| {arm} | {len(c['runs'])} | {len(c['steps'])} | {c['mean'][0]:.3f} | "
                     f"{c['mean'][-1]:.3f} [{c['min'][-1]:.3f}, {c['max'][-1]:.3f}] |")
    return lines + [""]


def _signal_cells(t: dict | None) -> list[str]:
    if t is None:
        return [PENDING] * 9
    d_cols = ([_f(t[k]) for k in ("nonzero", "positive", "negative")] if t["d_measured"]
              else [_NA] * 3)
    ex = ", ".join(f"{k} {v}" for k, v in t["excluded"].items() if v) or "0"
    return [str(t["planned"]), ex, str(t["usable"]), *d_cols, str(t["cap_active"]),
            _f(t["median_m_over_L"]), _f(t["median_shrinkage"])]


def _signal(report: dict) -> list[str]:
    lines = ["## (c) Signal table of the credit arms' training trajectories", "",
             "The pilot's columns (`pilot_table`) on each run's `trajectories.jsonl`. "
             "D = U(P) − U(P\\b); s = shared shrinkage min(1, c/(λ·|D|·L/m)) (arm E: its clip "
             "factor on A, over rollouts whose credit applied); arm E never queries D (n/a).",
             "", "| arm | run | planned | excluded (by reason) | usable | D ≠ 0 | D > 0 | D < 0 "
             "| cap active | median m/L | median s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    if not report["signal"]:
        lines.append("| – | no credit arm (B, M, E) in the study | | | | | | | | | |")
    for arm, s in report["signal"].items():
        n_done = sum(t is not None for t in s["per_run"].values())
        lines.append("| " + " | ".join([arm, f"pooled ({n_done} of {len(s['per_run'])} runs)",
                                        *_signal_cells(s["pooled"])]) + " |")
        for label, t in s["per_run"].items():
            lines.append("| " + " | ".join([arm, label, *_signal_cells(t)]) + " |")
    return lines + [""]


def _pooled_success(report: dict, split: str) -> list[str]:
    """Per arm, seeds pooled: success = mean over tasks of the per-task mean over seeds."""
    cov = _cov(report)
    arms = report["differences"][split]["arms"]
    lines = ["", f"Seeds pooled (mean over tasks of the per-task success averaged over the "
             f"arm's evaluated seeds; {cov}% bootstrap CI over tasks):", "",
             f"| arm | seeds evaluated | success | {cov}% CI |", "|---|---|---|---|"]
    for arm in ["baseline", *report["study"]["arms"]]:
        a = arms.get(arm)
        if a is None:
            lines.append(f"| {arm} | 0 | {PENDING} | {PENDING} |")  # nothing evaluated
            continue
        ci = a["ci"]
        st = report["study"]
        want = 1 if arm == "baseline" else len((st.get("seeds_by_arm") or {}).get(
            arm, st.get("seeds") or []))
        lines.append(f"| {arm} | {len(a['seeds'])} of {want} | {_f(a['success'])} | "
                     f"{f'[{ci[0]:.3f}, {ci[1]:.3f}]' if ci else PENDING} |")
    return lines


def _evaluation(report: dict) -> list[str]:
    lines = ["## (d) Evaluation", "",
             "Per-rollout mean = resolved slots / (tasks × n) over the split's fixed "
             "denominator; unknown slots stay in the denominator as not resolved and are "
             "counted apart (bounds: unknown as failed / as resolved).", ""]
    for split, rows in report["evaluation"].items():
        lines += [f"### {split_title(report, split)}", "",
                  "| policy | arm | seed | success | resolved / slots | tasks × n | unknown | "
                  "bounds |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["status"] == "pending":
                lines.append(f"| {r['policy']} | {r['arm']} | {_f(r['seed'])} | {PENDING} | "
                             f"{PENDING} | {PENDING} | {PENDING} | {PENDING} |")
                continue
            b = r["success_bounds"]
            lines.append(f"| {r['policy']} | {r['arm']} | {'–' if r['seed'] is None else r['seed']}"
                         f" | {_f(r['success'])} | {_f(r['resolved'])} / {_f(r['slots'])} | "
                         f"{_f(r['tasks'])} × {_f(r['n'])} | {_f(r['unknown'])} | "
                         f"{f'[{b[0]:.3f}, {b[1]:.3f}]' if b else PENDING} |")
        lines += _pooled_success(report, split) + [""]
    return lines


def _seeds_cell(p: dict) -> str:
    sa, sb = p.get("seeds_a"), p.get("seeds_b")
    if sa is None:
        return "–"
    cell = f"{sa}" if sb is None else f"{sa} vs {sb}"
    return cell + (" **mixes seed sets**" if p.get("mixed_seeds") else "")


def _mdd_cell(p: dict) -> str:
    if p.get("mdd") is not None:
        return f"{p['mdd']:.3f}"
    return "n/a (no spread)" if p.get("mdd_reason") and p.get("n_tasks") else PENDING


def _pair_lines(rows: list[dict], seed_col: bool) -> list[str]:
    out = []
    for p in rows:
        lead = f" {p.get('seed')} |" if seed_col else f" {_seeds_cell(p)} |"
        out.append(f"| {p['name']} |{lead} {_f(p['n_tasks'])} | {_signed(p['mean'])} | "
                   f"{_ci(p['ci'])} | {_mdd_cell(p)} | {p['verdict']} |")
    return out


def _mdd_paragraph(report: dict) -> list[str]:
    b = report["study"]["bootstrap"]
    pw = int(round(100 * float(b.get("power", 0.8))))
    return [f"MDD = minimum detectable difference at {pw}% power, two-sided α = "
            f"{float(b['alpha']):g}: MDD = (z_(1−α/2) + z_power) · sd(d_t) / √T over the T "
            "paired tasks' differences d_t (the paired-variance estimate, `eval.stats.power`; "
            "each d_t already averages the design's n rollouts and seeds). A difference "
            f"this large is detected with probability {pw}%; \"no difference detected\" "
            "says nothing about smaller ones. n/a: every d_t equal (no spread).", ""]


def _differences(report: dict) -> list[str]:
    cov = _cov(report)
    b = report["study"]["bootstrap"]
    lines = ["## (e) Paired differences", "",
             f"Task-paired differences of per-task success (resolved rollouts / n); seeds "
             f"pooled = an arm's per-task success is the mean over the seeds the row pools "
             f"(`eval.compare.arm_task_success`). {cov}% percentile bootstrap CI over tasks ({b['n_boot']} "
             f"resamples, seed {b['seed']}).", "", "![paired differences](paired_diffs.png)", ""]
    rule = report["study"].get("pooled_seeds") or "shared"
    lines += _mdd_paragraph(report)
    lines += [("Seeds pooled: each side averages the seeds both arms share (M−E on E's seeds "
               "only; `pooled_seeds: shared`)" if rule == "shared" else
               "Seeds pooled: every seed of each arm (`pooled_seeds: all`)")
              + "; an arm − baseline row pools all of the arm's seeds. A row that mixes "
              "seed sets says so.", ""]
    for split, d in report["differences"].items():
        title = split_title(report, split)
        lines += [f"### {title} — seeds pooled", "",
                  f"| difference | seeds | paired tasks | mean | {cov}% CI | MDD | verdict |",
                  "|---|---|---|---|---|---|---|", *_pair_lines(d["pooled"], False), "",
                  f"### {title} — per seed", "",
                  f"| difference | seed | paired tasks | mean | {cov}% CI | MDD | verdict |",
                  "|---|---|---|---|---|---|---|", *_pair_lines(d["per_seed"], True), ""]
        for w in d["warnings"]:
            lines.append(f"- warning: {w}")
        if d["warnings"]:
            lines.append("")
    return lines


_COST_COLS = (("trials_factual", "factual trials", ".0f"),
              ("trials_counterfactual", "counterfactual trials", ".0f"),
              ("trials_control", "control trials", ".0f"),
              ("generated_tokens", "generated tokens", ".0f"),
              ("credited_tokens", "credited tokens", ".0f"),
              ("train_wall_s", "train wall s", ".1f"),
              ("cpu_hours", "CPU-h", ".4f"), ("gpu_hours", "GPU-h", ".4f"),
              ("queue_wait_s", "queue wait s", ".1f"),
              ("eval_wall_s", "eval wall s", ".1f"))


def _costs(report: dict) -> list[str]:
    head = " | ".join(c[1] for c in _COST_COLS)
    lines = ["## (f) Costs per arm", "",
             "Sums over the arm's runs. Trials, tokens, queue wait (verifier queue, summed "
             "over trials) and GPU-h from `ledger.jsonl`; train wall = the sessions' seconds "
             "(termination receipts); CPU-h = train wall × processes (`manifest.json` "
             "world_size) / 3600; eval wall from the runs' `results.json`. Credited tokens "
             "are the tokens in the loss (recorded only by newer ledgers).", "",
             f"| arm | runs | {head} |", "|---|---|" + "---|" * len(_COST_COLS)]
    for arm, c in report["costs"]["per_arm"].items():
        cells = [_f(c.get(k), spec) for k, _, spec in _COST_COLS]
        lines.append(f"| {arm} | {c['runs']} | " + " | ".join(cells) + " |")
    lines += ["", "Per run (an arm's sum is Pending while any of its runs is):", "",
              f"| run | status | steps | {head} |", "|---|---|---|" + "---|" * len(_COST_COLS)]
    for label, c in report["costs"]["per_run"].items():
        c = c or {}
        cells = [_f(c.get(k), spec) for k, _, spec in _COST_COLS]
        lines.append(f"| {label} | {c.get('status', PENDING)} | {_f(c.get('steps'))} | "
                     + " | ".join(cells) + " |")
    return lines + [""]


def _params(m: dict) -> str:
    if not m or m.get("parameters") is None:
        return f"parameter count {PENDING} (no weights in the study folder to count)"
    n = m["parameters"]
    size = f"{n / 1e6:.2f}M" if n < 1e9 else f"{n / 1e9:.2f}B"
    what = "adapter parameters" if m.get("adapter") else "parameters"
    return f"{size} {what} ({n:,}, counted from `{m['source']}`)"


def _caveat(report: dict) -> list[str]:
    """The policy's measured size; for the embedded default, what its results cannot say."""
    m = report.get("model") or {}
    if report["study"].get("model"):
        return [f"Policy `{report['study']['model']}`: {_params(m)}.", ""]
    return [f"The embedded default policy is a tiny model warm-started on these bundled tasks: "
            f"{_params(m)}. Its results say nothing about real models.", ""]


def _counts(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()) if v) or "none"


def _integrity(report: dict) -> list[str]:
    lines = ["## (g) Reward integrity per arm", "",
             "From `ledger.jsonl`. Masked = rollouts whose reward was None "
             "(TRL gives them advantage 0: infrastructure failures and excluded rollouts); "
             "attributed = failures charged to the policy (its trial broke its limits or did "
             "not apply while the control was healthy and a retry broke too, or its agent "
             "exhausted its own container), scored with the failure value; unattributed = "
             "such failures left unavailable (control failed, no retry, ...). Retries: infra "
             "retries / attribution retries.", "",
             "| arm | runs | rollouts | masked share | excluded by reason | attributed by "
             "class | unattributed | retries (infra / attribution) |",
             "|---|---|---|---|---|---|---|---|"]
    for arm, c in (report.get("integrity") or {}).items():
        if not c["runs"]:
            lines.append(f"| {arm} | 0 | {PENDING} | {PENDING} | {PENDING} | {PENDING} | "
                         f"{PENDING} | {PENDING} |")
            continue
        lines.append(f"| {arm} | {c['runs']} | {c['rollouts']} | {_f(c['masked_share'])} | "
                     f"{_counts(c['excluded'])} | {_counts(c['attributed'])} | "
                     f"{_counts(c['unattributed'])} | {c['retries']} / "
                     f"{c['failure_retries']} |")
    return lines + [""]


def render_markdown(report: dict) -> str:
    """``report.md`` from the :func:`ecredit_trl.study.report.study_report` dict (pure)."""
    name = report["study"].get("name") or "study"
    lines = [f"# Study report: {name}", "", "## Answer", "", *answer_text(report), "",
             "A CI that contains 0 means no difference was detected at this size, not that the "
             "arms are equal. **Pending** = not run or not recorded (never a number).", ""]
    lines += _caveat(report)

    for part in (_design, _curves, _signal, _evaluation, _differences, _costs,
                 _integrity, control_lines):
        lines += part(report)
    return "\n".join(lines)
