"""Policy evaluation: per-rollout success on a split with a fixed denominator.

``python -m eval.run --model PATH_OR_RUN_DIR --split official500|holdout100|bundled|
bundled:holdout|FILE --n N --out DIR [--runtime podman|local --concurrency C --seed S
--rollouts FILE --admission MANIFEST --max-turns K --max-new-tokens T --temperature X]``

``python -m eval.run --replay RESULTS [--out DIR --sample K]``

Per slot (task, rollout index 0..n-1), DESIGN.md §4 and issue 6:

1. **Rollout** — produced by ``python -m ecredit_trl.agent.rollouts`` run as a *subprocess* (the
   process boundary keeps ``eval`` free of TRL / peft imports), written to
   ``DIR/rollouts.jsonl``; or read from ``--rollouts FILE``. Trials start while the
   subprocess is still generating.
2. **One factual trial** of the rollout's final artifact in a fresh sandbox
   (:class:`sandbox.VerifierPool`). An empty artifact is answered by the task's empty-patch
   control trial (the identical trial; ``trial_source: "empty_control"``).
3. **Grading** with :func:`eval.grading.grade` against the task's fixed lists, with the
   task's empty-patch control log for attribution (one control per task, cached in
   ``DIR/controls/``).

A slot is **unknown** (:data:`eval.controls.UNKNOWN_RULE`) when its report is incomplete and
cannot be attributed, its trial ended in ``infra_error`` (after the pool's retries), its
rollout is missing, or the agent's own sandbox failed. Unknown slots stay in the
denominator, count as not resolved, and are listed apart.

**success = resolved slots / (denominator tasks × n)** — the mean over every rollout, never
best-of-n. Denominator tasks are fixed per split: ``official500`` 500, ``holdout100`` 100,
anything else the number of tasks the source holds. A loaded task list of another size is
refused.

Resumable: ``DIR/run.json`` binds the directory to sha256(model fingerprint, split, task-list
sha256, eval seed, n, generation overrides, rollouts source). A rerun with another binding
is refused; slot rows of another binding are ignored; graded slots are skipped (slots whose
trial hit an infra error are retried).

Outputs (each written atomically): ``run.json``, ``rollouts.jsonl``, ``slots.jsonl``,
``controls/``, ``logs/``, ``artifacts/<sha256>.patch``, ``results.json``, ``report.md``,
``success_per_repo.png``, ``task_success_hist.png``; replay: ``replay.json``, ``replay.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from eval.files import append_jsonl, atomic_write_text, read_jsonl, save_figure, write_json
from eval.modelref import ModelRef, resolve_model

__all__ = [
    "FIXED_DENOMINATORS",
    "EvalInputError",
    "evaluate",
    "label_agreement",
    "main",
    "render_report",
    "replay",
    "run_binding",
    "split_denominator",
    "summarize",
    "write_plots",
]

SCHEMA = 1

#: Fixed task denominators of the named splits (DESIGN.md §4).
FIXED_DENOMINATORS = {"official500": 500, "holdout100": 100}

#: Unknown reasons after which a rerun tries the slot again (the rollout is kept).
RETRY_REASONS = ("trial_infra_error", "control_infra_error")
UNKNOWN_REASONS = ("no_rollout", "agent_sandbox_error", "incomplete_report", *RETRY_REASONS)

#: Classification keys of a slot (DESIGN.md §4), in report order.
SLOT_KEYS = ("raw", "report_binary", "strict", "unknown")


class EvalInputError(ValueError):
    """Bad input to an evaluation (the message names the flag, field or path)."""


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------


def _atomic_write(path: Path, text: str) -> None:
    atomic_write_text(path, text)


def _read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; raises EvalInputError for a corrupt line that is not the last."""
    return read_jsonl(path, error=EvalInputError)


def _slug(text: str, n: int = 40) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._-") or "x"
    return f"{s[:n]}-{hashlib.sha256(text.encode()).hexdigest()[:6]}"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _ids_sha256(ids: Iterable[str]) -> str:
    from eval.sealed import ids_sha256

    return ids_sha256(list(ids))


def split_denominator(split: str, n_loaded: int) -> int:
    """The fixed task denominator of ``split`` (500 / 100 / the source's own size).

    Raises: EvalInputError when a named split loaded another number of tasks.
    """
    fixed = FIXED_DENOMINATORS.get(split.split(":", 1)[0])
    if fixed is not None and n_loaded != fixed:
        raise EvalInputError(f"split {split!r}: the fixed denominator is {fixed} tasks but "
                             f"{n_loaded} were loaded")
    return fixed if fixed is not None else n_loaded


