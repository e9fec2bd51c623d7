"""The study report: ``report.md``, ``report.json`` and PNGs from a study folder.

``write_report(out_dir) -> dict`` reads ``<out_dir>/study.json`` and what the study wrote
(layout: ``runs/<arm>-s<seed>/`` train.py run dirs, ``evals/<policy>/<split>/`` eval.run
folders with ``<policy>`` = ``baseline`` or ``<arm>-s<seed>`` and ``<split>`` the split name
with ':' → '-') and writes:

(a) design and what ran — every unit (training run, evaluation) in its state from
    :func:`ecredit_trl.study.status.study_units` (the one definition of done ``status`` and
    ``run`` use; an evaluation's figures count only when it is done), with the receipts'
    termination class, sessions and step;
(b) learning curves — resolved rate per training step (``ledger.jsonl``: resolved / rollouts),
    mean over seeds with the min–max band (``learning_curves.png``);
(c) the signal table of each credit arm's training trajectories in the pilot's columns
    (:func:`ecredit_trl.credit.pilot_report.pilot_table` on ``trajectories.jsonl``);
(d) evaluation per arm × seed and split — per-rollout mean over the fixed denominator,
    unknown slots counted — with the step-0 baseline beside them;
(e) task-paired differences M−B, M−O, M−E and each arm − baseline with the percentile
    bootstrap CI (study.json ``bootstrap``) and the minimum detectable difference
    (:mod:`eval.stats.power`, ``bootstrap.power``), seeds pooled over the seeds both arms share
    (:mod:`ecredit_trl.study.report_pairs`; ``pooled_seeds``) and per seed
    (``paired_diffs.png``);
(f) costs per arm (ledger + receipts + the evals' results);
(h) the positive control, when the study has one (``harmful.json``): harmful-block rate and
    resolved rate on the harmful tasks per policy with CIs, differences against the step-0
    baseline with MDD and the tasks that would detect the measured difference, and the
    harmful-block rate per training step (:mod:`ecredit_trl.study.report_control`,
    ``harmful_curve.png``);
(g) whatever did not run or was not recorded prints **Pending**, never a number.

Plus an "Answer" paragraph generated from (e) and the caveat line with the policy's
parameter count measured from its weights (:mod:`ecredit_trl.study.report_model`).
``report.json`` records its ``inputs`` (:func:`ecredit_trl.study.status.report_inputs`), by
which ``status`` tells whether it is current. Nothing is half-written: everything is read
and computed first, the files are staged in a temporary folder inside ``out_dir`` and then
renamed into place, so an error leaves the previous report intact.

source: the design page, "Evaluation" (a study reports 'Pending' for what did not run)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ecredit_trl.credit.arms import CREDIT_ARMS
from ecredit_trl.runs.receipts import process_alive, read_sessions
from ecredit_trl.study.config import StudyConfigError, config_from_study_json, split_dirname
from ecredit_trl.study.plots import write_plots
from ecredit_trl.study.report_control import ControlError, control_section
from ecredit_trl.study.report_model import model_parameters
from ecredit_trl.study.report_pairs import per_seed_rows, pooled_rows
from ecredit_trl.study.report_render import render_markdown
from ecredit_trl.study.report_tables import (
    COST_KEYS,
    arm_costs,
    arm_integrity,
    integrity_counts,
    learning_curve,
    mean_band,
    run_costs,
    signal_table,
)
from ecredit_trl.study.status import report_inputs, study_units
from eval.compare import compare, load_run
from eval.files import read_json_object, read_jsonl
from eval.stats.pairs import STANDARD_PAIRS

__all__ = ["REPORT_FILES", "SCHEMA", "StudyReportError", "load_study", "receipt_summary",
           "study_report", "write_report"]

SCHEMA = "ecredit-study-report/1"
BASELINE = "baseline"
REPORT_FILES = ("report.md", "report.json")
DEFAULT_BOOTSTRAP = {"n_boot": 10000, "seed": 0, "alpha": 0.05}


class StudyReportError(ValueError):
    """A study folder cannot be reported on; the message names the file and field."""


def load_study(out_dir: str | Path) -> dict:
    """``study.json`` of ``out_dir``, checked, with ``seeds_by_arm`` resolved for every arm.

    Returns: the study dict plus ``"design"``: ``[(arm, seed), ...]`` in arm order.

    Raises: StudyReportError naming ``study.json`` and the field (missing file, not JSON,
        ``arms``/``seeds`` not lists, a bad ``eval.tasks.splits`` or ``bootstrap``).
    """
    p = Path(out_dir) / "study.json"
    if not p.is_file():
        raise StudyReportError(f"{p}: no study.json (not a study folder?)")
    study = read_json_object(p, StudyReportError)
    arms, seeds = study.get("arms"), study.get("seeds")
    if not isinstance(arms, list) or not arms or not all(isinstance(a, str) for a in arms):
        raise StudyReportError(f"{p}: field 'arms' must be a non-empty list of arm names")
    if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds):
        raise StudyReportError(f"{p}: field 'seeds' must be a list of ints")
    by_arm = study.get("seeds_by_arm") or {}
    if not isinstance(by_arm, dict):
        raise StudyReportError(f"{p}: field 'seeds_by_arm' must be a mapping arm → seeds")
    for arm, ss in by_arm.items():
        if not isinstance(ss, list) or not all(isinstance(s, int) for s in ss):
            raise StudyReportError(f"{p}: field 'seeds_by_arm.{arm}' must be a list of ints")
    splits = (study.get("eval") or {}).get("splits", [])
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        raise StudyReportError(f"{p}: field 'eval.tasks.splits' must be a list of split names")
    boot = {**DEFAULT_BOOTSTRAP, **(study.get("bootstrap") or {})}
    if not (isinstance(boot["n_boot"], int) and boot["n_boot"] >= 1
            and isinstance(boot["seed"], int) and 0 < float(boot["alpha"]) < 1):
        raise StudyReportError(f"{p}: field 'bootstrap' needs n_boot >= 1 (int), seed (int), "
                               f"0 < alpha < 1; got {study.get('bootstrap')}")
    study["bootstrap"] = boot
    study["design"] = [(a, s) for a in arms for s in by_arm.get(a, seeds)]
    return study


def receipt_summary(run_dir: Path) -> dict:
    """What one training run's receipts say, for the units table: ``class`` (the last
    session's termination class; ``no termination receipt`` when its process is gone
    without one, None while it lives), ``sessions`` and ``step``. Whether the run is
    *done* is :func:`ecredit_trl.study.status.train_state`'s call, not this one's.

    Raises: StudyReportError naming an unreadable receipt."""
    if not run_dir.is_dir():
        return {"class": None, "sessions": 0, "step": None}
    try:
        sessions = read_sessions(run_dir)
    except ValueError as exc:
        raise StudyReportError(str(exc)) from None
    if not sessions:
        return {"class": None, "sessions": 0, "step": None}
    last = sessions[-1]
    term = last.termination
    if term is None:  # no receipt: running, or killed without one (SIGKILL, OOM killer)
        alive = process_alive((last.opened or {}).get("process") or {})
        return {"class": "no termination receipt" if alive is False else None,
                "sessions": len(sessions), "step": None}
    return {"class": term.get("class"), "sessions": len(sessions), "step": term.get("step")}


def _jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL record (a truncated last line is tolerated, as eval.compare does)."""
    try:
        return read_jsonl(path)
    except ValueError as exc:
        raise StudyReportError(str(exc)) from None


