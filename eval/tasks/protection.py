"""The verifier's protected set per task: row validation and the effective set.

The set itself (defaults, matching, the in-sandbox restore) lives in :mod:`sandbox.trials.protect`
and :mod:`sandbox.trials.script`; here a task row's ``protected_paths`` is checked and turned
into the patterns a :class:`sandbox.trials.trial.TrialSpec` carries.
"""

from __future__ import annotations

import json
from typing import Any

from sandbox.trials.protect import (
    DEFAULT_PROTECTED,
    check_pattern,
    exact_pattern,
    listed_test_files,
)


def check_protected_paths(value: Any, where: str) -> dict | None:
    """Validate a task row's ``protected_paths`` (see :class:`eval.tasks.schema.Task`).

    Args:
        value: None, an object ``{"add": [...], "remove": [...]}`` or its JSON string.
        where: ``"<source> row <n>"`` for error messages.

    Returns: None or ``{"add": [...], "remove": [...]}`` (both keys, duplicates dropped).

    Raises:
        ValueError: ``"<where>: field 'protected_paths...' ..."`` for a non-object, unknown
            keys, non-list values, empty / ``..`` patterns, or a ``remove`` entry that is not
            in :data:`sandbox.trials.protect.DEFAULT_PROTECTED`.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: field 'protected_paths' is a string but not JSON") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: field 'protected_paths' must be an object with 'add' and/or "
                         f"'remove' lists of path patterns, got {type(value).__name__}")
    unknown = sorted(set(value) - {"add", "remove"})
    if unknown:
        raise ValueError(f"{where}: field 'protected_paths' has unknown key(s) {unknown} "
                         "(expected 'add', 'remove')")
    out: dict[str, list[str]] = {}
    for key in ("add", "remove"):
        items = value.get(key) or []
        if not isinstance(items, list):
            raise ValueError(f"{where}: field 'protected_paths.{key}' must be a list of path "
                             f"patterns, got {type(items).__name__}")
        for i, pat in enumerate(items):
            try:
                check_pattern(pat, f"field 'protected_paths.{key}[{i}]'")
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if key == "remove" and pat not in DEFAULT_PROTECTED:
                raise ValueError(f"{where}: field 'protected_paths.remove[{i}]': {pat!r} is not "
                                 f"in the default protected set {list(DEFAULT_PROTECTED)}")
        out[key] = list(dict.fromkeys(items))
    return out


def protected_set(task) -> tuple[str, ...]:
    """The verifier's protected set for ``task`` (patterns of :func:`sandbox.trials.protect.matches`).

    :data:`sandbox.trials.protect.DEFAULT_PROTECTED` (conftest.py at any depth, pytest.ini,
    tox.ini, site hooks, ``*.pth``, dist/egg-info, the default test-path patterns) without
    the task's ``remove`` entries, plus every file named by a listed test id (exact paths),
    plus the task's ``add`` entries. Source: the design page, "Threat model".
    """
    pp = task.protected_paths or {}
    drop = set(pp.get("remove") or [])
    pats = [p for p in DEFAULT_PROTECTED if p not in drop]
    pats += [exact_pattern(f) for f in listed_test_files(task.FAIL_TO_PASS + task.PASS_TO_PASS)]
    pats += list(pp.get("add") or [])
    return tuple(dict.fromkeys(pats))


def verdict_fields(task, res, rep) -> dict:
    """The protection-related fields of one graded trial.

    Args:
        task: the task (FAIL_TO_PASS, PASS_TO_PASS, log_parser).
        res: a :class:`sandbox.trials.trial.TrialResult` (objects without ``protected_touched`` /
            ``log_swebench`` count as touching nothing).
        rep: the :class:`eval.grading.grader.GradeReport` of ``res.log`` (the protected run).

    Returns: ``{"protected_touched": [paths], "resolved_swebench": bool | None}``.
    ``resolved_swebench`` is the SWE-bench harness's own verdict: swebench's parser and
    ``get_eval_report`` semantics (``GradeReport.resolved_swebench_parser``) on the log of a
    run without the protected set. When the artifact touched no protected path that run is
    the protected one (protection changed nothing); when it did, it is the unprotected
    second run of the same trial (``res.log_swebench``); None when that run did not happen
    (``repo_dir`` tasks, a trial that did not end ``ok``).
    """
    from eval.grading.grader import grade  # start-up: swebench, ~1 s

    touched = list(getattr(res, "protected_touched", None) or [])
    if touched:
        log = getattr(res, "log_swebench", None)
        if log is None:
            return {"protected_touched": touched, "resolved_swebench": None}
        rep = grade(log, f2p=list(task.FAIL_TO_PASS), p2p=list(task.PASS_TO_PASS),
                    parser=task.log_parser)
    swe = getattr(rep, "resolved_swebench_parser", None)
    return {"protected_touched": touched,
            "resolved_swebench": bool(rep.resolved if swe is None else swe)}


__all__ = ["check_protected_paths", "protected_set", "verdict_fields"]