def run_binding(*, model_sha256: str, split: str, tasks_sha256: str, seed: int, n: int,
                overrides: dict, rollouts_source: str) -> str:
    """sha256 (hex) binding an output directory to one evaluation.

    Args:
        model_sha256: :func:`eval.modelref.dir_fingerprint` of the policy.
        split: the split name as given; tasks_sha256: sha256 of its task ids.
        seed: eval sampling seed; n: rollouts per task.
        overrides: generation settings given on the command line (None = run default).
        rollouts_source: ``"subprocess"`` or ``"file:<sha256 of the rollout rows>"``.
    """
    blob = json.dumps({"model": model_sha256, "split": split, "tasks": tasks_sha256,
                       "seed": seed, "n": n, "overrides": overrides,
                       "rollouts": rollouts_source}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


# ---------------------------------------------------------------------------
# pure aggregation
# ---------------------------------------------------------------------------


def unknown_slot(task_id: str, rollout_index: int, reason: str, **extra) -> dict:
    """A slot row for an unknown outcome (not resolved, every classification False but
    ``unknown``)."""
    if reason not in UNKNOWN_REASONS:
        raise ValueError(f"reason: expected one of {UNKNOWN_REASONS}, got {reason!r}")
    return {"task_id": task_id, "rollout_index": rollout_index, "resolved": False,
            "utility": None, "complete": False, "attributed": False,
            "classification": {"raw": False, "report_binary": False, "strict": False,
                               "unknown": True},
            "unknown_reason": reason, **extra}


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
        "unknown", "success_bounds": [lo, hi], "classification": {key: {"count", "rate"}},
        "unknown_reasons", "unknown_slots": [...], "per_task": {id: {...}},
        "per_repo": {repo: {...}}, "task_success_distribution": {"k/n": tasks},
        "format_error_slots", "stop_reasons", "generated_tokens": {"total", "mean"},
        "ignored_rows"}``. ``success = resolved / slots``; ``failed = slots - resolved -
        unknown``; the bounds take every unknown slot as failed / as resolved.

    Raises:
        ValueError: ``n < 1``, ``len(tasks) != denominator``, duplicate task ids, or a row
            lacking ``resolved`` / ``classification``.
    """
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
    total = denominator * n
    rows: list[dict] = []
    for tid in ids:
        for i in range(n):
            rows.append(by_slot.get((tid, i)) or unknown_slot(tid, i, "no_rollout"))

    def is_unknown(r: dict) -> bool:
        return bool(r["classification"].get("unknown"))

    resolved = sum(1 for r in rows if r["resolved"] and not is_unknown(r))
    unknown = sum(1 for r in rows if is_unknown(r))
    classification = {k: {"count": sum(1 for r in rows if r["classification"].get(k)),
                          "rate": (sum(1 for r in rows if r["classification"].get(k)) / total)}
                      for k in SLOT_KEYS}
    per_task: dict[str, dict] = {}
    for tid in ids:
        tr = [r for r in rows if r["task_id"] == tid]
        res = sum(1 for r in tr if r["resolved"] and not is_unknown(r))
        unk = sum(1 for r in tr if is_unknown(r))
        per_task[tid] = {"repo": repo_of[tid], "n": n, "resolved": res, "unknown": unk,
                         "failed": n - res - unk, "success": res / n,
                         **{k: sum(1 for r in tr if r["classification"].get(k))
                            for k in ("raw", "strict")}}
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
    dist = Counter(per_task[t]["resolved"] for t in ids)
    gen = [int(r["generated_tokens"]) for r in rows if r.get("generated_tokens") is not None]
    return {
        "denominator": {"tasks": denominator, "n": n, "slots": total},
        "success": resolved / total,
        "resolved": resolved,
        "failed": total - resolved - unknown,
        "unknown": unknown,
        "success_bounds": [resolved / total, (resolved + unknown) / total],
        "classification": classification,
        "unknown_reasons": dict(sorted(Counter(r.get("unknown_reason") or "?"
                                               for r in rows if is_unknown(r)).items())),
        "unknown_slots": [{"task_id": r["task_id"], "rollout_index": r["rollout_index"],
                           "reason": r.get("unknown_reason")} for r in rows if is_unknown(r)],
        "per_task": per_task,
        "per_repo": dict(sorted(per_repo.items())),
        "task_success_distribution": {f"{k}/{n}": dist.get(k, 0) for k in range(n + 1)},
        "format_error_slots": sum(1 for r in rows if r.get("format_error")),
        "stop_reasons": dict(sorted(Counter(r["stop_reason"] for r in rows
                                            if r.get("stop_reason")).items())),
        "generated_tokens": {"total": sum(gen), "mean": (sum(gen) / len(gen)) if gen else None},
        "ignored_rows": ignored,
    }


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


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------


def _pct(x: float | None) -> str:
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
        f"**{s['resolved']} / {den['slots']} = {_pct(s['success'])}** "
        f"({den['tasks']} tasks × {den['n']} rollouts; fixed denominator, never best-of-n). "
        f"Unknown: **{s['unknown']}** (in the denominator, not resolved, listed below); "
        f"failed: {s['failed']}. Bounds with every unknown as failed / resolved: "
        f"{_pct(s['success_bounds'][0])} – {_pct(s['success_bounds'][1])}.",
        "", "| slot view | count | rate |", "|---|---|---|"]
    for k in SLOT_KEYS:
        c = s["classification"][k]
        lines.append(f"| {k} | {c['count']} | {_pct(c['rate'])} |")
    lines += ["", "`raw`: harness exit ok; `report_binary`: SWE-bench resolved; `strict`: every "
              "listed test observed PASSED; `unknown`: incomplete report without attribution, "
              "infra error, or missing rollout.", "",
              "## Per repository", "", "| repo | tasks | slots | resolved | unknown | success |",
              "|---|---|---|---|---|---|"]
    for repo, d in s["per_repo"].items():
        lines.append(f"| {repo} | {d['tasks']} | {d['slots']} | {d['resolved']} | "
                     f"{d['unknown']} | {_pct(d['success'])} |")
    lines += ["", "![success per repository](success_per_repo.png)", "",
              "## Per task", "", "| task | repo | resolved / n | unknown | success |",
              "|---|---|---|---|---|"]
    for tid, d in s["per_task"].items():
        lines.append(f"| {tid} | {d['repo']} | {d['resolved']} / {d['n']} | {d['unknown']} | "
                     f"{_pct(d['success'])} |")
    dist = ", ".join(f"{k}: {v}" for k, v in s["task_success_distribution"].items())
    lines += ["", f"Tasks by resolved rollouts: {dist}.", "",
              "![per-task success distribution](task_success_hist.png)", "",
              "## Unknown slots", ""]
    if s["unknown_slots"]:
        lines += [f"Reasons: {s['unknown_reasons']}", "", "| task | rollout | reason |",
                  "|---|---|---|"]
        lines += [f"| {u['task_id']} | {u['rollout_index']} | {u['reason']} |"
                  for u in s["unknown_slots"]]
    else:
        lines.append("None.")
    cost = results.get("cost") or {}
    gt = s["generated_tokens"]
    lines += ["", "## Rollouts and trials", "",
              f"- format-error rollouts: {s['format_error_slots']}",
              f"- stop reasons: {s['stop_reasons']}",
              f"- generated tokens: {gt['total']} (mean {gt['mean']:.1f} per rollout)"
              if gt["mean"] is not None else "- generated tokens: –",
              f"- trials: {cost.get('trials_factual', 0)} factual, "
              f"{cost.get('trials_control', 0)} empty-patch controls, "
              f"{cost.get('slots_from_empty_control', 0)} slots answered by the control, "
              f"{cost.get('retries', 0)} infra retries",
              f"- trial service time: {cost.get('service_s', 0.0):.1f} s",
              ]
    if results.get("rollouts_exit_code") not in (None, 0):
        lines += ["", f"**The rollout subprocess exited with {results['rollouts_exit_code']}**; "
                  "its missing slots are unknown (`no_rollout`)."]
    lines.append("")
    return "\n".join(lines)


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
    _save_fig(fig, out / names[0])
    plt.close(fig)
    dist = s["task_success_distribution"]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.bar(list(dist), list(dist.values()), color="tab:green")
    ax.set_xlabel("resolved rollouts per task")
    ax.set_ylabel("tasks")
    ax.set_title("per-task success distribution")
    fig.tight_layout()
    _save_fig(fig, out / names[1])
    plt.close(fig)
    return names


def _save_fig(fig, path: Path) -> None:
    save_figure(fig, path)


# ---------------------------------------------------------------------------
# trials and grading
# ---------------------------------------------------------------------------


def _control_key(task) -> str:
    blob = json.dumps([task.instance_id, task.image, task.base_commit, _sha(task.eval_script),
                       task.FAIL_TO_PASS, task.PASS_TO_PASS])
    return hashlib.sha256(blob.encode()).hexdigest()


def grade_trial(task, res, control_log: str | None) -> dict:
    """Grade one trial result of ``task`` into slot fields (no task/rollout ids).

    ``infra_error`` → unknown (``trial_infra_error``). Any other exit class is graded from
    its log (``harness_exit`` = the exit class unless ``ok``, where the test exit code in
    the log decides), with ``control_log`` for attribution.
    """
    from eval.grading import grade

    base = {"exit_class": res.exit_class, "trial_id": res.trial_id}
    if res.exit_class == "infra_error":
        return {**unknown_slot("", 0, "trial_infra_error"), **base, "error": res.error}
    rep = grade(res.log, f2p=list(task.FAIL_TO_PASS), p2p=list(task.PASS_TO_PASS),
                parser=task.log_parser, control_log=control_log,
                harness_exit=None if res.exit_class == "ok" else res.exit_class)
    out = {**base, "resolved": bool(rep.resolved), "utility": rep.utility,
           "complete": rep.complete, "attributed": rep.attributed,
           "classification": dict(rep.classification),
           "unknown_reason": "incomplete_report" if rep.classification["unknown"] else None,
           "f2p": dict(rep.f2p), "p2p": dict(rep.p2p), "missing": list(rep.missing),
           "log_rejected": rep.log_rejected, "resolution_status": rep.resolution_status}
    return out


def _trial_row(res) -> dict:
    return {k: getattr(res, k) for k in ("queue_wait_s", "setup_s", "apply_s", "test_s",
                                         "cleanup_s", "attempts", "applied_with",
                                         "test_exit_code")} | {"service_s": res.service_s}


class _Tail:
    """Reads complete new lines appended to a JSONL file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        rows = []
        for line in data[: end + 1].splitlines():
            if line.strip():
                rows.append(json.loads(line.decode("utf-8", "surrogateescape")))
        return rows