def _json(path: Path, field: str | None = None) -> dict | None:
    if not path.is_file():
        return None
    obj = read_json_object(path, StudyReportError)
    if field and not isinstance(obj.get(field), dict):
        raise StudyReportError(f"{path}: field '{field}' missing")
    return obj


def _collect_run(out: Path, arm: str, seed: int, splits: Sequence[str],
                 states: dict[str, dict]) -> dict:
    """Everything the report reads about one run (its files; None/[] where absent). An
    evaluation counts only when its unit is done (``states``: uid → unit row of
    :func:`ecredit_trl.study.status.study_units`); any other is None (Pending)."""
    label = f"{arm}-s{seed}"
    d = out / "runs" / label
    ledger = _jsonl(d / "ledger.jsonl")
    traj = _jsonl(d / "trajectories.jsonl")
    try:
        sessions = read_sessions(d) if d.is_dir() else []
    except ValueError as exc:
        raise StudyReportError(str(exc)) from None
    secs = [(s.termination or {}).get("seconds") for s in sessions]
    manifest = _json(d / "manifest.json") or {}
    evals = {sp: _done_results(out, label, sp, states) for sp in splits}
    return {"label": label, "arm": arm, "seed": seed, "dir": d,
            "status": states[f"train-{label}"]["status"],
            "ledger": ledger, "trajectories": traj, "session_seconds": secs,
            "world_size": manifest.get("world_size"), "evals": evals}


