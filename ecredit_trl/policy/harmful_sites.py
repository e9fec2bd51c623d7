"""Where a task's harmful edit goes, screened once with real verifier trials.

The positive control's warm start (:mod:`ecredit_trl.policy.demos`, variant ``harmful``) adds,
after the fix, an edit block that breaks a PASS_TO_PASS test: ``return None`` right below the
``def`` line of a function the task's PASS_TO_PASS tests exercise (:mod:`eval.tasks.harmful`).
"Known by construction" is checked, not assumed: for each task the candidates
(:func:`candidate_edits`, pure) are tried in order with a real verifier trial of
*gold patch + harmful edit* until one is complete and not resolved with a PASS_TO_PASS test
failing, next to one trial of the gold patch alone that must resolve. The first candidate
that passes is the task's harmful edit; a task with none (or whose gold trial does not
resolve) stays plain and is counted with its reason.

Results are cached per task in ``<cache>/harmful/<key>.json``, ``key`` = sha256 of
:data:`SITE_RULE`, the task id, base commit, gold patch, eval script and image, so a screened
task is never re-screened (written by temp + rename).

Site rule (why): another library file than the fixed ones when one has a candidate, so the fix
blocks stay eligible (the last-touch rule is per path, see the design page, "Edit
blocks and eligibility"); else the fixed file itself
(the harmful block is then that file's last touch and the only eligible block); never inside
a function the fix changes (the fix must still be what makes FAIL_TO_PASS pass).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import subprocess
import tempfile
from pathlib import Path

from ecredit_trl.agent.env import _clone_at
from ecredit_trl.runs.outcomes import trial_retry
from eval.files import atomic_write_text
from eval.tasks.bundled.recipe import cache_dir as default_cache
from eval.tasks.harmful import HARMFUL_LINE, HarmfulEdit
from eval.tasks.trialspec import task_trial_spec
from sandbox.backend import DEFAULTS, Runtime, SandboxOptions, open_runtime
from sandbox.trials.pool import VerifierPool

__all__ = ["SITE_RULE", "candidate_edits", "harmful_edit_patch", "harmful_meta",
           "library_files", "recipe_harmful_edits", "screen_harmful_edits"]

#: Bump when the candidate rule or the screening criterion changes (part of the cache key).
SITE_RULE = "harmful-sites-v1"

#: Candidates tried per task before it is left plain (each costs one verifier trial).
MAX_TRIES = 3

#: Other-file candidates tried before the fixed files' (a name match across modules is weaker
#: evidence that the task's tests exercise the function than one in the module under test).
OTHER_FIRST = 1

_TEST_NAME = re.compile(r"::(?:[A-Za-z_]\w*::)*(test_?\w*)")


def _is_test_path(rel: str) -> bool:
    parts = Path(rel).parts
    name = parts[-1]
    return (name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
            or "tests" in parts or "testing" in parts or "test" in parts)


def library_files(paths: list[str], fix_paths: list[str]) -> list[str]:
    """Library ``.py`` files a harmful edit may go to: in the package folder of the first
    fixed file or below it, not test files (the default test-path patterns), sorted."""
    top = Path(fix_paths[0]).parent
    out = []
    for p in paths:
        rp = Path(p)
        if p.endswith(".py") and not _is_test_path(p) and (rp.parent == top or top in rp.parents):
            out.append(p)
    return sorted(out)


def _covered_names(p2p: list[str]) -> dict[str, int]:
    """Test function name (``test_`` prefix removed) → number of PASS_TO_PASS ids."""
    out: dict[str, int] = {}
    for tid in p2p:
        m = _TEST_NAME.search(tid)
        if m:
            name = m.group(1).removeprefix("test_").removeprefix("test")
            out[name] = out.get(name, 0) + 1
    return out


def _sites(path: str, text: str, avoid: set[int]) -> list[tuple[str, HarmfulEdit]]:
    """(function name, edit) for each function of ``text`` whose one-line ``def`` header is
    unique (stripped, and as a full line), whose body starts on a later line, that contains
    none of the ``avoid`` lines, and whose edited text still parses."""
    lines = text.split("\n")
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first, last = node.lineno, node.end_lineno or node.lineno
        if any(first - 1 <= a <= last for a in avoid) or node.body[0].lineno <= first:
            continue
        full = lines[first - 1]
        stripped = full.strip()
        if (not stripped.startswith(("def ", "async def ")) or not stripped.endswith(":")
                or text.count(stripped) != 1 or text.count(full + "\n") != 1):
            continue
        body_indent = " " * node.body[0].col_offset
        new = f"{full}\n{body_indent}{HARMFUL_LINE}"
        edited = text.replace(full + "\n", new + "\n", 1)
        try:
            ast.parse(edited)
        except SyntaxError:
            continue
        out.append((node.name, HarmfulEdit(path, stripped, HARMFUL_LINE, full, new)))
    return out


def candidate_edits(texts: dict[str, str], fix_lines: dict[str, set[int]], p2p: list[str],
                    seed: str) -> list[HarmfulEdit]:
    """Ordered harmful-edit candidates of one task (pure).

    Args:
        texts: library path → text *after the gold patch* (fixed files) or at base (others).
        fix_lines: fixed path → 1-based lines the gold patch changes (in the gold text).
        p2p: the task's PASS_TO_PASS ids. A test's *target* is the library function with the
            longest name (3+ characters) that its name (``test_`` removed) starts with
            (``test_merge_sorted`` → ``merge_sorted``, not ``merge``); a function is a
            candidate when it is the target of some PASS_TO_PASS test.
        seed: tie-break RNG seed (e.g. the task id).

    Returns: up to :data:`OTHER_FIRST` candidates in other files (the fix stays eligible),
    then those in fixed files, then the other files' rest; within each group by the number of
    PASS_TO_PASS tests they are the target of (most first), ties in seeded random order.
    """
    covered = _covered_names(p2p)
    rng = random.Random(f"{SITE_RULE}:{seed}")
    sites = []
    for path in sorted(texts):
        try:
            sites += _sites(path, texts[path], fix_lines.get(path, set()))
        except SyntaxError:
            continue
    names = sorted({n for n, _ in sites if len(n) >= 3}, key=len, reverse=True)
    hits: dict[str, int] = {}
    for test, count in covered.items():
        target = next((n for n in names if test == n or test.startswith(n + "_")), None)
        if target is not None:
            hits[target] = hits.get(target, 0) + count
    ranked = sorted(((path_fixed, -hits[n], rng.random(), e) for n, e in sites if n in hits
                     for path_fixed in [e.path in fix_lines]), key=lambda r: r[:3])
    other = [r[3] for r in ranked if not r[0]]
    fixed = [r[3] for r in ranked if r[0]]
    return other[:OTHER_FIRST] + fixed + other[OTHER_FIRST:]


def _git(repo: Path, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:2])}: {proc.stderr.decode(errors='replace')[:300]}")
    return proc.stdout.decode(errors="replace")


def harmful_edit_patch(task, edit: HarmfulEdit | None, workroot: str | None = None) -> str:
    """``git diff`` from base of *gold patch + ``edit``* (``edit`` None: the gold alone),
    made in a fresh checkout of ``task.repo_dir`` at ``base_commit``.

    Raises: RuntimeError when the gold patch does not apply; ValueError when ``edit.old_str``
    does not occur exactly once in its file after the gold patch.
    """
    with tempfile.TemporaryDirectory(prefix="ecredit-harm-", dir=workroot) as tmp:
        root = Path(tmp) / "repo"
        _clone_at(task.repo_dir, task.base_commit, root)
        _git(root, "apply", "-", input=task.patch.encode())
        if edit is not None:
            f = root / edit.path
            text = f.read_text(encoding="utf-8")
            if text.count(edit.old_str + "\n") != 1:
                raise ValueError(f"old_str: the def line of {edit.path} is not unique after "
                                 "the gold patch")
            f.write_text(text.replace(edit.old_str + "\n", edit.new_str + "\n", 1),
                         encoding="utf-8")
        return _git(root, "diff", "--binary")


def task_texts(task, workroot: str | None = None) -> tuple[dict[str, str], dict[str, set[int]]]:
    """(library path → text after the gold patch, fixed path → changed gold lines)."""
    with tempfile.TemporaryDirectory(prefix="ecredit-harm-", dir=workroot) as tmp:
        root = Path(tmp) / "repo"
        _clone_at(task.repo_dir, task.base_commit, root)
        numstat = _git(root, "apply", "--numstat", "-", input=task.patch.encode())
        fix_paths = [r.split("\t")[2] for r in numstat.splitlines() if r.count("\t") == 2]
        _git(root, "apply", "-", input=task.patch.encode())
        lines: dict[str, set[int]] = {p: set() for p in fix_paths}
        for m in re.finditer(r"^\+\+\+ b/(\S+)\n((?:[ +\-@\\].*\n?)*)", _git(root, "diff"), re.M):
            new_no = 0
            for ln in m.group(2).splitlines():
                h = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)", ln)
                if h:
                    new_no = int(h.group(1))
                elif ln.startswith("+"):
                    lines.setdefault(m.group(1), set()).add(new_no)
                    new_no += 1
                elif ln.startswith("-"):
                    lines.setdefault(m.group(1), set()).add(new_no)
                elif not ln.startswith("\\"):
                    new_no += 1
        paths = _git(root, "ls-files").split("\n")
        texts = {}
        for p in library_files([p for p in paths if p], fix_paths):
            try:
                texts[p] = (root / p).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
        return texts, lines


def cache_key(task) -> str:
    """sha256 hex of :data:`SITE_RULE` and what decides a task's screening."""
    blob = json.dumps([SITE_RULE, task.instance_id, task.base_commit, task.patch,
                       hashlib.sha256((task.eval_script or "").encode()).hexdigest(),
                       task.image], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _grade(task, res) -> dict:
    from eval.grading.grader import grade  # start-up: swebench, ~1 s

    if res.exit_class != "ok":
        return {"exit_class": res.exit_class, "resolved": None, "complete": False,
                "p2p_failing": []}
    rep = grade(res.log, f2p=task.FAIL_TO_PASS, p2p=task.PASS_TO_PASS, parser=task.log_parser)
    bad = sorted(t for t, s in rep.p2p.items() if s not in ("PASSED", "XFAIL", "SKIPPED"))
    return {"exit_class": "ok", "resolved": rep.resolved, "complete": rep.complete,
            "p2p_failing": bad}


def _screen_one(task, pool, timeout_s: float | None) -> dict:
    """One task's screening record: ``{"edit": dict | None, "reason": str, "trials": [...]}``."""
    iid = task.instance_id
    texts, fix_lines = task_texts(task)
    cands = candidate_edits(texts, fix_lines, list(task.PASS_TO_PASS), iid)[:MAX_TRIES]
    rec: dict = {"instance_id": iid, "rule": SITE_RULE, "edit": None, "trials": [],
                 "candidates": len(cands)}
    if not cands:
        rec["reason"] = "no candidate site (no PASS_TO_PASS-named function)"
        return rec
    slug = hashlib.sha256(iid.encode()).hexdigest()[:8]

    def submit(edit, name):
        return pool.submit(task_trial_spec(task, harmful_edit_patch(task, edit), name,
                                           timeout_s=timeout_s,
                                           labels={"ecredit.role": "harm-screen"}))

    # the gold trial and the first candidate run side by side; later candidates only while
    # none has passed (each costs a trial)
    gold, first = submit(None, f"harm-gold-{slug}"), submit(cands[0], f"harm-{slug}-0")
    g = _grade(task, gold.result())
    rec["trials"].append({"role": "gold", **g})
    for i, e in enumerate(cands):
        h = _grade(task, (first if i == 0 else submit(e, f"harm-{slug}-{i}")).result())
        rec["trials"].append({"role": "harmful", "path": e.path, "anchor": e.anchor, **h})
        if not g["resolved"]:
            rec["reason"] = f"the gold patch alone did not resolve ({g['exit_class']})"
            return rec
        if h["complete"] and h["resolved"] is False and h["p2p_failing"]:
            rec["edit"] = HarmfulEdit(e.path, e.anchor, e.added, e.old_str, e.new_str,
                                      tuple(h["p2p_failing"][:5])).to_json()
            break
    rec["reason"] = ("screened" if rec["edit"] else
                     f"none of {len(cands)} candidates broke a PASS_TO_PASS test")
    return rec


def screen_harmful_edits(tasks, *, cache_dir: str | Path | None = None,
                         runtime: Runtime | SandboxOptions = DEFAULTS,
                         concurrency: int = 2, timeout_s: float | None = None,
                         log=print) -> dict[str, dict]:
    """Screened harmful edits of ``tasks`` (cached per task, see the module docstring).

    Args:
        tasks: ``eval.tasks.schema.Task``-like with ``repo_dir``, ``patch``, ``eval_script``,
            ``image``, the fixed lists and ``log_parser``.
        cache_dir: cache root (default ``$ECREDIT_CACHE`` or ``~/.cache/ecredit-trl``);
            records land in ``<root>/harmful/<key>.json``.
        runtime: a :class:`sandbox.backend.Runtime` (not closed here) or the options of one
            (made and closed here, only when a task is not cached).
        concurrency: verifier trials at once.
        timeout_s: per-trial limit (default: the task's rule, :func:`eval.tasks.trialspec.trial_limits`).

    Returns: instance id → record ``{"edit": HarmfulEdit JSON or None, "reason", "trials",
    "candidates"}`` (``edit`` None: the task stays plain; ``reason`` says why).

    Raises: PodmanUnavailable when Podman cannot start (a screening needs real trials).
    """
    log = log or (lambda *_: None)
    root = Path(cache_dir if cache_dir is not None else default_cache()) / "harmful"
    out, todo = {}, []
    for t in tasks:
        p = root / f"{cache_key(t)}.json"
        if p.is_file():
            out[t.instance_id] = json.loads(p.read_text(encoding="utf-8"))
        else:
            todo.append(t)
    if todo:
        log(f"harmful sites: screening {len(todo)} task(s) with real verifier trials")
        with open_runtime(runtime, run_id=f"harm-{os.getpid()}") as rt, \
                VerifierPool(rt, max_concurrency=concurrency, retry=trial_retry(1)) as pool:
            for t in todo:
                rec = _screen_one(t, pool, timeout_s)
                atomic_write_text(root / f"{cache_key(t)}.json", json.dumps(rec, indent=1))
                out[t.instance_id] = rec
                log(f"harmful sites: {t.instance_id}: {rec['reason']}")
    return out


def recipe_harmful_edits(tasks, recipe: dict, log=print, cache_dir=None) -> dict | None:
    """The warm start's harmful edits (instance id → :class:`eval.tasks.harmful.HarmfulEdit`) when
    ``recipe["harmful_fraction"]`` > 0, else None. Adds ``harmful_sites_sha256`` (of the
    screened edits) to ``recipe`` in place, so the policy's cache key follows the screening.

    Raises: PodmanUnavailable (the screening runs real verifier trials).
    """
    if not recipe.get("harmful_fraction"):
        return None
    recs = screen_harmful_edits(tasks, log=log, cache_dir=cache_dir)
    edits = {i: HarmfulEdit.from_json(v["edit"]) for i, v in sorted(recs.items()) if v["edit"]}
    recipe["harmful_sites_sha256"] = hashlib.sha256(json.dumps(
        {i: e.to_json() for i, e in edits.items()}, sort_keys=True).encode()).hexdigest()
    if log:
        log(f"warmstart: {len(edits)} of {len(recs)} tasks have a screened harmful edit")
    return edits


def harmful_meta(demos: list[dict], edits: dict | None) -> dict:
    """``warmstart.json`` fields of a positive-control warm start (empty without one):
    ``harmful`` = instance id → edit JSON of every demonstration that carries the block,
    ``harmful_screened`` = ids with a screened edit (the rest stayed plain)."""
    if edits is None:
        return {}
    return {"harmful": {d["instance_id"]: edits[d["instance_id"]].to_json() for d in demos
                        if d["variant"] == "harmful"},
            "harmful_screened": sorted(edits)}
