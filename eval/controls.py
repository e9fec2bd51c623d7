"""Environment controls and admission: gold and empty patch per task, admission manifest.

``python -m eval.controls --split S --out DIR [--repeats N --keep-flaky --runtime podman|local
--concurrency C --timeout-s T --task-id ID ...]``

For every task of the split, in fresh sandboxes (design page, "Evaluation"):

* **gold** control: the task's gold patch; expected resolved (graded with the empty control's
  log for attribution);
* **empty** control: no patch; expected F2P not passing and P2P passing.

With ``--repeats N`` both run N times per task, each in a fresh container: a
listed test whose status differs between repeats of the same patch is flaky
(:mod:`eval.grading.flaky`), listed per task in the manifest; a task with a flaky F2P test is not
admitted and a flaky P2P test is dropped from the task's P2P list (``p2p_dropped``, applied
by ``eval.run --admission``), unless ``--keep-flaky``. The counts below read the first repeat,
graded with the P2P list after the drop.

Counts (each with its id list; control ids are ``<task id>:gold`` / ``<task id>:empty``):
``controls``, ``raw_as_expected``, ``strict_as_expected``, ``report_binary_as_expected``,
``unresolved`` (gold not resolved), ``partially_observed`` (a control whose report misses a
listed test or is rejected), ``expectation_mismatches`` (tasks whose gold is not resolved, or
whose empty patch passes an F2P test or fails a P2P test), ``infra_errors``, ``flaky`` (tasks
with a flaky listed test), ``admitted``.

Writes ``DIR/admission.json`` (the manifest :func:`check_admission` verifies):

    {"schema", "kind": "admission", "split", "tasks": {"count", "sha256"}, "images":
     {name: digest}, "parsers": {repo: parser}, "unknown_rule", "admission_rule",
     "admitted": [ids], "not_admitted": {id: [reasons]}, "runtime", "created_at",
     "repeats", "keep_flaky", "flaky_rule", "flaky": {id: {"f2p", "p2p", "statuses",
     "repeats"}}, "p2p_dropped": {id: [test ids]}}

plus ``controls.json`` (counts, ids, per-task details), ``controls.md`` and ``logs/``. Per-task
results are cached in ``DIR/tasks/`` keyed by the task's image digest, eval script and lists,
so a rerun only runs what changed or failed with an infra error.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from eval.files import atomic_write_text as _atomic_write
from eval.files import write_json as wj
from eval.grading.flaky import FLAKY_RULE, find_flaky, flaky_rule
from eval.integrity.retry import RetryPolicy
from eval.tasks.presence import require_task_images, task_image_digests
from eval.tasks.sealed import ids_sha256
from eval.tasks.splits import load_tasks
from eval.tasks.trialspec import task_trial_spec
from sandbox.backend import DEFAULTS, Runtime, SandboxOptions, open_runtime, runtime_from_args
from sandbox.bounds import ArgumentParser, Float, Int, OutDir, Source, Text
from sandbox.trials.pool import VerifierPool

__all__ = ["ADMISSION_RULE", "UNKNOWN_RULE", "AdmissionError", "check_admission",
           "control_counts", "main", "run_controls"]

SCHEMA = 1

#: When an evaluation slot is ``unknown`` (eval.run; recorded in every manifest).
UNKNOWN_RULE = (
    "A slot is unknown when its verifier report is incomplete (a listed FAIL_TO_PASS/PASS_TO_PASS "
    "test has no observed status, or the log is rejected as swebench's get_logs_eval would) and "
    "the same task's empty-patch control did not observe every listed test (no attribution); or "
    "its trial ended in infra_error after the pool's retries; or its rollout is missing; or the "
    "agent's sandbox failed. Incomplete reports with a complete control count as failures "
    "(attributed). Unknown slots stay in the denominator and count as not resolved."
)

#: Which tasks are admitted.
ADMISSION_RULE = (
    "admitted = no control trial ended in infra_error, the gold patch is SWE-bench resolved "
    "with a complete report, and the empty patch's report is complete with no FAIL_TO_PASS "
    "test passing and every PASS_TO_PASS test passing; with repeated controls, no repeat ended in "
    "infra_error and no FAIL_TO_PASS test is flaky (unless --keep-flaky)."
)


class AdmissionError(ValueError):
    """The admission manifest does not match the evaluation (names what changed)."""


def _ids_sha256(ids) -> str:
    return ids_sha256(list(ids))


def _slug(text: str, n: int = 40) -> str:
    import re

    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._-") or "x"
    return f"{s[:n]}-{hashlib.sha256(text.encode()).hexdigest()[:6]}"


def _write_json(path: Path, obj) -> None:
    wj(path, obj)


# ---------------------------------------------------------------------------
# pure counting
# ---------------------------------------------------------------------------


def control_counts(per_task: dict[str, dict]) -> dict:
    """Counts and id lists from per-task control results (pure).

    Args:
        per_task: task id → ``{"gold": g, "empty": e}`` where each of ``g`` / ``e`` has
            ``exit_class``, ``resolved``, ``complete``, ``classification`` {raw,
            report_binary, strict, unknown}, ``f2p_passed`` (int), ``p2p_all_passing``
            (bool); an ``infra_error`` control may hold only ``exit_class``; optional
            ``flaky`` (the task's flaky tests, truthy when any) and ``flaky_reasons`` (reasons
            not to admit from the repeats: a flaky F2P test, an infra error).

    Returns: ``{name: {"count": int, "ids": [...]}}`` for ``controls``, ``raw_as_expected``,
        ``strict_as_expected``, ``report_binary_as_expected``, ``unresolved``,
        ``partially_observed``, ``expectation_mismatches``, ``infra_errors``, ``flaky``,
        ``admitted``,
        plus ``not_admitted``: task id → reasons.
    """
    ids: dict[str, list[str]] = {k: [] for k in (
        "controls", "raw_as_expected", "strict_as_expected", "report_binary_as_expected",
        "unresolved", "partially_observed", "expectation_mismatches", "infra_errors",
        "flaky", "admitted")}
    not_admitted: dict[str, list[str]] = {}
    for tid in sorted(per_task):
        reasons: list[str] = []
        for role in ("gold", "empty"):
            c = per_task[tid].get(role) or {"exit_class": "missing"}
            cid = f"{tid}:{role}"
            ids["controls"].append(cid)
            if c.get("exit_class") in ("infra_error", "missing"):
                ids["infra_errors"].append(cid)
                reasons.append(f"{role}: {c.get('exit_class')}")
                continue
            cl = c.get("classification") or {}
            for key in ("raw", "strict", "report_binary"):
                if cl.get(key):
                    ids[f"{key}_as_expected"].append(cid)
            if not c.get("complete"):
                ids["partially_observed"].append(cid)
                reasons.append(f"{role}: report incomplete")
        g, e = per_task[tid].get("gold") or {}, per_task[tid].get("empty") or {}
        mismatch = []
        if g.get("exit_class") not in ("infra_error", "missing", None) and not g.get("resolved"):
            ids["unresolved"].append(tid)
            mismatch.append("gold not resolved")
        if e.get("exit_class") not in ("infra_error", "missing", None):
            if e.get("f2p_passed", 0) > 0:
                mismatch.append("empty passes FAIL_TO_PASS")
            if not e.get("p2p_all_passing", False):
                mismatch.append("empty fails PASS_TO_PASS")
        if mismatch:
            ids["expectation_mismatches"].append(tid)
            reasons += mismatch
        if per_task[tid].get("flaky"):
            ids["flaky"].append(tid)
        reasons += per_task[tid].get("flaky_reasons") or []
        if reasons:
            not_admitted[tid] = reasons
        else:
            ids["admitted"].append(tid)
    out = {k: {"count": len(v), "ids": v} for k, v in ids.items()}
    out["not_admitted"] = not_admitted
    return out


def render_markdown(result: dict) -> str:
    """``controls.md`` (pure)."""
    c = result["counts"]
    lines = ["# Environment controls", "", f"- split: `{result['split']}`",
             f"- tasks: {result['tasks']['count']} (sha256 `{result['tasks']['sha256'][:16]}`)",
             f"- runtime: `{result['runtime']}`", "",
             "| count | value | ids (first 10) |", "|---|---|---|"]
    for k in ("controls", "raw_as_expected", "strict_as_expected", "report_binary_as_expected",
              "unresolved", "partially_observed", "expectation_mismatches", "infra_errors",
              "flaky", "admitted"):
        shown = ", ".join(c[k]["ids"][:10]) + (" …" if len(c[k]["ids"]) > 10 else "")
        lines.append(f"| {k} | {c[k]['count']} | {shown if k != 'controls' else ''} |")
    lines += ["", f"Admission rule: {ADMISSION_RULE}", "", f"Unknown rule: {UNKNOWN_RULE}", ""]
    flaky = {t: r["flaky"] for t, r in result.get("per_task", {}).items() if r.get("flaky")}
    lines += [f"Repeats per patch: {result.get('repeats', 1)}. Flaky rule: {FLAKY_RULE}", ""]
    if flaky:
        lines += ["## Flaky tests", "", "| task | flaky F2P | flaky P2P (dropped unless "
                  "--keep-flaky) |", "|---|---|---|"]
        lines += [f"| {t} | {', '.join(f['f2p']) or '–'} | {', '.join(f['p2p']) or '–'} |"
                  for t, f in flaky.items()]
        lines.append("")
    if c["not_admitted"]:
        lines += ["## Not admitted", "", "| task | reasons |", "|---|---|"]
        lines += [f"| {t} | {'; '.join(r)} |" for t, r in c["not_admitted"].items()]
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------


def _task_key(task, digest: str | None, repeats: int = 1, keep_flaky: bool = False) -> str:
    blob = json.dumps([task.instance_id, task.image, digest, task.base_commit,
                       hashlib.sha256(task.eval_script.encode()).hexdigest(),
                       hashlib.sha256(task.patch.encode()).hexdigest(),
                       task.FAIL_TO_PASS, task.PASS_TO_PASS, task.log_parser]
                      + ([repeats, keep_flaky] if repeats > 1 or keep_flaky else []))
    return hashlib.sha256(blob.encode()).hexdigest()


def _grade_control(task, res, *, expected: bool, control_log: str | None,
                   p2p: list[str] | None = None) -> dict:
    from eval.grading.grader import grade  # start-up: swebench, ~1 s

    row = {"exit_class": res.exit_class, "trial_id": res.trial_id,  # node: ray's, else ""
           "service_s": res.service_s, "attempts": res.attempts, "node": res.node}
    if res.exit_class == "infra_error":
        return {**row, "error": res.error}
    rep = grade(res.log, f2p=list(task.FAIL_TO_PASS),
                p2p=list(task.PASS_TO_PASS if p2p is None else p2p),
                parser=task.log_parser, control_log=control_log,
                harness_exit=None if res.exit_class == "ok" else res.exit_class,
                expected_resolved=expected)
    return {**row, "resolved": rep.resolved, "complete": rep.complete,
            "attributed": rep.attributed, "utility": rep.utility,
            "classification": dict(rep.classification), "f2p_passed": rep.f2p_passed,
            "p2p_all_passing": rep.p2p_all_passing, "missing": list(rep.missing),
            "log_rejected": rep.log_rejected, "f2p": dict(rep.f2p), "p2p": dict(rep.p2p),
            "parser_disagreements": len(rep.parser_disagreements)}


def run_controls(split: str, out: str | Path, *, runtime: Runtime | SandboxOptions = DEFAULTS,
                 concurrency: int = 2,
                 timeout_s: float | None = None, max_retries: int = 1,
                 task_ids: Sequence[str] | None = None, repeats: int = 1,
                 keep_flaky: bool = False, log: Callable[[str], None] | None = None) -> dict:
    """Run gold + empty controls for every task of ``split`` and write the manifest.

    Args:
        split: task source of :func:`eval.tasks.splits.load_tasks`.
        out: output folder (created; cached per-task results reused).
        runtime: a :class:`sandbox.backend.Runtime` (not closed here) or the options of one
            (made and closed here); its ``kind`` is recorded and decides the digests.
        concurrency: trials at once (>= 1). timeout_s: per-trial limit, seconds (None: from
            the task, :func:`eval.tasks.trialspec.trial_limits`).
        task_ids: only these tasks (a subset manifest: its task sha256 covers the subset).
        repeats: runs of each patch per task (>= 1); flaky tests from 2 on (:mod:`eval.grading.flaky`).
        keep_flaky: admit tasks with flaky F2P tests and keep flaky P2P tests.

    Returns: the ``controls.json`` dict (``counts``, ``per_task``, ``manifest``).

    Raises: ValueError naming ``task_ids`` entries not in the split, a bad concurrency or
    repeats.
    """
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if concurrency < 1:
        raise ValueError(f"--concurrency: must be >= 1, got {concurrency}")
    if repeats < 1:
        raise ValueError(f"--repeats: must be >= 1, got {repeats}")
    t0 = time.time()
    tasks = _select_tasks(split, task_ids)
    kind = runtime.kind
    digests = require_task_images(tasks, split, runtime)  # refused when missing
    out = Path(out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    per_task, todo = _cached_controls(tasks, out, digests, repeats, keep_flaky)
    say(f"controls: {len(tasks)} tasks, {len(tasks) - len(todo)} cached, {len(todo)} to run")
    with open_runtime(runtime, run_id=f"controls-{os.getpid()}") as rt, \
            VerifierPool(rt, max_concurrency=concurrency, retry=RetryPolicy(max_retries=max_retries)) as pool:
        _run_control_pairs(pool, todo, out, timeout_s, per_task, repeats=repeats,
                           keep_flaky=keep_flaky)
    counts = control_counts({tid: {k: r.get(k) for k in ("gold", "empty", "flaky",
                                                         "flaky_reasons")}
                             for tid, r in per_task.items()})
    ids = [t.instance_id for t in tasks]
    manifest = {
        "schema": SCHEMA, "kind": "admission", "split": split,
        "tasks": {"count": len(ids), "sha256": _ids_sha256(ids), "subset": bool(task_ids)},
        "images": digests,
        "parsers": dict(sorted({t.repo: t.log_parser for t in tasks}.items())),
        "unknown_rule": UNKNOWN_RULE, "admission_rule": ADMISSION_RULE,
        "admitted": counts["admitted"]["ids"], "not_admitted": counts["not_admitted"],
        "runtime": kind, "created_at": time.time(),
        "repeats": repeats, "keep_flaky": keep_flaky, "flaky_rule": FLAKY_RULE,
        "flaky": {tid: r["flaky"] for tid, r in sorted(per_task.items()) if r.get("flaky")},
        "p2p_dropped": {tid: r["p2p_dropped"] for tid, r in sorted(per_task.items())
                        if r.get("p2p_dropped")},
    }
    _write_json(out / "admission.json", manifest)
    result = {"schema": SCHEMA, "split": split, "runtime": kind, "tasks": manifest["tasks"],
              "counts": counts, "repeats": repeats, "keep_flaky": keep_flaky,
              "per_task": {tid: {k: v for k, v in r.items() if k != "key"}
                           for tid, r in sorted(per_task.items())},
              "manifest": str(out / "admission.json"), "wall_s": round(time.time() - t0, 3)}
    _write_json(out / "controls.json", result)

    _atomic_write(out / "controls.md", render_markdown(result))
    say(f"controls: admitted {counts['admitted']['count']}/{len(ids)}; "
        f"{counts['flaky']['count']} tasks with flaky tests; manifest {out / 'admission.json'}")
    return result


def _select_tasks(split: str, task_ids: Sequence[str] | None) -> list:
    """The split's tasks, or only ``task_ids`` of them (in split order).

    Raises: ValueError naming ``task_ids`` entries not in the split.
    """
    tasks = load_tasks(split, purpose="eval")
    if task_ids:
        known = {t.instance_id for t in tasks}
        unknown = [i for i in task_ids if i not in known]
        if unknown:
            raise ValueError(f"--task-id: not in {split}: {unknown[:10]}")
        wanted = set(task_ids)
        tasks = [t for t in tasks if t.instance_id in wanted]
    return tasks


def _cached_controls(tasks: list, out: Path, digests: dict, repeats: int = 1,
                     keep_flaky: bool = False) -> tuple[dict[str, dict], list]:
    """Reuse ``out/tasks/<slug>.json`` when its key matches and no trial hit an infra
    error. Returns (task id → cached row, ``[(task, key, path)]`` still to run)."""
    per_task: dict[str, dict] = {}
    todo = []
    for t in tasks:
        key = _task_key(t, digests.get(t.image), repeats, keep_flaky)
        cp = out / "tasks" / f"{_slug(t.instance_id)}.json"
        if cp.is_file():
            try:
                cached = json.loads(cp.read_text())
            except json.JSONDecodeError:
                cached = None
            trials = [] if not cached else [cached.get("gold"), cached.get("empty")] + [
                r.get(role) for r in cached.get("repeats") or [] for role in ("gold", "empty")]
            if cached and cached.get("key") == key and all(
                    (c or {}).get("exit_class") != "infra_error" for c in trials):
                per_task[t.instance_id] = cached
                continue
        todo.append((t, key, cp))
    return per_task, todo


def _run_control_pairs(pool, todo: list, out: Path, timeout_s: float,
                       per_task: dict[str, dict], *, repeats: int = 1,
                       keep_flaky: bool = False) -> None:
    """``repeats`` empty + gold trials of every ``todo`` task, graded (gold with the empty log
    for attribution), logs and per-task rows (:func:`_control_row`) written; rows added to
    ``per_task``."""
    futs = []
    for t, key, cp in todo:
        sid = f"{_slug(t.instance_id)}-{uuid.uuid4().hex[:6]}"
        pairs = []
        for k in range(repeats):
            tag = f"-r{k}" if k else ""
            fe = pool.submit(task_trial_spec(t, "", f"ctl-empty{tag}-{sid}",
                                             timeout_s=timeout_s,
                                             labels={"ecredit.role": "control"}))
            fg = pool.submit(task_trial_spec(t, t.patch, f"ctl-gold{tag}-{sid}",
                                             timeout_s=timeout_s,
                                             labels={"ecredit.role": "control"}))
            pairs.append((fe, fg))
        futs.append((t, key, cp, pairs))
    for t, key, cp, pairs in futs:
        results = [(fe.result(), fg.result()) for fe, fg in pairs]
        for res in (r for pair in results for r in pair):
            _atomic_write(out / "logs" / f"{res.trial_id}.log", res.log)
        row = {"key": key, "task_id": t.instance_id, "repo": t.repo, "image": t.image,
               **_control_row(t, results, keep_flaky)}
        _write_json(cp, row)
        per_task[t.instance_id] = row


def _control_row(t, results: list, keep_flaky: bool) -> dict:
    """Grade every (empty, gold) repeat, name the flaky listed tests, apply the flaky rule;
    ``gold`` / ``empty`` are the first repeat graded with the P2P list after the drop."""
    def pair(re_, rg, p2p=None) -> tuple[dict, dict]:
        ctl = re_.log if re_.exit_class == "ok" else None
        return (_grade_control(t, rg, expected=True, control_log=ctl, p2p=p2p),
                _grade_control(t, re_, expected=False, control_log=None, p2p=p2p))

    graded = [pair(re_, rg) for re_, rg in results]
    seen = {role: [{**g.get("f2p", {}), **g.get("p2p", {})} for g in rows
                   if g["exit_class"] != "infra_error"]
            for role, rows in (("gold", [g for g, _ in graded]), ("empty", [e for _, e in graded]))}
    fl = find_flaky(seen, t.FAIL_TO_PASS, t.PASS_TO_PASS) if len(results) > 1 else None
    reasons, p2p, dropped = flaky_rule(fl, t.PASS_TO_PASS, keep_flaky=keep_flaky) if fl else (
        [], list(t.PASS_TO_PASS), [])
    reasons += [f"repeat {k} {role}: infra_error" for k, (g, e) in enumerate(graded) if k
                for role, c in (("gold", g), ("empty", e)) if c["exit_class"] == "infra_error"]
    gold, empty = pair(*results[0], p2p=p2p) if dropped else graded[0]
    return {"gold": gold, "empty": empty,
            "repeats": [{"gold": {k: g.get(k) for k in ("exit_class", "trial_id", "resolved")},
                         "empty": {k: e.get(k) for k in ("exit_class", "trial_id", "resolved")}}
                        for g, e in graded[1:]],
            "flaky": fl.to_json() if fl and fl.any else None, "flaky_reasons": reasons,
            "p2p_dropped": dropped}


def check_admission(manifest_path: str | Path, tasks: Sequence, *,
                    runtime: Runtime | SandboxOptions = DEFAULTS) -> dict:
    """Verify that ``tasks`` and their images are those an admission manifest was written for.

    Args:
        manifest_path: ``admission.json`` (or the controls folder holding it).
        tasks: the evaluation's task list.
        runtime: a runtime or its options: ``kind="podman"`` checks every image digest now
            (:func:`eval.tasks.presence.task_image_digests`); ``"local"`` skips digests
            (images unused).

    Returns: ``{"path", "sha256" (of the manifest file), "split", "tasks_sha256",
        "admitted", "not_admitted": [ids], "unknown_rule", "repeats", "flaky": {id: ...},
        "p2p_dropped": {id: [test ids]}}`` for the results (``eval.run`` grades without the
        dropped P2P tests).

    Raises:
        FileNotFoundError: no manifest at the path.
        AdmissionError: not a manifest, another task list (sha256 differs), another image set,
            or an image whose digest changed (each named).
    """
    p = Path(manifest_path)
    if p.is_dir():
        p = p / "admission.json"
    if not p.is_file():
        raise FileNotFoundError(f"--admission: no manifest at {p}")
    raw = p.read_bytes()
    try:
        man = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise AdmissionError(f"--admission {p}: not valid JSON ({exc.msg})") from None
    if not isinstance(man, dict) or man.get("kind") != "admission":
        raise AdmissionError(f"--admission {p}: field 'kind' is not 'admission'")
    ids = [t.instance_id for t in tasks]
    sha = _ids_sha256(ids)
    want = (man.get("tasks") or {}).get("sha256")
    if want != sha:
        raise AdmissionError(f"--admission {p}: task list changed (sha256 {sha[:12]} of "
                             f"{len(ids)} tasks != manifest {str(want)[:12]} of "
                             f"{(man.get('tasks') or {}).get('count')} tasks)")
    images = man.get("images") or {}
    now_images = sorted({t.image for t in tasks})
    if sorted(images) != now_images:
        extra = sorted(set(now_images) - set(images))
        gone = sorted(set(images) - set(now_images))
        raise AdmissionError(f"--admission {p}: images changed (new: {extra[:5]}, "
                             f"no longer used: {gone[:5]})")
    kind = runtime.kind
    if kind == "podman":
        now = task_image_digests(now_images, runtime)
        changed = [f"{name}: {images[name]} -> {now[name]}" for name in now_images
                   if images[name] != now[name]]
        if changed:
            raise AdmissionError(f"--admission {p}: image digest changed: {'; '.join(changed[:5])}")
    return {"path": str(p.resolve()), "sha256": hashlib.sha256(raw).hexdigest(),
            "split": man.get("split"), "tasks_sha256": sha,
            "admitted": len(man.get("admitted") or []),
            "not_admitted": sorted(man.get("not_admitted") or {}),
            "digests_checked": kind == "podman", "unknown_rule": man.get("unknown_rule"),
            "repeats": man.get("repeats", 1), "flaky": man.get("flaky") or {},
            "p2p_dropped": man.get("p2p_dropped") or {}}


def main(argv: Sequence[str] | None = None) -> int:
    """CLI. Exit 0 when every task is admitted, 1 when some are not, 2 on bad input."""
    ap = ArgumentParser(prog="python -m eval.controls", description="Gold and "
                                 "empty-patch controls per task; admission manifest.")
    ap.add_argument("--split", type=Source(), required=True, help="task source (eval.tasks.splits.load_tasks)")
    ap.add_argument("--out", type=OutDir(), required=True, help="output folder")
    SandboxOptions.add_args(ap)  # --runtime and the sandbox backend flags
    ap.add_argument("--concurrency", type=Int(ge=1), default=2)
    ap.add_argument("--timeout-s", type=Float(gt=0, why="seconds"), default=None,
                    help="per-trial limit, seconds (default: from the task, eval.trial"
                         "spec.trial_limits: 1800 for SWE-bench-format image tasks, 600 for bundled)")
    ap.add_argument("--max-retries", type=Int(ge=0), default=1)
    ap.add_argument("--task-id", type=Text(), dest="task_ids", action="append", default=None,
                    help="only these tasks (repeatable)")
    ap.add_argument("--repeats", type=Int(ge=1), default=1,
                    help="runs of the gold and of the empty patch per task (flaky tests from 2)")
    ap.add_argument("--keep-flaky", action="store_true",
                    help="admit tasks with flaky FAIL_TO_PASS tests, keep flaky PASS_TO_PASS")
    args = ap.parse_args(argv)
    try:
        res = run_controls(args.split, args.out, runtime=runtime_from_args(args, "controls"),
                           concurrency=args.concurrency, timeout_s=args.timeout_s,
                           max_retries=args.max_retries, task_ids=args.task_ids,
                           repeats=args.repeats, keep_flaky=args.keep_flaky)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render_markdown(res))
    c = res["counts"]
    return 0 if c["admitted"]["count"] == res["tasks"]["count"] else 1


if __name__ == "__main__":
    sys.exit(main())
