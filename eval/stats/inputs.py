"""Comparison inputs: evaluation folders (``results.json``) and training ledgers.

:func:`load_run` reads one ``[ARM[:SEED]=]PATH`` argument of ``python -m eval.compare`` into a
:class:`eval.stats.paired.RunResult`: per-task success from ``results.summary.per_task``, the arm
and seed from the label or the results (the training run's ``ecredit.arm`` / ``ecredit.seed``),
and the training cost from the run's ``ledger.jsonl`` (:func:`ledger_costs`: a missing ledger
or field is None, printed as pending, never 0).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from eval.stats.paired import COST_FIELDS, CompareInputError, RunResult

__all__ = ["ledger_costs", "load_run", "read_ledger"]


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


def read_ledger(run_dir: str | None) -> list[dict] | None:
    """The rows of ``run_dir/ledger.jsonl`` (None: no run dir or no ledger). A cut last line
    (a crash mid-write) is dropped; a corrupt line elsewhere raises CompareInputError."""
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
                     cost=ledger_costs(read_ledger(run_dir)), run_dir=run_dir)