def _rollouts_source(path: Path) -> str:
    rows = _read_jsonl(path)
    key = sorted((r.get("task_id"), r.get("rollout_index"), r.get("artifact_sha256")
                  or _sha(r.get("artifact") or ""), r.get("model_sha256")) for r in rows)
    return "file:" + hashlib.sha256(json.dumps(key).encode()).hexdigest()


def evaluate(*, model: str | None, split: str, n: int, out: str | Path, runtime="podman",
             concurrency: int = 2, seed: int = 0, rollouts: str | Path | None = None,
             admission: str | Path | None = None, overrides: dict | None = None,
             timeout_s: float = 600.0, max_retries: int = 1, device: str | None = None,
             python: str | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Evaluate a policy on ``split`` and write the outputs into ``out`` (see module doc).

    Args:
        model: model dir or run dir (:func:`eval.modelref.resolve_model`); may be None with
            ``rollouts`` (then the rows' ``model_sha256`` identifies the policy).
        split: task source of :func:`eval.splits.load_tasks`.
        n: rollouts per task (>= 1).
        out: output folder (created; resumable).
        runtime: ``"podman"``, ``"local"`` or a runtime object (not closed here).
        concurrency: verifier trials at once (>= 1).
        seed: eval sampling seed (passed to the rollout subprocess).
        rollouts: read rollouts from this JSONL file instead of generating them.
        admission: admission manifest (:mod:`eval.controls`) to run under; refused when
            the task list or an image digest changed.
        overrides: generation settings for the rollout subprocess (``max_turns``,
            ``max_new_tokens``, ``temperature``); None values mean "run default".
        timeout_s: wall-clock limit of one verifier trial, seconds.
        max_retries: infra retries per trial (counted).
        device: torch device for the rollout subprocess.
        python: interpreter for the subprocess (default ``sys.executable``).

    Returns: the ``results.json`` dict.

    Raises:
        EvalInputError: bad ``n`` / ``concurrency``, ``out`` bound to another evaluation,
            rollout rows of another model, a changed admission manifest.
        FileNotFoundError: a missing model, rollouts file or manifest.
    """
    from eval.splits import load_tasks
    from eval.trialspec import task_trial_spec
    from sandbox import VerifierPool, make_runtime

    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if not isinstance(n, int) or n < 1:
        raise EvalInputError(f"--n: must be an int >= 1, got {n!r}")
    if concurrency < 1:
        raise EvalInputError(f"--concurrency: must be >= 1, got {concurrency}")
    if model is None and rollouts is None:
        raise EvalInputError("--model is required unless --rollouts is given")
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    t_start = time.time()
    out = Path(out)
    ref: ModelRef | None = resolve_model(model) if model is not None else None
    tasks = load_tasks(split, purpose="eval")
    denominator = split_denominator(split, len(tasks))
    by_id = {t.instance_id: t for t in tasks}
    tasks_sha = _ids_sha256(by_id)

    admission_rec = None
    if admission is not None:
        from eval.controls import check_admission

        admission_rec = check_admission(admission, tasks, runtime=runtime)

    if rollouts is not None:
        rpath = Path(rollouts)
        if not rpath.is_file():
            raise FileNotFoundError(f"--rollouts: no such file {rpath}")
        source = _rollouts_source(rpath)
        shas = {r.get("model_sha256") for r in _read_jsonl(rpath)} - {None}
        if ref is not None and shas - {ref.sha256}:
            raise EvalInputError(f"--rollouts {rpath}: rows were generated by model(s) "
                                 f"{sorted(s[:12] for s in shas)}, not --model "
                                 f"{ref.model_dir} ({ref.sha256[:12]})")
        if ref is None and len(shas) > 1:
            raise EvalInputError(f"--rollouts {rpath}: rows of {len(shas)} different models")
        model_sha = ref.sha256 if ref else (next(iter(shas)) if shas else "unknown")
    else:
        rpath = out / "rollouts.jsonl"
        source = "subprocess"
        model_sha = ref.sha256
    binding = run_binding(model_sha256=model_sha, split=split, tasks_sha256=tasks_sha,
                          seed=seed, n=n, overrides=overrides, rollouts_source=source)
    run_cfg = {"schema": SCHEMA, "binding": binding, "model_sha256": model_sha, "split": split,
               "tasks_sha256": tasks_sha, "seed": seed, "n": n, "overrides": overrides,
               "rollouts_source": source, "model": ref.to_json() if ref else None}
    run_json = out / "run.json"
    if run_json.exists():
        old = json.loads(run_json.read_text())
        if old.get("binding") != binding:
            diff = [k for k in ("model_sha256", "split", "tasks_sha256", "seed", "n",
                                "overrides", "rollouts_source") if old.get(k) != run_cfg[k]]
            raise EvalInputError(
                f"--out {out}: bound to another evaluation (binding {str(old.get('binding'))[:12]}"
                f" != {binding[:12]}; differs in: {', '.join(diff) or 'binding'}); results from "
                "another model or run are never reused: choose another --out")
    else:
        out.mkdir(parents=True, exist_ok=True)
        write_json(run_json, {**run_cfg, "created_at": time.time()})
    for sub in ("logs", "controls", "artifacts"):
        (out / sub).mkdir(parents=True, exist_ok=True)

    # -- resume state ----------------------------------------------------------
    slots_path = out / "slots.jsonl"
    prior = _read_jsonl(slots_path)
    foreign = sum(1 for r in prior if r.get("binding") != binding)
    final: dict[tuple[str, int], dict] = {}
    for r in prior:
        if r.get("binding") != binding:
            continue
        key = (r["task_id"], int(r["rollout_index"]))
        if r.get("unknown_reason") in RETRY_REASONS:
            final.pop(key, None)
        else:
            final[key] = r
    if foreign:
        say(f"eval: ignoring {foreign} slot row(s) of another binding in {slots_path}")
    wanted = {(t, i) for t in by_id for i in range(n)}
    todo = wanted - set(final)
    say(f"eval: {len(tasks)} tasks x {n} = {len(wanted)} slots; {len(wanted) - len(todo)} "
        f"already graded, {len(todo)} to do")

    # -- rollouts (subprocess) ---------------------------------------------------
    proc = None
    errf = None
    stderr_path = out / "rollouts.stderr.log"
    if rollouts is None and todo:
        cmd = [python or sys.executable, "-m", "ecredit_trl.agent.rollouts", "--model", ref.given,
               "--tasks", split, "--n", str(n), "--out", str(rpath), "--seed", str(seed),
               "--runtime", runtime if isinstance(runtime, str) else (
                   "local" if type(runtime).__name__ == "LocalRuntime" else "podman"),
               "--binding", binding]
        for k, flag in (("max_turns", "--max-turns"), ("max_new_tokens", "--max-new-tokens"),
                        ("temperature", "--temperature")):
            if k in overrides:
                cmd += [flag, str(overrides[k])]
        if device:
            cmd += ["--device", device]
        todo_tasks = sorted({t for t, _ in todo})
        if len(todo_tasks) < len(by_id):
            for t in todo_tasks:
                cmd += ["--task-id", t]
        say("eval: $ " + " ".join(cmd[:12]) + (" ..." if len(cmd) > 12 else ""))
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
        errf = open(stderr_path, "ab")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf, env=env)
    tail = _Tail(rpath)

    own_rt = isinstance(runtime, str)
    rt = make_runtime(runtime, run_id=f"eval-{binding[:8]}-{os.getpid()}") if own_rt else runtime
    new_rows: list[dict] = []
    controls: dict[str, dict] = {}
    ctrl_fut: dict = {}
    pending: dict = {}  # future -> (key, rollout row)
    waiting_ctrl: list[tuple[tuple[str, int], dict]] = []  # empty-artifact slots
    seen_rollouts: dict[tuple[str, int], dict] = {}
    stats = Counter()
    rollout_rc = None

    def control_of(tid: str, block: bool) -> dict | None:
        if tid in controls:
            return controls[tid]
        fut = ctrl_fut.get(tid)
        if fut is None or (not block and not fut.done()):
            return None
        res = fut.result()
        stats["trials_control"] += 1
        stats["retries"] += res.attempts - 1
        stats["service_s"] += res.service_s
        lp = out / "logs" / f"{res.trial_id}.log"
        _atomic_write(lp, res.log)
        c = {"key": _control_key(by_id[tid]), "trial_id": res.trial_id,
             "exit_class": res.exit_class, "log": res.log, "trial": _trial_row(res)}
        if res.exit_class == "ok":
            write_json(out / "controls" / f"{_slug(tid)}.json", c)
        controls[tid] = c
        return c

    def ensure_control(pool, tid: str) -> None:
        if tid in controls or tid in ctrl_fut:
            return
        cpath = out / "controls" / f"{_slug(tid)}.json"
        if cpath.exists():
            try:
                c = json.loads(cpath.read_text())
            except (OSError, json.JSONDecodeError):
                c = None
            if c and c.get("key") == _control_key(by_id[tid]) and c.get("exit_class") == "ok":
                controls[tid] = c
                return
        spec = task_trial_spec(by_id[tid], "", f"evctl-{binding[:8]}-{_slug(tid)}-"
                               f"{uuid.uuid4().hex[:6]}", timeout_s=timeout_s,
                               labels={"ecredit.role": "control"})
        ctrl_fut[tid] = pool.submit(spec)

    def rollout_fields(r: dict) -> dict:
        return {"format_error": r.get("format_error"), "stop_reason": r.get("stop_reason"),
                "generated_tokens": r.get("generated_tokens"),
                "setup_error": r.get("setup_error"),
                "tool_calls": len(r.get("tool_calls") or []),
                "artifact_sha256": r.get("artifact_sha256") or _sha(r.get("artifact") or ""),
                "artifact_bytes": len((r.get("artifact") or "").encode("utf-8",
                                                                       "surrogateescape")),
                "rollout_timings": r.get("timings")}

    def finish(key, row: dict) -> None:
        row.update(task_id=key[0], rollout_index=key[1], repo=by_id[key[0]].repo,
                   binding=binding, graded_at=time.time())
        append_jsonl(slots_path, [row])
        new_rows.append(row)
        final[key] = row

    def take_rollout(pool, r: dict) -> None:
        key = (r.get("task_id"), r.get("rollout_index"))
        if key not in todo or key in seen_rollouts:
            return
        if source == "subprocess" and r.get("binding") != binding:
            return
        seen_rollouts[key] = r
        art = r.get("artifact") or ""
        fields = rollout_fields(r)
        if art:
            _atomic_write(out / "artifacts" / f"{fields['artifact_sha256']}.patch", art)
        ensure_control(pool, key[0])
        if r.get("setup_error"):
            finish(key, {**unknown_slot(*key, "agent_sandbox_error"), **fields,
                         "trial_source": None})
            return
        if not art:
            waiting_ctrl.append((key, r))
            return
        spec = task_trial_spec(by_id[key[0]], art, f"ev-{binding[:8]}-{_slug(key[0])}-"
                               f"r{key[1]}-{uuid.uuid4().hex[:6]}", timeout_s=timeout_s,
                               labels={"ecredit.role": "factual"})
        pending[pool.submit(spec)] = (key, r)

    def drain(block: bool) -> None:
        for fut in [f for f in list(pending) if block or f.done()]:
            key, r = pending.pop(fut)
            res = fut.result()
            stats["trials_factual"] += 1
            stats["retries"] += res.attempts - 1
            stats["service_s"] += res.service_s
            lp = out / "logs" / f"{res.trial_id}.log"
            _atomic_write(lp, res.log)
            c = control_of(key[0], block=True)
            ctrl_log = c["log"] if c and c["exit_class"] == "ok" else None
            g = grade_trial(by_id[key[0]], res, ctrl_log)
            finish(key, {**g, **rollout_fields(r), "trial_source": "factual",
                         "trial": _trial_row(res), "log_path": str(lp.relative_to(out))})
        for key, r in list(waiting_ctrl):
            c = control_of(key[0], block=block)
            if c is None:
                continue
            waiting_ctrl.remove((key, r))
            stats["slots_from_empty_control"] += 1
            if c["exit_class"] == "infra_error":
                finish(key, {**unknown_slot(*key, "control_infra_error"), **rollout_fields(r),
                             "trial_source": "empty_control", "trial_id": c["trial_id"]})
                continue

            class _Res:  # the control's trial, graded as this slot's factual trial
                exit_class, log, trial_id = c["exit_class"], c["log"], c["trial_id"]
                error = None

            g = grade_trial(by_id[key[0]], _Res, c["log"] if c["exit_class"] == "ok" else None)
            finish(key, {**g, **rollout_fields(r), "trial_source": "empty_control",
                         "log_path": f"logs/{c['trial_id']}.log"})

    try:
        with VerifierPool(rt, max_concurrency=concurrency, max_retries=max_retries) as pool:
            while True:
                for r in tail.read():
                    take_rollout(pool, r)
                drain(block=False)
                if proc is None or proc.poll() is not None:
                    for r in tail.read():
                        take_rollout(pool, r)
                    break
                time.sleep(0.5)
            if proc is not None:
                rollout_rc = proc.returncode
                if rollout_rc != 0:
                    tail_txt = stderr_path.read_text(errors="replace")[-1500:]
                    say(f"eval: rollout subprocess exited with {rollout_rc}; last stderr:\n"
                        f"{tail_txt}")
            drain(block=True)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        if errf is not None:
            errf.close()
        if own_rt:
            rt.close()

    # -- aggregate -------------------------------------------------------------
    slot_rows = [final[k] for k in sorted(final)]
    summary = summarize(slot_rows, [(t.instance_id, t.repo) for t in tasks], n, denominator)
    settings = None
    for r in seen_rollouts.values():
        settings = r.get("settings") or settings
    if settings is None and rpath.exists():
        for r in _read_jsonl(rpath)[:1]:
            settings = r.get("settings")
    prev = {}
    if (out / "results.json").exists():
        try:
            prev = json.loads((out / "results.json").read_text())
        except json.JSONDecodeError:
            prev = {}
    cost_prev = prev.get("cost") if prev.get("binding") == binding else None
    cost = dict(cost_prev or {})
    for k in ("trials_factual", "trials_control", "slots_from_empty_control", "retries"):
        cost[k] = int(cost.get(k, 0)) + int(stats[k])
    cost["service_s"] = float(cost.get("service_s", 0.0)) + float(stats["service_s"])
    cost["generated_tokens"] = summary["generated_tokens"]["total"]
    results = {
        "schema": SCHEMA, "binding": binding, "split": split, "n": n, "seed": seed,
        "tasks_sha256": tasks_sha, "model": ref.to_json() if ref else {"sha256": model_sha},
        "arm": ref.arm if ref else None, "train_seed": ref.seed if ref else None,
        "run_dir": ref.run_dir if ref else None, "settings": settings,
        "overrides": overrides, "rollouts_source": source,
        "admission": admission_rec, "summary": summary, "cost": cost,
        "rollouts_exit_code": rollout_rc, "foreign_rows_ignored": foreign,
        "slots": [{k: v for k, v in r.items() if k not in ("f2p", "p2p", "missing")}
                  for r in slot_rows],
        "graded_this_call": len(new_rows), "wall_s": round(time.time() - t_start, 3),
        "updated_at": time.time(),
    }
    write_json(out / "results.json", results)
    write_plots(results, out)
    _atomic_write(out / "report.md", render_report(results))
    say(f"eval: success {summary['resolved']}/{summary['denominator']['slots']} = "
        f"{summary['success']:.3f}, unknown {summary['unknown']}; report {out / 'report.md'}")
    return results


# ---------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------


def replay(results_path: str | Path, out: str | Path | None = None, *, runtime="podman",
           concurrency: int = 2, sample: int | None = None, seed: int = 0,
           timeout_s: float = 600.0, max_retries: int = 1,
           log: Callable[[str], None] | None = None) -> dict:
    """Re-verify the stored artifacts of an evaluation and compare per-test labels.

    Every graded slot (not unknown for infra reasons) whose artifact is stored gets one fresh
    trial; its grade's F2P/P2P statuses are compared with the original ones
    (:func:`label_agreement`). Empty artifacts are replayed as empty-patch trials.

    Args:
        results_path: ``results.json`` or the evaluation folder holding it.
        out: where ``replay.json`` / ``replay.md`` go (default: the evaluation folder).
        sample: replay only this many slots (chosen with ``random.Random(seed)``).

    Returns: the ``replay.json`` dict.

    Raises: FileNotFoundError / EvalInputError naming the results path or a missing artifact.
    """
    from eval.splits import load_tasks
    from eval.trialspec import task_trial_spec
    from sandbox import VerifierPool, make_runtime

    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    rp = Path(results_path)
    if rp.is_dir():
        rp = rp / "results.json"
    if not rp.is_file():
        raise FileNotFoundError(f"--replay: no results.json at {rp}")
    results = json.loads(rp.read_text())
    src = rp.parent
    out = Path(out) if out else src
    slots = {(r["task_id"], r["rollout_index"]): r for r in _read_jsonl(src / "slots.jsonl")
             if r.get("binding") == results.get("binding")}
    tasks = {t.instance_id: t for t in load_tasks(results["split"], purpose="eval")}
    chosen = [r for k, r in sorted(slots.items())
              if r.get("unknown_reason") not in ("no_rollout", "agent_sandbox_error",
                                                 *RETRY_REASONS) and k[0] in tasks]
    if sample is not None and sample < len(chosen):
        chosen = sorted(random.Random(seed).sample(chosen, sample),
                        key=lambda r: (r["task_id"], r["rollout_index"]))
    controls = {}
    for tid in {r["task_id"] for r in chosen}:
        c = src / "controls" / f"{_slug(tid)}.json"
        if c.is_file():
            controls[tid] = json.loads(c.read_text()).get("log")
    own_rt = isinstance(runtime, str)
    rt = make_runtime(runtime, run_id=f"replay-{os.getpid()}") if own_rt else runtime
    pairs = []
    rows = []
    t0 = time.time()
    try:
        with VerifierPool(rt, max_concurrency=concurrency, max_retries=max_retries) as pool:
            futs = []
            for r in chosen:
                art = ""
                if r.get("artifact_bytes"):
                    ap = src / "artifacts" / f"{r['artifact_sha256']}.patch"
                    if not ap.is_file():
                        raise EvalInputError(f"--replay: artifact {ap} missing for "
                                             f"{r['task_id']} #{r['rollout_index']}")
                    art = ap.read_text(encoding="utf-8", errors="surrogateescape")
                spec = task_trial_spec(tasks[r["task_id"]], art,
                                       f"rp-{_slug(r['task_id'])}-r{r['rollout_index']}-"
                                       f"{uuid.uuid4().hex[:6]}", timeout_s=timeout_s,
                                       labels={"ecredit.role": "replay"})
                futs.append((r, pool.submit(spec)))
            for r, fut in futs:
                res = fut.result()
                g = grade_trial(tasks[r["task_id"]], res, controls.get(r["task_id"]))
                g.update(task_id=r["task_id"], rollout_index=r["rollout_index"])
                pairs.append((r, g))
                rows.append({"task_id": r["task_id"], "rollout_index": r["rollout_index"],
                             "original_resolved": r.get("resolved"),
                             "replay_resolved": g.get("resolved"),
                             "replay_exit_class": res.exit_class,
                             "replay_unknown_reason": g.get("unknown_reason")})
    finally:
        if own_rt:
            rt.close()
    agreement = label_agreement(pairs)
    rep = {"schema": SCHEMA, "results": str(rp), "binding": results.get("binding"),
           "slots_replayed": len(pairs), "sample": sample, "agreement": agreement,
           "slots": rows, "wall_s": round(time.time() - t0, 3)}
    write_json(out / "replay.json", rep)
    lines = ["# Replay check", "", f"- results: `{rp}`", f"- slots replayed: {len(pairs)}",
             f"- per-test label agreement: {agreement['agree']} / {agreement['tests']} "
             f"({_pct(agreement['rate'])})",
             f"- resolved agreement: {agreement['resolved_agree']} / {agreement['slots']} "
             f"({_pct(agreement['resolved_rate'])})", ""]
    if agreement["disagreements"]:
        lines += ["| task | rollout | test | original | replay |", "|---|---|---|---|---|"]
        lines += [f"| {d['task_id']} | {d['rollout_index']} | `{d['test']}` | {d['original']} | "
                  f"{d['replay']} |" for d in agreement["disagreements"][:200]]
    _atomic_write(out / "replay.md", "\n".join(lines) + "\n")
    say(f"replay: {agreement['agree']}/{agreement['tests']} test labels agree, "
        f"{agreement['resolved_agree']}/{agreement['slots']} resolved verdicts agree")
    return rep


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point. Exit 0 when done, 1 when the rollout subprocess failed (the report is
    still written), 2 on bad input (the message names the flag, field or path)."""
    ap = argparse.ArgumentParser(prog="python -m eval.run", description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model dir or training run dir (runs/<name>)")
    ap.add_argument("--split", help="official500 | holdout100 | bundled | bundled:holdout | FILE")
    ap.add_argument("--n", type=int, help="rollouts per task")
    ap.add_argument("--out", help="output folder (resumable)")
    ap.add_argument("--runtime", choices=("podman", "local"), default="podman")
    ap.add_argument("--concurrency", type=int, default=2, help="verifier trials at once")
    ap.add_argument("--seed", type=int, default=0, help="eval sampling seed")
    ap.add_argument("--rollouts", help="read rollouts from this JSONL instead of generating")
    ap.add_argument("--admission", help="admission manifest (python -m eval.controls)")
    ap.add_argument("--max-turns", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per-trial limit, seconds")
    ap.add_argument("--max-retries", type=int, default=1, help="infra retries per trial")
    ap.add_argument("--device", default=None, help="torch device of the rollout subprocess")
    ap.add_argument("--replay", help="results.json (or its folder) to re-verify")
    ap.add_argument("--sample", type=int, default=None, help="replay: only this many slots")
    args = ap.parse_args(argv)
    try:
        if args.replay:
            replay(args.replay, args.out, runtime=args.runtime, concurrency=args.concurrency,
                   sample=args.sample, seed=args.seed, timeout_s=args.timeout_s,
                   max_retries=args.max_retries)
            return 0
        missing = [f"--{k}" for k in ("split", "n", "out") if getattr(args, k) is None]
        if missing:
            raise EvalInputError(f"missing {', '.join(missing)} (or use --replay RESULTS)")
        res = evaluate(model=args.model, split=args.split, n=args.n, out=args.out,
                       runtime=args.runtime, concurrency=args.concurrency, seed=args.seed,
                       rollouts=args.rollouts, admission=args.admission,
                       overrides={"max_turns": args.max_turns,
                                  "max_new_tokens": args.max_new_tokens,
                                  "temperature": args.temperature},
                       timeout_s=args.timeout_s, max_retries=args.max_retries,
                       device=args.device)
    except (EvalInputError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render_report(res))
    return 1 if res.get("rollouts_exit_code") not in (None, 0) else 0


if __name__ == "__main__":
    sys.exit(main())
