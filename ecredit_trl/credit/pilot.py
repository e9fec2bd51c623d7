"""The signal pilot: replay trajectories, verify each artifact and one ablation, tabulate D.

``python -m ecredit_trl.credit.pilot --tasks SOURCE --trajectories FILE --out DIR
[--seed N --credit-lambda X --credit-cap X --concurrency N --runtime podman|local]``

Per trajectory (DESIGN.md §3, issue 4), in file order:

1. ``format_error`` rollouts are excluded (reason ``format_error``; a rollout whose
   writes cannot be replayed onto its repository counts here too, with the
   replay error as ``exclusion_detail``).
2. Replay → snapshots ``S_0..S_K`` → edit blocks → eligibility → verifier-blind
   selection (:func:`ecredit_trl.credit.blocks.select_block`). No eligible block →
   excluded (``no_eligible_block``). Otherwise the ablated artifact is built.
   **All selections are written to ``selections.jsonl`` before the first trial
   is submitted.**
3. One factual trial per admitted rollout, graded with :func:`eval.grading.grade`
   against the task's fixed FAIL_TO_PASS/PASS_TO_PASS lists, with the task's
   empty-patch control log for attribution (the control runs once per task and
   is cached in ``DIR/controls/``). No utility → excluded (``no_original_utility``).
4. At most one counterfactual trial (the ablated artifact), then
   ``D = U(P) − U(P\\b)`` (None when either side is unavailable) and the shared
   shrinkage ``s`` / cap flag / m / L of :func:`ecredit_trl.credit.coefficients.credit_stats`
   (arm M).

A trial that ends in ``infra_error`` (after the pool's retries) has no utility; any
other exit class (``ok``, ``apply_failed``, ``timeout``, ``oom``) is graded, so a
missing observation is attributed to the artifact only when the task's control
observed every listed test (DESIGN.md §3 "Utility").

Outputs (each written atomically: temp file + rename): ``selections.jsonl``,
``trials.jsonl`` (every trial submitted, controls included), ``records.jsonl``
(one per trajectory), ``pilot.json`` (:func:`pilot_table`), ``pilot.md``
(:func:`render_markdown`), ``logs/<trial_id>.log``.

source: DESIGN.md §3; issue 4
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import as_completed
from dataclasses import asdict
from pathlib import Path

from ecredit_trl.credit.blocks import (
    DEFAULT_TEST_PATTERNS,
    SelectionRecord,
    ablate,
    edit_blocks,
    eligibility,
)
from ecredit_trl.credit.coefficients import credit_stats
from ecredit_trl.credit.trajectory import (
    ReplayError,
    Trajectory,
    load_trajectories,
    replay,
    token_turns,
)
from eval.files import atomic_write_text
from sandbox.snapshot import artifact as _artifact

__all__ = [
    "EXCLUSIONS",
    "contrast",
    "pilot_table",
    "render_markdown",
    "run_pilot",
    "main",
]

EXCLUSIONS: tuple[str, ...] = ("format_error", "no_eligible_block", "no_original_utility")
"""Exclusion reasons, in the order they are applied (DESIGN.md §3)."""

DEFAULT_CREDIT_LAMBDA = 0.5  # the trainer's defaults (ECreditConfig)
DEFAULT_CREDIT_CAP = 1.0
# Only a trial whose eval script ran to its end is graded: a timeout, an artifact that
# does not apply or an OOM kill gives no utility (issue "Run records": none of them may
# become a reward), the same rule as the trainer's.
GRADED_EXIT_CLASSES = ("ok",)


# ----------------------------------------------------------------------------
# pure helpers
# ----------------------------------------------------------------------------


def contrast(u_p: float | None, u_pb: float | None) -> float | None:
    """``D = U(P) − U(P\\b)``; None when either utility is None (DESIGN.md §3 "Contrast")."""
    if u_p is None or u_pb is None:
        return None
    return float(u_p) - float(u_pb)


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

    source: issue 4 (table), DESIGN.md §3 (query bound)
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

    def signs(rs: Iterable[dict]) -> dict:
        ds = [r["D"] for r in rs if r["D"] is not None]
        return {"nonzero": sum(d != 0 for d in ds), "positive": sum(d > 0 for d in ds),
                "negative": sum(d < 0 for d in ds), "zero": sum(d == 0 for d in ds)}

    all_signs = signs(usable)
    failed = [r for r in usable if not r["resolved_P"]]
    f_signs = signs(failed)
    with_d = [r for r in usable if r["D"] is not None]

    run = [t for t in trials if not t.get("cached")]
    run_fc = [t for t in run if t["role"] in ("factual", "counterfactual")]
    per_rollout: dict[str, Counter] = {"factual": Counter(), "counterfactual": Counter()}
    for t in trials:
        if t["role"] in per_rollout:
            per_rollout[t["role"]][(t["task_id"], t["rollout_index"])] += 1
    max_f = max(per_rollout["factual"].values(), default=0)
    max_cf = max(per_rollout["counterfactual"].values(), default=0)
    retries_by_role = {role: sum(max(0, int(t.get("attempts", 1)) - 1)
                                 for t in run if t["role"] == role)
                       for role in ("control", "factual", "counterfactual")}
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
    table["identities"] = {
        "planned_eq_excluded_plus_usable":
            table["planned"] == sum(excluded.values()) + table["usable"],
        "nonzero_eq_positive_plus_negative":
            table["nonzero"] == table["positive"] + table["negative"],
    }
    return table


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
        "D = U(P) − U(P\\b); U = f2p_passed/|F2P| − 1[any P2P not passing] (DESIGN.md §3). "
        "s, m, L as arm M's shared shrinkage.",
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# I/O helpers
# ----------------------------------------------------------------------------


def _atomic_write(path: Path, text: str) -> None:
    atomic_write_text(path, text)


def _jsonl(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def _slug(text: str, n: int = 48) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._-") or "x"
    h = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{s[:n]}-{h}"


def _grade_summary(rep) -> dict:
    return {"utility": rep.utility, "resolved": rep.resolved, "complete": rep.complete,
            "attributed": rep.attributed, "control_complete": rep.control_complete,
            "missing": list(rep.missing), "f2p": dict(rep.f2p), "p2p": dict(rep.p2p),
            "log_rejected": rep.log_rejected, "f2p_passed": rep.f2p_passed,
            "p2p_all_passing": rep.p2p_all_passing}


# ----------------------------------------------------------------------------
# the pilot
# ----------------------------------------------------------------------------


def _control_key(task) -> str:
    blob = json.dumps([task.instance_id, task.image, task.base_commit,
                       hashlib.sha256(task.eval_script.encode()).hexdigest()])
    return hashlib.sha256(blob.encode()).hexdigest()


def run_pilot(tasks: Sequence, trajectories: Sequence[Trajectory], out_dir, *,
              seed: int = 0, credit_lambda: float = DEFAULT_CREDIT_LAMBDA,
              credit_cap: float = DEFAULT_CREDIT_CAP, concurrency: int = 2,
              runtime="podman", max_retries: int = 1, timeout_s: float = 600.0,
              test_patterns: Sequence[str] = DEFAULT_TEST_PATTERNS,
              log: Callable[[str], None] | None = None) -> dict:
    """Run the signal pilot and write its files into ``out_dir``.

    Args:
        tasks: :class:`eval.tasks.Task` list; every trajectory's ``task_id`` must
            be one of their ``instance_id`` s and those tasks need a ``repo_dir``
            (the local git repository the replay checks out).
        trajectories: the rollouts (:func:`ecredit_trl.credit.trajectory.load_trajectories`).
        out_dir: output folder (created; files in it are replaced).
        seed: run seed of the selection RNG.
        credit_lambda, credit_cap: λ >= 0 and c > 0 for s / cap flag (arm M).
        concurrency: verifier trials at once (>= 1).
        runtime: ``"podman"``, ``"local"`` or a runtime object with
            ``run_trial(spec) -> TrialResult`` (not closed by the pilot).
        max_retries: infra retries per trial (counted, never hidden).
        timeout_s: wall-clock limit of one trial (seconds).
        test_patterns: test-path patterns for eligibility.
        log: progress printer (default: stderr).

    Returns:
        The pilot table (:func:`pilot_table`) plus ``meta``.

    Raises:
        ValueError: a trajectory names an unknown task, a needed task has no
            ``repo_dir``, or a bad λ/c/concurrency.

    source: DESIGN.md §3; issue 4
    """
    from eval.grading import grade
    from eval.trialspec import task_trial_spec
    from sandbox import VerifierPool, make_runtime

    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if concurrency < 1:
        raise ValueError(f"concurrency: must be >= 1, got {concurrency}")
    credit_stats("M", contrast=None, token_turn=token_turns(Trajectory("x", 0, False, ())),
                 selected_turn=None, credit_lambda=credit_lambda, credit_cap=credit_cap)
    by_id = {t.instance_id: t for t in tasks}
    unknown = sorted({tr.task_id for tr in trajectories} - set(by_id))
    if unknown:
        raise ValueError(f"trajectories: unknown task_id(s) {unknown[:10]} (not in the task list)")
    no_repo = sorted({tr.task_id for tr in trajectories
                      if not tr.format_error and not by_id[tr.task_id].repo_dir})
    if no_repo:
        raise ValueError(f"tasks: no repo_dir for {no_repo[:10]}; replay needs the task's "
                         "git repository locally")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    (out / "controls").mkdir(exist_ok=True)
    t_start = time.time()
    records: list[dict] = []
    work_root = Path(tempfile.mkdtemp(prefix="ecredit-pilot-"))

    # -- phase A: replay, blocks, selection, ablation (no trial runs) ----------
    try:
        for i, tr in enumerate(trajectories):
            tt = token_turns(tr)
            rec: dict = {"task_id": tr.task_id, "rollout_index": tr.rollout_index,
                         "K": tr.K, "L": tr.L, "exclusion": None, "exclusion_detail": None,
                         "trajectory_extra": tr.extra, "selection": None, "ablation": None}
            records.append(rec)
            if tr.format_error:
                rec["exclusion"] = "format_error"
                continue
            task = by_id[tr.task_id]
            work = work_root / f"r{i}"
            try:
                snaps = replay(tr, task.repo_dir, task.base_commit, work)
            except ReplayError as exc:
                rec["exclusion"] = "format_error"
                rec["exclusion_detail"] = f"replay: {exc}"
                continue
            blocks = edit_blocks(work, snaps)
            judged = eligibility(work, snaps, blocks, test_patterns=test_patterns)
            sel = SelectionRecord.build(task_id=tr.task_id, rollout_index=tr.rollout_index,
                                        run_seed=seed, blocks=blocks, judged=judged,
                                        test_patterns=test_patterns)
            rec["selection"] = sel.to_json()
            rec["snapshots"] = snaps
            rec["selected_turn"] = sel.selected_turn
            rec["selected_paths"] = sel.selected_paths
            rec["eligible_turns"] = sel.eligible_turns
            if sel.selected_turn is None:
                rec["exclusion"] = "no_eligible_block"
                continue
            block = next(b for b in blocks if b.turn == sel.selected_turn)
            abl = ablate(work, snaps, block)
            rec["_factual_artifact"] = _artifact(work, snaps[0], snaps[-1])
            rec["_ablated_artifact"] = abl.artifact
            rec["ablation"] = abl.to_json()
            rec["factual_artifact_bytes"] = len(rec["_factual_artifact"].encode(
                "utf-8", errors="surrogateescape"))
            cs0 = credit_stats("M", contrast=None, token_turn=tt,
                               selected_turn=sel.selected_turn, credit_lambda=credit_lambda,
                               credit_cap=credit_cap)
            rec["m"], rec["L"] = cs0.m, cs0.L
    finally:
        shutil.rmtree(work_root, ignore_errors=True)

    selections = [{"task_id": r["task_id"], "rollout_index": r["rollout_index"],
                   "exclusion": r["exclusion"], "selection": r["selection"],
                   "written_at": time.time()} for r in records]
    _atomic_write(out / "selections.jsonl", _jsonl(selections))
    selections_written_at = time.time()
    admitted = [r for r in records if r["exclusion"] is None]
    say(f"pilot: {len(records)} planned, {len(admitted)} with a selected block; "
        f"selections written to {out / 'selections.jsonl'}")

    # -- phase B/C: controls, factual, counterfactual trials --------------------
    own_rt = isinstance(runtime, str)
    rt = make_runtime(runtime, run_id=f"pilot-{os.getpid()}") if own_rt else runtime
    trial_rows: list[dict] = []
    first_trial_at: float | None = None

    def row_of(res, role: str, task_id: str, rollout_index, cached=False) -> dict:
        d = res.to_json(with_log=False) if hasattr(res, "to_json") else dict(res)
        d.update(role=role, task_id=task_id, rollout_index=rollout_index, cached=cached)
        if not cached:
            lp = out / "logs" / f"{d['trial_id']}.log"
            _atomic_write(lp, res.log)
            d["log_path"] = str(lp.relative_to(out))
        return d

    try:
        with VerifierPool(rt, max_concurrency=concurrency, max_retries=max_retries) as pool:
            first_trial_at = time.time()
            controls: dict[str, dict] = {}  # task_id -> {"log", "exit_class"}
            ctrl_fut = {}
            for task_id in sorted({r["task_id"] for r in admitted}):
                task = by_id[task_id]
                cpath = out / "controls" / f"{_slug(task_id)}.json"
                key = _control_key(task)
                if cpath.exists():
                    try:
                        cached = json.loads(cpath.read_text())
                    except (OSError, json.JSONDecodeError):
                        cached = None
                    if cached and cached.get("key") == key and cached.get("exit_class") == "ok":
                        controls[task_id] = cached
                        trial_rows.append({"role": "control", "task_id": task_id,
                                           "rollout_index": None, "cached": True,
                                           "trial_id": cached["trial_id"],
                                           "exit_class": cached["exit_class"],
                                           "attempts": 0, "service_s": 0.0})
                        continue
                spec = task_trial_spec(task, "", f"control-{_slug(task_id)}",
                                       timeout_s=timeout_s, labels={"ecredit.role": "control"})
                ctrl_fut[task_id] = pool.submit(spec)
            fact_fut = {}
            for i, r in enumerate(records):
                if r["exclusion"] is not None:
                    continue
                spec = task_trial_spec(by_id[r["task_id"]], r["_factual_artifact"],
                                       f"{_slug(r['task_id'])}-r{r['rollout_index']}-fact",
                                       timeout_s=timeout_s, labels={"ecredit.role": "factual"})
                fact_fut[pool.submit(spec)] = i

            def control_log(task_id: str) -> str | None:
                if task_id not in controls:
                    res = ctrl_fut[task_id].result()
                    trial_rows.append(row_of(res, "control", task_id, None))
                    c = {"key": _control_key(by_id[task_id]), "trial_id": res.trial_id,
                         "exit_class": res.exit_class, "log": res.log}
                    if res.exit_class == "ok":
                        _atomic_write(out / "controls" / f"{_slug(task_id)}.json",
                                      json.dumps(c, sort_keys=True))
                    controls[task_id] = c
                c = controls[task_id]
                return c["log"] if c["exit_class"] == "ok" else None

            def utility_of(res, task, ctrl: str | None):
                if res.exit_class not in GRADED_EXIT_CLASSES:
                    return None, None
                rep = grade(res.log, f2p=task.FAIL_TO_PASS, p2p=task.PASS_TO_PASS,
                            parser=task.log_parser, control_log=ctrl)
                return rep.utility, _grade_summary(rep)

            cf_fut = {}
            done_f = 0
            for fut in as_completed(fact_fut):
                i = fact_fut[fut]
                r = records[i]
                task = by_id[r["task_id"]]
                res = fut.result()
                frow = row_of(res, "factual", r["task_id"], r["rollout_index"])
                trial_rows.append(frow)
                u, g = utility_of(res, task, control_log(r["task_id"]))
                r["trials"] = {"factual": frow, "counterfactual": None}
                r["grades"] = {"factual": g, "counterfactual": None}
                r["U_P"] = u
                r["resolved_P"] = bool(g and g["resolved"])
                done_f += 1
                if u is None:
                    r["exclusion"] = "no_original_utility"
                    r["exclusion_detail"] = (f"factual trial {res.exit_class}"
                                             if g is None else "incomplete report, no attribution")
                    continue
                spec = task_trial_spec(task, r["_ablated_artifact"],
                                       f"{_slug(r['task_id'])}-r{r['rollout_index']}-cf",
                                       timeout_s=timeout_s,
                                       labels={"ecredit.role": "counterfactual"})
                cf_fut[pool.submit(spec)] = i
            say(f"pilot: {done_f} factual trials graded, {len(cf_fut)} counterfactual queued")
            for fut in as_completed(cf_fut):
                i = cf_fut[fut]
                r = records[i]
                task = by_id[r["task_id"]]
                res = fut.result()
                row = row_of(res, "counterfactual", r["task_id"], r["rollout_index"])
                trial_rows.append(row)
                u, g = utility_of(res, task, control_log(r["task_id"]))
                r["trials"]["counterfactual"] = row
                r["grades"]["counterfactual"] = g
                r["U_Pb"] = u
                r["resolved_Pb"] = bool(g and g["resolved"])
    finally:
        if own_rt:
            rt.close()

    # -- D, s, cap flag --------------------------------------------------------
    traj_by_key = {(t.task_id, t.rollout_index): t for t in trajectories}
    for r in records:
        for k in ("_factual_artifact", "_ablated_artifact"):
            r.pop(k, None)
        if r["exclusion"] is not None:
            continue
        d = contrast(r.get("U_P"), r.get("U_Pb"))
        r["D"] = d
        tt = token_turns(traj_by_key[(r["task_id"], r["rollout_index"])])
        cs = credit_stats("M", contrast=d, token_turn=tt, selected_turn=r["selected_turn"],
                          credit_lambda=credit_lambda, credit_cap=credit_cap)
        r["s"], r["cap_active"], r["m"], r["L"] = cs.s, cs.cap_active, cs.m, cs.L
        r["credit_M"] = asdict(cs)

    table = pilot_table(records, trial_rows)
    meta = {"tasks": len({r["task_id"] for r in records}), "trajectories": len(records),
            "seed": seed, "credit_lambda": credit_lambda, "credit_cap": credit_cap,
            "runtime": runtime if isinstance(runtime, str) else type(runtime).__name__,
            "concurrency": concurrency, "max_retries": max_retries,
            "test_patterns": list(test_patterns), "wall_s": time.time() - t_start,
            "selections_written_at": selections_written_at, "first_trial_at": first_trial_at,
            "selections_before_trials": (first_trial_at is None
                                         or selections_written_at <= first_trial_at)}
    table["meta"] = meta
    _atomic_write(out / "trials.jsonl", _jsonl(trial_rows))
    _atomic_write(out / "records.jsonl", _jsonl(records))
    _atomic_write(out / "pilot.json", json.dumps(table, indent=2, sort_keys=True) + "\n")
    _atomic_write(out / "pilot.md", render_markdown(table, meta))
    say(f"pilot: usable {table['usable']}, D>0 {table['positive']}, D<0 {table['negative']}, "
        f"D=0 {table['zero']}; query bound {'ok' if table['query_bound']['ok'] else 'VIOLATED'}")
    return table


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------


def _run_credit_config(trajectories: Path) -> dict:
    """λ and c of the training run that wrote ``trajectories`` (its ``config.json``), if any."""
    cfg_path = trajectories.resolve().parent / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text()).get("ecredit", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: float(cfg[k]) for k in ("credit_lambda", "credit_cap") if k in cfg}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns 0 when the table's identities and the query bound hold."""
    ap = argparse.ArgumentParser(prog="python -m ecredit_trl.credit.pilot",
                                 description="Signal pilot: verify artifacts and one ablation "
                                             "each, tabulate D (DESIGN.md §3).")
    ap.add_argument("--tasks", required=True, help="task source for eval.splits.load_tasks "
                    "(bundled, a .jsonl path, ...)")
    ap.add_argument("--trajectories", required=True, help="trajectory JSONL (replay format)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--seed", type=int, default=0, help="run seed of the selection RNG")
    ap.add_argument("--credit-lambda", type=float, default=DEFAULT_CREDIT_LAMBDA)
    ap.add_argument("--credit-cap", type=float, default=DEFAULT_CREDIT_CAP)
    ap.add_argument("--concurrency", type=int, default=2, help="verifier trials at once")
    ap.add_argument("--runtime", choices=("podman", "local"), default="podman")
    ap.add_argument("--max-retries", type=int, default=1, help="infra retries per trial")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per-trial limit, seconds")
    ap.add_argument("--test-pattern", action="append", default=None,
                    help="test-path pattern (repeatable; default: DESIGN §3 defaults)")
    args = ap.parse_args(argv)
    from eval.splits import load_tasks

    if not Path(args.trajectories).is_file():
        print(f"error: --trajectories: no such file {args.trajectories}", file=sys.stderr)
        return 2
    run_cfg = _run_credit_config(Path(args.trajectories))
    for key in ("credit_lambda", "credit_cap"):
        given = getattr(args, key)
        if key in run_cfg and abs(run_cfg[key] - given) > 1e-12:
            print(f"warning: --{key.replace('_', '-')} {given} differs from the run's "
                  f"{key} {run_cfg[key]} (config.json beside the trajectories); shrinkage and "
                  "cap figures follow the command line", file=sys.stderr)
    try:
        tasks = load_tasks(args.tasks)
        trajs = load_trajectories(args.trajectories)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = run_pilot(tasks, trajs, args.out, seed=args.seed, credit_lambda=args.credit_lambda,
                      credit_cap=args.credit_cap, concurrency=args.concurrency,
                      runtime=args.runtime, max_retries=args.max_retries,
                      timeout_s=args.timeout_s,
                      test_patterns=tuple(args.test_pattern or DEFAULT_TEST_PATTERNS))
    print(render_markdown(table, table["meta"]))
    ok = all(table["identities"].values()) and table["query_bound"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
