"""Report stage of an evaluation: slot rows → summary tables (pure), ``report.md``,
``replay.md`` and the figures (design page, "Evaluation": success = mean over every rollout)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from eval.evaluation.slots import SLOT_KEYS, unknown_slot
from eval.files import save_figure
from eval.metrics import per_rollout_success


def summarize(slots: Sequence[dict], tasks: Sequence[tuple[str, str]], n: int,
              denominator: int) -> dict:
    """Aggregate slot rows into the evaluation tables (pure; no I/O).

    Args:
        slots: one row per graded slot with ``task_id``, ``rollout_index``, ``resolved``
            (bool), ``classification`` {raw, report_binary, strict, unknown} and, when
            unknown, ``unknown_reason``; optional ``format_error``, ``stop_reason``,
            ``generated_tokens``. A slot of ``tasks × range(n)`` without a row counts as
            unknown (``no_rollout``); rows outside it (other tasks, index >= n) are ignored
            and counted in ``ignored_rows``. For a slot with several rows the last wins.
        tasks: ``(task_id, repo)`` for every task of the split, in split order.
        n: rollouts per task (>= 1).
        denominator: fixed number of tasks of the split (must equal ``len(tasks)``).

    Returns:
        ``{"denominator": {"tasks", "n", "slots"}, "success", "resolved", "failed",
        "unknown", "success_bounds": [lo, hi], "resolved_swebench", "success_swebench",
        "swebench_unavailable", "verdicts_differ", "protected_paths_touched",
        "classification": {key: {"count", "rate"}},
        "unknown_reasons", "unattributed_reasons" (the artifact rule's reason → slots of
        ``trial_unattributed``), "unknown_slots": [...], "per_task": {id: {...}},
        "per_repo": {repo: {...}}, "task_success_distribution": {"k/n": tasks},
        "format_error_slots", "failures_attributed" (failure class → slots), "stop_reasons",
        "generated_tokens": {"total", "mean"},
        "ignored_rows"}``. ``success = resolved / slots``; ``failed = slots - resolved -
        unknown``; the bounds take every unknown slot as failed / as resolved.
        ``resolved_swebench`` counts known slots whose ``resolved_swebench`` (the harness's
        verdict without the protected set) is true, ``swebench_unavailable`` known slots where
        it is None (missing), ``verdicts_differ`` slots where both exist and differ, and
        ``protected_paths_touched`` slots whose artifact changed a protected path.

    Raises:
        ValueError: ``n < 1``, ``len(tasks) != denominator``, duplicate task ids, or a row
            lacking ``resolved`` / ``classification``.
    """
    rows, ignored = _slot_rows(slots, tasks, n, denominator)
    ids = [t for t, _ in tasks]
    total = denominator * n
    m = per_rollout_success(slots, ids, n, denominator=denominator, ignore_outside=True)
    classification = {k: {"count": sum(1 for r in rows if r["classification"].get(k)),
                          "rate": (sum(1 for r in rows if r["classification"].get(k)) / total)}
                      for k in SLOT_KEYS}
    per_task = _per_task(rows, m["per_task"], dict(tasks))
    per_repo = _per_repo(per_task, ids, n)
    gen = [int(r["generated_tokens"]) for r in rows if r.get("generated_tokens") is not None]
    return {
        "denominator": {"tasks": denominator, "n": n, "slots": total},
        "success": m["success"],
        "resolved": m["resolved"],
        "failed": m["failed"],
        "unknown": m["unknown"],
        "success_bounds": m["success_bounds"],
        **_swebench_counts(rows, total),
        "classification": classification,
        "unknown_reasons": dict(sorted(Counter(r.get("unknown_reason") or "?"
                                               for r in rows if _is_unknown(r)).items())),
        # why a trial that broke its limits was not charged (the artifact rule's reasons:
        # no control, a control without headroom, a retry past the limit, ...)
        "unattributed_reasons": dict(sorted(Counter(
            (r.get("failure_evidence") or {}).get("unattributed") or "?" for r in rows
            if r.get("unknown_reason") == "trial_unattributed").items())),
        "unknown_slots": [{"task_id": r["task_id"], "rollout_index": r["rollout_index"],
                           "reason": r.get("unknown_reason")} for r in rows if _is_unknown(r)],
        "per_task": per_task,
        "per_repo": dict(sorted(per_repo.items())),
        "task_success_distribution": m["task_success_distribution"],
        "format_error_slots": sum(1 for r in rows if r.get("format_error")),
        # slots whose trial broke its limits and was charged to the artifact
        "failures_attributed": dict(sorted(Counter(r["failure_class"] for r in rows
                                                   if r.get("failure_class")).items())),
        "stop_reasons": dict(sorted(Counter(r["stop_reason"] for r in rows
                                            if r.get("stop_reason")).items())),
        "generated_tokens": {"total": sum(gen), "mean": (sum(gen) / len(gen)) if gen else None},
        "ignored_rows": ignored,
    }


def _swebench_counts(rows: list[dict], total: int) -> dict:
    """The two-verdict counts of :func:`summarize`."""
    known = [r for r in rows if not _is_unknown(r)]
    swe = sum(1 for r in known if r.get("resolved_swebench") is True)
    return {"resolved_swebench": swe, "success_swebench": swe / total,
            "swebench_unavailable": sum(1 for r in known if r.get("resolved_swebench") is None),
            "verdicts_differ": sum(1 for r in known if r.get("resolved_swebench") is not None
                                   and bool(r["resolved"]) != r["resolved_swebench"]),
            "protected_paths_touched": sum(1 for r in rows if r.get("protected_touched"))}


def _is_unknown(r: dict) -> bool:
    return bool(r["classification"].get("unknown"))


def _slot_rows(slots: Sequence[dict], tasks: Sequence[tuple[str, str]], n: int,
               denominator: int) -> tuple[list[dict], int]:
    """Check the arguments of :func:`summarize` and return one row per slot of
    ``tasks × range(n)`` in split order (missing → unknown ``no_rollout``, the last row of a
    slot wins) and the number of ignored rows."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n: must be an int >= 1, got {n!r}")
    if len(tasks) != denominator:
        raise ValueError(f"tasks: {len(tasks)} given but the split's denominator is "
                         f"{denominator}")
    ids = [t for t, _ in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("tasks: duplicate task ids")
    repo_of = dict(tasks)
    by_slot: dict[tuple[str, int], dict] = {}
    ignored = 0
    for i, row in enumerate(slots):
        for k in ("task_id", "rollout_index", "resolved", "classification"):
            if k not in row:
                raise ValueError(f"slots[{i}]: field {k!r} missing")
        key = (row["task_id"], int(row["rollout_index"]))
        if key[0] not in repo_of or not 0 <= key[1] < n:
            ignored += 1
            continue
        by_slot[key] = row
    rows: list[dict] = []
    for tid in ids:
        for i in range(n):
            rows.append(by_slot.get((tid, i)) or unknown_slot(tid, i, "no_rollout"))
    return rows, ignored


def _per_task(rows: list[dict], metric_per_task: dict, repo_of: dict[str, str]) -> dict:
    """Per-task rows: the repo, the metric's counts (n, resolved, unknown, failed, success)
    and the ``raw`` / ``strict`` slot views."""
    views: dict[str, dict[str, int]] = {t: {"raw": 0, "strict": 0} for t in metric_per_task}
    for r in rows:
        for k in ("raw", "strict"):
            views[r["task_id"]][k] += bool(r["classification"].get(k))
    return {tid: {"repo": repo_of[tid], **d, **views[tid]} for tid, d in metric_per_task.items()}


def _per_repo(per_task: dict, ids: list[str], n: int) -> dict:
    per_repo: dict[str, dict] = {}
    for tid in ids:
        pt = per_task[tid]
        d = per_repo.setdefault(pt["repo"], {"tasks": 0, "slots": 0, "resolved": 0,
                                             "unknown": 0})
        d["tasks"] += 1
        d["slots"] += n
        d["resolved"] += pt["resolved"]
        d["unknown"] += pt["unknown"]
    for d in per_repo.values():
        d["success"] = d["resolved"] / d["slots"]
        d["failed"] = d["slots"] - d["resolved"] - d["unknown"]
    return per_repo


def label_agreement(pairs: Sequence[tuple[dict, dict]]) -> dict:
    """Per-test label agreement between original and replayed slot grades (pure).

    Args:
        pairs: ``(original, replay)`` slot rows, each with ``task_id``, ``rollout_index``,
            ``f2p`` / ``p2p`` (test id → observed status, ``MISSING`` when unobserved) and
            ``resolved``.

    Returns: ``{"slots", "tests", "agree", "rate", "resolved_agree", "resolved_rate",
        "disagreements": [{"task_id", "rollout_index", "test", "original", "replay"}]}``;
        rates are None when there is nothing to compare.
    """
    tests = agree = res_agree = 0
    dis: list[dict] = []
    for a, b in pairs:
        la = {**(a.get("f2p") or {}), **(a.get("p2p") or {})}
        lb = {**(b.get("f2p") or {}), **(b.get("p2p") or {})}
        for test in sorted(set(la) | set(lb)):
            tests += 1
            if la.get(test) == lb.get(test):
                agree += 1
            else:
                dis.append({"task_id": a["task_id"], "rollout_index": a["rollout_index"],
                            "test": test, "original": la.get(test), "replay": lb.get(test)})
        res_agree += int(bool(a.get("resolved")) == bool(b.get("resolved")))
    return {"slots": len(pairs), "tests": tests, "agree": agree,
            "rate": agree / tests if tests else None, "resolved_agree": res_agree,
            "resolved_rate": res_agree / len(pairs) if pairs else None, "disagreements": dis}


def pct(x: float | None) -> str:
    """A rate as a percentage with one decimal; ``–`` for None."""
    return "–" if x is None else f"{100 * x:.1f}%"


def render_report(results: dict) -> str:
    """``report.md`` for a ``results.json`` dict (pure)."""
    s = results["summary"]
    den = s["denominator"]
    m = results.get("model") or {}
    lines = ["# Policy evaluation", ""]
    meta = [("model", m.get("given")), ("model sha256", (m.get("sha256") or "")[:16]),
            ("training run", m.get("run_dir")), ("arm", results.get("arm")),
            ("training seed", results.get("train_seed")), ("split", results.get("split")),
            ("tasks sha256", (results.get("tasks_sha256") or "")[:16]),
            ("n (rollouts per task)", den["n"]), ("eval seed", results.get("seed")),
            ("binding", (results.get("binding") or "")[:16]),
            ("admission manifest", (results.get("admission") or {}).get("path")),
            ("generation", results.get("settings"))]
    lines += [f"- {k}: `{v}`" for k, v in meta if v is not None]
    lines += [
        "", "## Success (mean over every rollout)", "",
        f"**{s['resolved']} / {den['slots']} = {pct(s['success'])}** "
        f"({den['tasks']} tasks × {den['n']} rollouts; fixed denominator, never best-of-n). "
        f"Unknown: **{s['unknown']}** (in the denominator, not resolved, listed below); "
        f"failed: {s['failed']}. Bounds with every unknown as failed / resolved: "
        f"{pct(s['success_bounds'][0])} – {pct(s['success_bounds'][1])}.",
        *_swebench_lines(s, den["slots"]),
        "", "| slot view | count | rate |", "|---|---|---|"]
    for k in SLOT_KEYS:
        c = s["classification"][k]
        lines.append(f"| {k} | {c['count']} | {pct(c['rate'])} |")
    lines += ["", "`raw`: harness exit ok; `report_binary`: SWE-bench resolved; `strict`: every "
              "listed test observed PASSED; `unknown`: incomplete report without attribution, "
              "infra error, or missing rollout.", "",
              "## Per repository", "", "| repo | tasks | slots | resolved | unknown | success |",
              "|---|---|---|---|---|---|"]
    for repo, d in s["per_repo"].items():
        lines.append(f"| {repo} | {d['tasks']} | {d['slots']} | {d['resolved']} | "
                     f"{d['unknown']} | {pct(d['success'])} |")
    lines += ["", "![success per repository](success_per_repo.png)", "",
              "## Per task", "", "| task | repo | resolved / n | unknown | success |",
              "|---|---|---|---|---|"]
    for tid, d in s["per_task"].items():
        lines.append(f"| {tid} | {d['repo']} | {d['resolved']} / {d['n']} | {d['unknown']} | "
                     f"{pct(d['success'])} |")
    dist = ", ".join(f"{k}: {v}" for k, v in s["task_success_distribution"].items())
    lines += ["", f"Tasks by resolved rollouts: {dist}.", "",
              "![per-task success distribution](task_success_hist.png)", "",
              "## Unknown slots", ""]
    if s["unknown_slots"]:
        lines += [f"Reasons: {s['unknown_reasons']}", ""]
        if s.get("unattributed_reasons"):
            lines += [f"Trials not charged to the artifact (`trial_unattributed`), by reason: "
                      f"{s['unattributed_reasons']}", ""]
        lines += ["| task | rollout | reason |", "|---|---|---|"]
        lines += [f"| {u['task_id']} | {u['rollout_index']} | {u['reason']} |"
                  for u in s["unknown_slots"]]
    else:
        lines.append("None.")
    lines += _trial_lines(s, results.get("cost") or {})
    vs = results.get("verdict_store")
    if vs:
        lines.append(f"- verdict store `{vs['path']}` used (opt-in): {vs['slots_reused']} slots "
                     "graded from an identical clean trial of the same task (stored or run "
                     f"once in this eval), {vs['rejected_entries']} untrusted entries ignored")
    fl = results.get("flaky") or {}
    if fl.get("repeats") is None:
        lines.append("- flaky tests: not measured (no admission manifest)")
    else:
        lines.append(f"- flaky tests (admission manifest, {fl['repeats']} repeats per patch): "
                     f"{fl['tasks_with_flaky']} tasks, {fl['slots_depending_on_flaky']} slots "
                     f"graded on a flaky test, {fl['p2p_tests_dropped']} flaky P2P tests "
                     "dropped")
    if results.get("rollouts_exit_code") not in (None, 0):
        lines += ["", f"**The rollout subprocess exited with {results['rollouts_exit_code']}**; "
                  "its missing slots are unknown (`no_rollout`)."]
    lines.append("")
    return "\n".join(lines)


def _trial_lines(s: dict, cost: dict) -> list[str]:
    """The "Rollouts and trials" section of :func:`render_report`."""
    gt = s["generated_tokens"]
    return ["", "## Rollouts and trials", "",
            f"- format-error rollouts: {s['format_error_slots']}",
            f"- stop reasons: {s['stop_reasons']}",
            f"- generated tokens: {gt['total']} (mean {gt['mean']:.1f} per rollout)"
            if gt["mean"] is not None else "- generated tokens: –",
            f"- trials: {cost.get('trials_factual', 0)} factual, "
            f"{cost.get('trials_control', 0)} empty-patch controls, "
            f"{cost.get('slots_from_empty_control', 0)} slots answered by the control, "
            f"{cost.get('retries', 0)} infra retries, "
            f"{cost.get('failure_retries', 0)} attribution retries",
            f"- failures charged to the artifact (failure value; eval.integrity.attribution): "
            f"{s.get('failures_attributed') or 'none'}",
            f"- trial service time: {cost.get('service_s', 0.0):.1f} s"]


def _swebench_lines(s: dict, slots: int) -> list[str]:
    """The two-verdict paragraph of ``report.md`` (none for results written before it)."""
    if "resolved_swebench" not in s:
        return []
    return ["", f"SWE-bench harness verdict (`resolved_swebench`: no protected set): "
            f"**{s['resolved_swebench']} / {slots} = {pct(s['success_swebench'])}**; slots whose "
            f"artifact changed a protected path: {s['protected_paths_touched']}; verdicts "
            f"differ: {s['verdicts_differ']}; harness verdict unavailable: "
            f"{s['swebench_unavailable']}."]


def render_replay(rep: dict) -> str:
    """``replay.md`` for a ``replay.json`` dict (pure)."""
    agreement = rep["agreement"]
    lines = ["# Replay check", "", f"- results: `{rep['results']}`",
             f"- slots replayed: {rep['slots_replayed']}",
             f"- per-test label agreement: {agreement['agree']} / {agreement['tests']} "
             f"({pct(agreement['rate'])})",
             f"- resolved agreement: {agreement['resolved_agree']} / {agreement['slots']} "
             f"({pct(agreement['resolved_rate'])})", ""]
    if agreement["disagreements"]:
        lines += ["| task | rollout | test | original | replay |", "|---|---|---|---|---|"]
        lines += [f"| {d['task_id']} | {d['rollout_index']} | `{d['test']}` | {d['original']} | "
                  f"{d['replay']} |" for d in agreement["disagreements"][:200]]
    return "\n".join(lines) + "\n"


def write_plots(results: dict, out_dir: str | Path) -> list[str]:
    """``success_per_repo.png`` (bar per repo, unknown share stacked) and
    ``task_success_hist.png`` (tasks by resolved rollouts out of n). Returns file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    s = results["summary"]
    repos = list(s["per_repo"])
    succ = [s["per_repo"][r]["success"] for r in repos]
    unk = [s["per_repo"][r]["unknown"] / s["per_repo"][r]["slots"] for r in repos]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(repos) + 2), 3.5))
    ax.bar(repos, succ, color="tab:blue", label="resolved")
    ax.bar(repos, unk, bottom=succ, color="tab:gray", alpha=0.5, label="unknown")
    ax.set_ylim(0, 1)
    ax.set_ylabel("success (mean over rollouts)")
    ax.set_title(f"{results.get('split')}: success per repository")
    ax.legend(loc="upper right", fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    names = ["success_per_repo.png", "task_success_hist.png"]
    save_figure(fig, out / names[0])
    plt.close(fig)
    dist = s["task_success_distribution"]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.bar(list(dist), list(dist.values()), color="tab:green")
    ax.set_xlabel("resolved rollouts per task")
    ax.set_ylabel("tasks")
    ax.set_title("per-task success distribution")
    fig.tight_layout()
    save_figure(fig, out / names[1])
    plt.close(fig)
    return names