def _done_results(out: Path, policy: str, split: str, states: dict[str, dict]) -> dict | None:
    """``results.json`` of a done evaluation unit, else None (Pending)."""
    uid = f"eval-{policy}-{split_dirname(split)}"
    if states.get(uid, {}).get("status") != "done":
        return None
    return _json(out / "evals" / policy / split_dirname(split) / "results.json", "summary")


def _eval_row(policy: str, arm: str, seed: int | None, split: str, res: dict | None,
              state: str) -> dict:
    """One row of table (d); figures None (Pending) unless the evaluation is done."""
    row = {"policy": policy, "arm": arm, "seed": seed, "split": split,
           "status": state if res is None else "done", "success": None, "resolved": None,
           "slots": None, "tasks": None, "n": None, "unknown": None, "success_bounds": None}
    if res:
        s = res["summary"]
        den = s.get("denominator") or {}
        row.update(success=s.get("success"), resolved=s.get("resolved"),
                   slots=den.get("slots"), tasks=den.get("tasks"), n=den.get("n"),
                   unknown=s.get("unknown"), success_bounds=s.get("success_bounds"),
                   temperature=(res.get("overrides") or {}).get("temperature"))
    return row


def _differences(out: Path, study: dict, split: str, runs: list[dict],
                 baseline: dict | None) -> dict:
    """Table (e) of one split: pooled (seeds rule of :mod:`ecredit_trl.study.report_pairs`)
    and per-seed paired differences, each with its MDD, over the done evaluations."""
    boot = study["bootstrap"]
    ckw = {"n_boot": boot["n_boot"], "alpha": float(boot["alpha"]), "seed": boot["seed"]}
    kw = {"n_boot": boot["n_boot"], "alpha": float(boot["alpha"]), "boot_seed": boot["seed"],
          "power": float(boot["power"])}
    sd = split_dirname(split)
    args = [f"{BASELINE}={out / 'evals' / BASELINE / sd}"] if baseline else []
    args += [f"{r['arm']}:{r['seed']}={out / 'evals' / r['label'] / sd}" for r in runs
             if r["evals"].get(split)]
    try:
        loaded = [load_run(a) for a in args]
        cmp = compare(loaded, **ckw) if loaded else {"arms": {}, "warnings": []}
    except (ValueError, FileNotFoundError) as exc:  # eval.compare's input errors name the file
        raise StudyReportError(str(exc)) from None
    arms = study["arms"]
    seeds = {a: [s for x, s in study["design"] if x == a] for a in arms}
    pooled = pooled_rows(loaded, seeds, arms, rule=study.get("pooled_seeds") or "shared", **kw)
    per_seed = per_seed_rows(loaded, study["design"], arms, **kw)
    arm_ci = {a: {"success": d["success"], "ci": d["ci"], "n_tasks": d["n_tasks"],
                  "seeds": d["seeds"]} for a, d in cmp["arms"].items()}
    return {"pooled": pooled, "per_seed": per_seed, "arms": arm_ci,
            "warnings": cmp["warnings"]}


