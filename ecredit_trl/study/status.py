"""What a study folder holds: every unit's state, read from the records.

Units, in the order ``study run`` works through them:

* ``train <arm>-s<seed>``: ``<out>/runs/<arm>-s<seed>/``. **done** when the run's last
  session ended with termination class ``completed``, ``checkpoint-final/`` has its receipt,
  and ``config.json`` holds the study's arm, seed, model and every ``train`` field
  (a difference makes it **stale**: another config's run). **running** while a session
  without termination receipt has a live process. **failed** when a session ended otherwise
  (the receipt's class and the exit code the study recorded are shown). **pending** without
  a manifest.
* ``eval <policy>/<split>``: ``<out>/evals/<policy>/<split>/``. **done** when
  ``results.json`` carries the binding of ``run.json``, the study's split, n, seed and
  temperature, every slot of the fixed denominator graded, and a rollout subprocess that
  exited 0; a run policy's results must be of that run (:func:`evaluated_run_matches`:
  the study's record names it relative to the study folder, or eval.run's absolute
  ``run_dir`` is that folder, or, in a copied / moved study, ends in ``runs/<name>`` and the
  recorded model sha256 is the run's final weights now).
* ``compare <split>``: done when ``compare/<split>/inputs.json`` lists the sha256 of every
  eval's ``results.json`` as they are now.
* ``report``: done when ``report.json``'s ``inputs`` (:func:`report_inputs`: every other
  unit's state and every ``results.json``'s sha256) equal the folder's now; a report written
  before ``inputs`` existed falls back to "newer than every ``compare.json``".

Every state comes from here, for ``status``, ``run`` and the report alike (one definition of
done: :func:`study_units`). Paths in the study's own records (``units/<id>.json``,
``compare/<split>/inputs.json``) are relative to the study folder, so a copied or moved
folder reads the same; absolute paths of older records are still read.

The study process records each unit's command and exit code in ``<out>/units/<id>.json``
and holds ``<out>/.study.lock`` (``flock``) while it runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ecredit_trl.runs.receipts import live_sessions, read_sessions
from ecredit_trl.study.config import StudyConfig, split_dirname
from eval.evaluation.modelref import resolve_model

STATES = ("done", "running", "failed", "stale", "pending")
LOCK_NAME = ".study.lock"


@dataclass
class Unit:
    """One unit of work of a study.

    Attributes:
        kind: ``train`` | ``eval`` | ``compare`` | ``report``.
        name: ``O-s0``, ``baseline/bundled-train``, ``bundled-train`` or ``report``.
        path: the unit's folder (or report file).
        state: one of :data:`STATES`.
        detail: why (termination class, exit code, missing slots ...), may be empty.
    """

    kind: str
    name: str
    path: Path
    state: str = "pending"
    detail: str = ""

    @property
    def uid(self) -> str:
        """File-name-safe id: ``train-O-s0``, ``eval-baseline-bundled-train``."""
        return f"{self.kind}-{self.name.replace('/', '-')}"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def sha256_of(path: Path) -> str | None:
    """sha256 (hex) of a file's bytes, None when it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def run_name(arm: str, seed: int) -> str:
    return f"{arm}-s{seed}"


def unit_record(out: Path, uid: str) -> dict | None:
    """The study's record of a unit's last command (``cmd``, ``rc``, times), or None."""
    return _read_json(Path(out) / "units" / f"{uid}.json")


def lock_holder(out: Path) -> int | None:
    """pid of the ``study run`` holding ``out``'s lock, None when none does."""
    p = Path(out) / LOCK_NAME
    if not p.exists():
        return None
    with open(p, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            txt = f.read().strip()
            return int(txt) if txt.isdigit() else -1
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def _same(a, b) -> bool:
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def config_mismatch(run_config: dict, cfg: StudyConfig, arm: str, seed: int) -> list[str]:
    """Fields of a run's ``config.json`` that differ from what the study asks (pure)."""
    eco, mod = run_config.get("ecredit", {}), run_config.get("model", {})
    want = {"arm": arm, "seed": seed, **cfg.train}
    bad = []
    for k, v in want.items():
        have = (mod if k in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
                             "warmstart_steps") else eco).get(k)
        if not _same(have, v):
            bad.append(f"{k}={have!r} (study: {v!r})")
    if cfg.model is not None and mod.get("model") != cfg.model:
        bad.append(f"model={mod.get('model')!r} (study: {cfg.model!r})")
    return bad