def _signal(arm: str, runs: list[dict]) -> dict:
    """Table (c) of one credit arm: per run and pooled over its seeds."""
    per_run, rows_all, pending = {}, [], []
    for r in runs:
        if not r["trajectories"]:
            per_run[r["label"]] = None
            pending.append(r["label"])
            continue
        try:
            per_run[r["label"]] = signal_table(r["trajectories"], arm)
        except ValueError as exc:
            raise StudyReportError(f"{r['dir'] / 'trajectories.jsonl'}: {exc}") from None
        rows_all += r["trajectories"]
    return {"pooled": signal_table(rows_all, arm) if rows_all else None,
            "per_run": per_run, "pending": pending}


def _units(out: Path, cfg) -> tuple[list, list[dict]]:
    """The study's units (:func:`ecredit_trl.study.status.study_units`, the one definition
    of done, read without the live-run override) and the report's rows of them."""
    units = study_units(cfg, out, live=False)
    rows = []
    for u in units:
        if u.kind not in ("train", "eval"):
            continue
        row = {"kind": u.kind, "name": u.name, "status": u.state, "detail": u.detail}
        if u.kind == "train":
            row.update(receipt_summary(u.path))
        rows.append(row)
    return units, rows


def study_report(out_dir: str | Path) -> dict:
    """Read a study folder and compute the report's content (reads only; writes nothing).

    Returns: the ``report.json`` dict (keys ``schema``, ``study``, ``units``, ``curves``,
        ``signal``, ``evaluation``, ``differences``, ``costs``, ``answer``, ``model``
        (:func:`ecredit_trl.study.report_model.model_parameters`), ``inputs``
        (:func:`ecredit_trl.study.status.report_inputs`)); None = Pending.

    Raises: StudyReportError naming the file and field of bad input (study.json, a corrupt
        record line that is not the last, a results.json without ``summary``, a usable
        trajectory row lacking a signal field).
    """
    out = Path(out_dir)
    study = load_study(out)
    try:
        cfg = config_from_study_json(out / "study.json")
    except (StudyConfigError, FileNotFoundError) as exc:
        raise StudyReportError(str(exc)) from None
    study["pooled_seeds"] = cfg.pooled_seeds
    study["bootstrap"] = {**study["bootstrap"], "power": cfg.bootstrap["power"]}
    splits = study["eval"].get("splits", []) if study.get("eval") else []
    units, unit_rows = _units(out, cfg)
    states = {f"{r['kind']}-{r['name'].replace('/', '-')}": r for r in unit_rows}
    runs = [_collect_run(out, a, s, splits, states) for a, s in study["design"]]
    baseline = {sp: _done_results(out, BASELINE, sp, states) for sp in splits}
    curves = {}
    for arm in study["arms"]:
        per = {r["label"]: learning_curve(r["ledger"], r["trajectories"])
               for r in runs if r["arm"] == arm}
        per = {k: v for k, v in per.items() if v}
        curves[arm] = {**mean_band(per), "runs": {k: {str(s): x for s, x in v.items()}
                                                  for k, v in per.items()}} if per else None
    signal = {arm: _signal(arm, [r for r in runs if r["arm"] == arm])
              for arm in study["arms"] if arm in CREDIT_ARMS}
    evaluation = {sp: [_eval_row(BASELINE, BASELINE, None, sp, baseline[sp],
                                 states[f"eval-{BASELINE}-{split_dirname(sp)}"]["status"])]
                  + [_eval_row(r["label"], r["arm"], r["seed"], sp, r["evals"][sp],
                               states[f"eval-{r['label']}-{split_dirname(sp)}"]["status"])
                     for r in runs] for sp in splits}
    differences = {sp: _differences(out, study, sp, runs, baseline[sp]) for sp in splits}
    try:  # the positive control's harmful-block and resolved rates
        control = control_section(out, study, runs, {k: r["status"] == "done"
                                                     for k, r in states.items()})
    except ControlError as exc:
        raise StudyReportError(str(exc)) from None
    meta = {k: study.get(k) for k in ("name", "model", "arms", "seeds", "seeds_by_arm", "train",
                                      "eval", "bootstrap", "accelerate_config", "config_sha256",
                                      "started_at", "command", "pooled_seeds")}
    return {"schema": SCHEMA, "study": meta, "units": unit_rows, "curves": curves,
            "signal": signal, "evaluation": evaluation, "differences": differences,
            "costs": _costs(study, runs), "integrity": _integrity(study, runs),
            "answer": _answer(differences), "control": control,
            "model": model_parameters(out, [r["dir"] for r in runs], baseline),
            "inputs": report_inputs(out, cfg, units[:-1])}