def train_state(run_dir: Path, cfg: StudyConfig, arm: str, seed: int) -> tuple[str, str]:
    """(state, detail) of one training run (see the module docstring)."""
    if not (run_dir / "manifest.json").is_file():
        return "pending", ""
    run_config = _read_json(run_dir / "config.json") or {}
    bad = config_mismatch(run_config, cfg, arm, seed)
    if bad:
        return "stale", "config differs: " + "; ".join(bad[:3])
    if live_sessions(run_dir):
        return "running", ""
    sessions = read_sessions(run_dir)
    last = sessions[-1] if sessions else None
    cls = (last.termination or {}).get("class") if last else None
    final = last is not None and any(c.get("reason") == "final" for c in last.checkpoints)
    if cls == "completed" and final and (run_dir / "checkpoint-final").is_dir():
        return "done", f"{len(sessions)} session(s)"
    return "failed", f"termination {cls or 'none'}"


def study_relpath(path: str | Path, out: str | Path) -> str:
    """``path`` relative to the study folder ``out`` (POSIX), for the study's own records;
    a path outside ``out`` stays absolute."""
    p, root = Path(path).absolute(), Path(out).absolute()
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return str(p)


def from_study(path: str | Path, out: str | Path) -> Path:
    """A path read from a study record: relative ones are under ``out``."""
    p = Path(path)
    return p if p.is_absolute() else Path(out) / p


def evaluated_run_matches(res: dict, eval_dir: Path, run_dir: Path, out: Path) -> bool:
    """Whether ``eval_dir/results.json`` (read: ``res``) evaluated the run ``run_dir`` of the
    study ``out`` (see the module docstring for the three ways it can say so)."""
    unit = unit_record(out, Unit("eval", f"{run_dir.name}/{eval_dir.name}", eval_dir).uid)
    if unit and unit.get("run_dir") and unit.get("results_sha256") == sha256_of(
            eval_dir / "results.json"):
        return from_study(unit["run_dir"], out).resolve() == run_dir.resolve()
    rec = res.get("run_dir")
    if not rec:
        return False
    if not Path(rec).is_absolute():
        return from_study(rec, out).resolve() == run_dir.resolve()
    if Path(rec).resolve() == run_dir.resolve():
        return True
    # an absolute record written where the folder was before it was copied or moved: the
    # same run name under runs/ and the weights eval.run fingerprinted are this run's now
    if Path(rec).parts[-2:] != ("runs", run_dir.name) or not (run_dir / "checkpoint-final").is_dir():
        return False
    want = (res.get("model") or {}).get("sha256")
    try:
        return bool(want) and resolve_model(run_dir).sha256 == want
    except (OSError, ValueError):
        return False


def eval_state(eval_dir: Path, cfg: StudyConfig, split: str,
               run_dir: Path | None) -> tuple[str, str]:
    """(state, detail) of one evaluation (see the module docstring); the study folder is
    ``eval_dir``'s grandparent's parent (``<out>/evals/<policy>/<split>``)."""
    res = _read_json(eval_dir / "results.json")
    bound = _read_json(eval_dir / "run.json")
    if res is None:
        return "pending", "partial" if bound else ""
    ev = cfg.eval
    want = {"split": split, "n": cfg.eval_n(split), "seed": ev["seed"]}
    bad = [k for k, v in want.items() if res.get(k) != v]
    ov = res.get("overrides") or {}
    bad += [k for k in ("temperature", "max_turns", "max_new_tokens") if ov.get(k) != ev[k]]
    if bound is None or bound.get("binding") != res.get("binding"):
        bad.append("binding")
    if run_dir is not None and not evaluated_run_matches(res, eval_dir, run_dir,
                                                            eval_dir.parents[2]):
        bad.append("run_dir")
    if bad:
        return "stale", "differs in " + ", ".join(bad)
    summ = res.get("summary") or {}
    slots = (summ.get("denominator") or {}).get("slots")
    graded = len(res.get("slots") or [])
    if res.get("rollouts_exit_code") not in (None, 0):
        return "failed", f"rollouts exit {res.get('rollouts_exit_code')}; {graded}/{slots} slots"
    if slots is None or graded < slots:
        return "failed", f"incomplete: {graded}/{slots} slots"
    return "done", f"success {summ.get('success'):.3f}, unknown {summ.get('unknown')}"


def eval_inputs(out: Path, cfg: StudyConfig, split: str) -> dict[str, str | None]:
    """label → sha256 of the ``results.json`` of every policy evaluated on ``split``."""
    sd = split_dirname(split)
    labels = {"baseline": Path(out) / "evals" / "baseline" / sd / "results.json"}
    for arm, seed in cfg.design():
        labels[f"{arm}:{seed}"] = Path(out) / "evals" / run_name(arm, seed) / sd / "results.json"
    return {k: sha256_of(p) for k, p in labels.items()}


def study_units(cfg: StudyConfig, out: str | Path, *, live: bool = True) -> list[Unit]:
    """Every unit of the study with its state read from ``out`` (no writes).

    Args:
        live: mark the unit a live ``study run`` is working on as **running** (from the
            lock and ``units/current.json``); the report reads its states with ``False``,
            as the folder's records say, so a report written by the run itself stays done.
    """
    out = Path(out)
    units: list[Unit] = []
    for arm, seed in cfg.design():
        rd = out / "runs" / run_name(arm, seed)
        u = Unit("train", run_name(arm, seed), rd)
        u.state, u.detail = train_state(rd, cfg, arm, seed)
        units.append(u)
    for policy in ["baseline"] + [run_name(a, s) for a, s in cfg.design()]:
        rd = None if policy == "baseline" else out / "runs" / policy
        for split in cfg.eval["splits"]:
            ed = out / "evals" / policy / split_dirname(split)
            u = Unit("eval", f"{policy}/{split_dirname(split)}", ed)
            u.state, u.detail = eval_state(ed, cfg, split, rd)
            units.append(u)
    for split in cfg.eval["splits"]:
        cd = out / "compare" / split_dirname(split)
        u = Unit("compare", split_dirname(split), cd)
        rec = _read_json(cd / "inputs.json")
        if rec is not None and (cd / "compare.json").is_file():
            u.state = "done" if rec.get("inputs") == eval_inputs(out, cfg, split) else "stale"
            u.detail = "" if u.state == "done" else "evals changed since"
        units.append(u)
    _exit_codes(out, units)
    units.append(report_unit(out, cfg, units))
    _exit_codes(out, units[-1:])
    holder = lock_holder(out) if live else None
    current = (_read_json(out / "units" / "current.json") or {}).get("uid") if holder else None
    for u in units:
        if holder and current == u.uid and u.state != "done":
            u.state, u.detail = "running", f"pid {holder}"
    return units


def _exit_codes(out: Path, units: list[Unit]) -> None:
    """A unit whose recorded command exited non-zero and that is not done is **failed**."""
    for u in units:
        rec = unit_record(out, u.uid)
        if u.state in ("failed", "pending", "stale") and rec and rec.get("rc") not in (None, 0):
            u.state = "failed"
            u.detail = (u.detail + "; " if u.detail else "") + f"exit {rec['rc']}"


def report_inputs(out: str | Path, cfg: StudyConfig, units: list[Unit]) -> dict:
    """What a report is built from, as recorded in ``report.json`` ``inputs``: the config
    sha256, every train / eval / compare unit's state and every split's
    :func:`eval_inputs` (sha256 of each ``results.json``). The report is done while these
    are what the folder holds now."""
    return {"config_sha256": cfg.sha256(),
            "units": {u.uid: u.state for u in units if u.kind != "report"},
            "evals": {split_dirname(s): eval_inputs(out, cfg, s) for s in cfg.eval["splits"]}}


def report_unit(out: Path, cfg: StudyConfig, units: list[Unit]) -> Unit:
    """The report unit (see the module docstring)."""
    rep = Unit("report", "report", out / "report.md")
    rec = _read_json(out / "report.json")
    if rec is None:
        return rep
    if "inputs" in rec:
        same = rec["inputs"] == json.loads(json.dumps(report_inputs(out, cfg, units)))
        rep.state, rep.detail = ("done", "") if same else ("stale", "units changed since")
        return rep
    cmps = [out / "compare" / split_dirname(s) / "compare.json" for s in cfg.eval["splits"]]
    if all(p.is_file() for p in cmps):  # a report from before `inputs`
        newest = max(p.stat().st_mtime for p in cmps)
        rep.state = "done" if (out / "report.json").stat().st_mtime >= newest else "stale"
    return rep


def render_status(units: list[Unit], out: str | Path) -> str:
    """Plain-text table of ``units`` plus a count line (pure)."""
    rows = [("unit", "state", "detail", "path")]
    rows += [(f"{u.kind} {u.name}", u.state, u.detail, os.path.relpath(u.path, out))
             for u in units]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    counts = {s: sum(u.state == s for u in units) for s in STATES}
    lines.append(", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return "\n".join(lines)


__all__ = ["LOCK_NAME", "STATES", "Unit", "config_mismatch", "eval_inputs", "eval_state",
           "evaluated_run_matches", "from_study", "lock_holder", "render_status",
           "report_inputs", "report_unit", "run_name", "sha256_of", "study_relpath",
           "study_units", "train_state", "unit_record"]