def _integrity(study: dict, runs: list[dict]) -> dict:
    """Per arm: :func:`~ecredit_trl.study.report_tables.arm_integrity` of its started runs."""
    return {arm: arm_integrity([integrity_counts(r["ledger"]) for r in runs
                                if r["arm"] == arm and r["status"] != "pending"])
            for arm in study["arms"]}


def _costs(study: dict, runs: list[dict]) -> dict:
    """Table (f): per run (None while the run is pending) and per arm."""
    per_run_cost = {r["label"]: run_costs(r["ledger"], session_seconds=r["session_seconds"],
                                          world_size=r["world_size"],
                                          eval_results=list(r["evals"].values()))
                    if r["status"] != "pending" else None for r in runs}
    for r in runs:
        if per_run_cost[r["label"]] is not None:
            per_run_cost[r["label"]]["status"] = r["status"]
    costs = {"per_run": per_run_cost, "per_arm": {
        arm: arm_costs([c for r in runs if r["arm"] == arm
                        if (c := per_run_cost[r["label"]]) is not None])
        for arm in study["arms"]}}
    for arm, c in costs["per_arm"].items():  # an arm with a run not started is Pending
        if any(per_run_cost[r["label"]] is None for r in runs if r["arm"] == arm):
            costs["per_arm"][arm] = {"runs": c["runs"], **dict.fromkeys(COST_KEYS)}
    return costs


def _answer(differences: dict) -> dict:
    """Per split: M−B, M−O, M−E and O − baseline as (mean, ci, verdict, MDD, seeds)."""
    want = [f"{a}−{b}" for a, b in STANDARD_PAIRS] + ["O−baseline"]
    keys = ("name", "mean", "ci", "verdict", "n_tasks", "mdd", "mdd_reason", "power",
            "seeds_note")
    return {sp: [{k: p.get(k) for k in keys}
                 for name in want for p in d["pooled"] if p["name"] == name]
            for sp, d in differences.items()}


def write_report(out_dir: str | Path) -> dict:
    """Write ``report.md``, ``report.json`` and the PNGs into the study folder ``out_dir``.

    All files are staged in a temporary folder inside ``out_dir`` and renamed into place
    only after every one was written; on any error nothing of this report is left behind
    and an earlier report stays as it was.

    Returns: the ``report.json`` dict (:func:`study_report`) with ``files`` (names written).

    Raises: StudyReportError (bad input, see :func:`study_report`); OSError from the file
        system (nothing half-written).
    """
    out = Path(out_dir)
    report = study_report(out)
    stage = Path(tempfile.mkdtemp(prefix=".report-", dir=out))
    try:
        pngs = write_plots(report, stage)
        report["files"] = list(REPORT_FILES) + pngs
        (stage / "report.md").write_text(render_markdown(report), encoding="utf-8")
        (stage / "report.json").write_text(
            json.dumps(report, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        for name in report["files"]:
            os.chmod(stage / name, 0o644)
        for name in report["files"]:  # same file system: each rename is atomic
            os.replace(stage / name, out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return report
