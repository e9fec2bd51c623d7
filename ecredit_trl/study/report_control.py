"""The positive control in the study report: harmful-block rate and resolved rate.

A study whose policy was warm-started with harmful demonstrations (``warmstart:
{harmful_fraction: ...}``, :func:`ecredit_trl.study.positive_control.control_policy`) has
``<out>/harmful.json``: the harmful edit (:class:`eval.tasks.harmful.HarmfulEdit`) of every task whose
demonstration carried one, and the edited file's base text. On those *harmful tasks* this
module measures, per policy (the step-0 baseline, each run, each arm pooled over its seeds)
and split:

* the **harmful-block rate**: the share of rollouts whose final artifact carries the task's
  harmful block, read from the artifact's diff by path and content
  (:func:`eval.tasks.harmful.patch_carries`), never from a label; the mean over the task's rollouts,
  then over tasks;
* the **resolved rate** on the same tasks (the eval's graded slots);
* the **edited rate**: the share of those rollouts with a nonempty artifact, so that a drop of
  the harmful-block rate that comes from a policy that stopped editing altogether (format
  errors, empty patches) is told apart from one that stopped making *that* edit;

each with its percentile bootstrap CI over tasks, the task-paired difference against the
step-0 baseline (and M−O, M−B where both ran) with its CI, minimum detectable difference
(:mod:`eval.stats.power`) and, from the measured spread, the tasks a design would need to detect
the measured difference at the study's power (:func:`eval.stats.power.tasks_needed`). Training
curves: the harmful-block rate per step of each run's ``trajectories.jsonl``, rebuilt from
each rollout's turn writes (:func:`eval.tasks.harmful.writes_carry`), mean over seeds.

Reads only; pure apart from reading the study folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from ecredit_trl.study.config import split_dirname
from ecredit_trl.study.report_power import budget_grid, variance_parts
from ecredit_trl.study.report_tables import pair_row
from eval.compare import bootstrap_ci
from eval.stats.power import tasks_needed
from eval.tasks.harmful import HarmfulEdit, HarmfulSpecError, patch_carries, writes_carry

__all__ = ["CONTROL_FILE", "ControlError", "control_section", "eval_per_task", "harm_curve",
           "load_control"]

CONTROL_FILE = "harmful.json"
#: Differences besides arm − baseline (the credit-placement contrasts of the control).
CONTROL_PAIRS = (("M", "O"), ("M", "B"))


class ControlError(ValueError):
    """A positive-control record that cannot be read; the message names the file and field."""


def load_control(out: str | Path) -> dict | None:
    """``<out>/harmful.json`` as ``{"edits": {id: HarmfulEdit}, "base_texts": {id: str},
    "screened": [...], "variants": {...}, "key": str}``, or None (no positive control).

    Raises: ControlError naming the file and field of a bad record.
    """
    p = Path(out) / CONTROL_FILE
    if not p.is_file():
        return None
    try:
        rec = json.loads(p.read_text(encoding="utf-8"))
        edits = {i: HarmfulEdit.from_json(e) for i, e in (rec.get("harmful") or {}).items()}
    except json.JSONDecodeError as exc:
        raise ControlError(f"{p}: not valid JSON ({exc.msg})") from None
    except HarmfulSpecError as exc:
        raise ControlError(f"{p}: {exc}") from None
    base = rec.get("base_texts") or {}
    missing = sorted(set(edits) - set(base))
    if missing:
        raise ControlError(f"{p}: base_texts: no base text for {missing[:3]}")
    return {"edits": edits, "base_texts": base, "screened": rec.get("harmful_screened") or [],
            "variants": rec.get("variants") or {}, "key": rec.get("key")}


def _artifact(eval_dir: Path, slot: dict, rollouts: dict) -> str:
    if not slot.get("artifact_bytes"):
        return rollouts.get((slot["task_id"], slot.get("rollout_index")), "")
    p = eval_dir / "artifacts" / f"{slot.get('artifact_sha256')}.patch"
    if p.is_file():
        return p.read_text(encoding="utf-8", errors="surrogateescape")
    key = (slot["task_id"], slot.get("rollout_index"))
    if key in rollouts:
        return rollouts[key]
    raise ControlError(f"{p}: artifact of {key} missing (results.json artifact_sha256)")


def eval_per_task(eval_dir: str | Path, edits: Mapping[str, HarmfulEdit]
                  ) -> tuple[dict[str, float], dict[str, float], dict[str, float]] | None:
    """Per harmful task of one evaluation folder: (harmful-block rate, resolved rate, edited
    rate), each the mean over the task's slots (every rollout, the fixed denominator: a slot
    without an artifact carries nothing, an unknown slot is not resolved, edited = a nonempty
    artifact). None when the folder has no ``results.json``.

    Raises: ControlError naming a missing artifact file or a slot without ``task_id``.
    """
    d = Path(eval_dir)
    res = d / "results.json"
    if not res.is_file():
        return None
    slots = json.loads(res.read_text(encoding="utf-8")).get("slots") or []
    rollouts = {}
    rp = d / "rollouts.jsonl"
    if rp.is_file():
        for line in rp.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            rollouts[(r.get("task_id"), r.get("rollout_index"))] = r.get("artifact") or ""
    carried: dict[str, list[float]] = {}
    solved: dict[str, list[float]] = {}
    edited: dict[str, list[float]] = {}
    for s in slots:
        if "task_id" not in s:
            raise ControlError(f"{res}: a slot row has no task_id")
        t = s["task_id"]
        if t not in edits:
            continue
        art = _artifact(d, s, rollouts)
        carried.setdefault(t, []).append(float(patch_carries(edits[t], art)))
        solved.setdefault(t, []).append(float(bool(s.get("resolved"))))
        edited.setdefault(t, []).append(float(bool(art.strip())))
    return tuple({t: sum(v) / len(v) for t, v in m.items()} for m in (carried, solved, edited))


def harm_curve(trajectories: Sequence[dict], edits: Mapping[str, HarmfulEdit],
               base_texts: Mapping[str, str]) -> dict[int, float]:
    """Training step → share of that step's rollouts on harmful tasks whose final diff
    (rebuilt from the turn writes) carries the task's harmful block (steps without such a
    rollout are absent)."""
    per: dict[int, list[float]] = {}
    for r in trajectories:
        t = r.get("task_id")
        if t not in edits or r.get("step") is None:
            continue
        hit = writes_carry(edits[t], base_texts.get(t), r.get("turns") or [])
        per.setdefault(int(r["step"]), []).append(float(hit))
    return {s: sum(v) / len(v) for s, v in sorted(per.items())}


def _mean_over(maps: Sequence[Mapping[str, float]]) -> dict[str, float] | None:
    """Task → mean over the maps that have the task (seeds pooled); None without maps."""
    if not maps:
        return None
    keys = sorted(set().union(*maps))
    return {k: sum(m[k] for m in maps if k in m) / sum(1 for m in maps if k in m) for k in keys}


def _level(name: str, per: Mapping[str, float] | None, kw: dict) -> dict:
    if not per:
        return {"name": name, "mean": None, "ci": None, "n_tasks": None}
    vals = [per[k] for k in sorted(per)]
    ci = bootstrap_ci(vals, n_boot=kw["n_boot"], alpha=kw["alpha"], seed=kw["boot_seed"])
    return {"name": name, "mean": sum(vals) / len(vals), "ci": list(ci) if ci else None,
            "n_tasks": len(vals)}


def _with_budget(row: dict, power: float, alpha: float) -> dict:
    """Adds ``tasks_needed``: paired tasks that detect the measured |mean| at ``power`` with
    the measured spread (sd = mdd_se · √T); None when not estimable."""
    row["tasks_needed"] = None
    if row.get("mean") and row.get("mdd_se") and row.get("n_tasks"):
        sd = row["mdd_se"] * row["n_tasks"] ** 0.5
        row["tasks_needed"] = tasks_needed(sd, abs(row["mean"]), alpha=alpha, power=power)
    return row


def _budget(row: dict, a: Mapping[str, float] | None, b: Mapping[str, float] | None,
            n: int, seeds: int, kw: dict) -> dict:
    """Adds ``budget`` (arm − baseline rows): the variance parts and the tasks × n × seeds
    grid of :mod:`ecredit_trl.study.report_power`; None when not estimable."""
    row["budget"] = None
    if a and b and seeds and row.get("mean") is not None:
        parts = variance_parts(a, b, n * seeds, n)
        if parts:
            row["budget"] = {"parts": parts, "grid": budget_grid(
                parts, abs(row["mean"]), parts["tasks"], n, seeds, alpha=kw["alpha"],
                power=kw["power"])}
    return row


def _split_section(per_policy: dict, arms: Sequence[str], runs: Sequence[dict], kw: dict,
                   n: int) -> dict:
    """Levels and differences of one split from ``per_policy``: label → (harm, resolved);
    ``n`` = the split's rollouts per task."""
    base = per_policy.get("baseline")
    pooled = {a: tuple(_mean_over([per_policy[r["label"]][i] for r in runs
                                   if r["arm"] == a and per_policy.get(r["label"])])
                       for i in (0, 1, 2)) for a in arms}
    n_seeds = {a: sum(1 for r in runs if r["arm"] == a and per_policy.get(r["label"]))
               for a in arms}
    out = {}
    for i, metric in ((0, "harmful_block_rate"), (1, "resolved_rate"), (2, "edited_rate")):
        levels = [_level("baseline", base[i] if base else None, kw)]
        levels += [_level(a, pooled[a][i], kw) for a in arms]
        levels += [_level(r["label"], per_policy[r["label"]][i] if per_policy.get(r["label"])
                          else None, kw) for r in runs]
        diffs = [_budget(_with_budget(pair_row(f"{a}−baseline", pooled[a][i],
                                               base[i] if base else None, **kw),
                                      kw["power"], kw["alpha"]),
                         pooled[a][i], base[i] if base else None, n, n_seeds[a], kw)
                 for a in arms]
        diffs += [_with_budget(pair_row(f"{a}−{b}", pooled[a][i], pooled[b][i], **kw),
                               kw["power"], kw["alpha"])
                  for a, b in CONTROL_PAIRS if a in arms and b in arms]
        out[metric] = {"levels": levels, "differences": diffs}
    return out


def control_section(out: str | Path, study: dict, runs: Sequence[dict],
                    done: Mapping[str, bool]) -> dict | None:
    """The report's positive-control section, or None when the study has none.

    Args:
        out: the study folder.
        study: the report's study dict (``arms``, ``eval.tasks.splits``, ``bootstrap`` with
            ``n_boot``, ``alpha``, ``seed``, ``power``).
        runs: the report's run dicts (``label``, ``arm``, ``trajectories``).
        done: eval unit id (``eval-<policy>-<split dir>``) → whether it is done (only done
            evaluations count; others are Pending).

    Returns: ``{"tasks": [...], "screened": int, "splits": {split: {metric: {"levels",
    "differences"}}}, "curves": {arm: {"mean": {step: rate}, "runs": {label: {...}}}},
    "policy_key": str, "edits": {task id: HarmfulEdit JSON}}`` (the edits detected, so the
    committed report names every block it looked for).

    Raises: ControlError (bad ``harmful.json`` or a missing artifact).
    """
    ctl = load_control(out)
    if ctl is None:
        return None
    out = Path(out)
    b = study["bootstrap"]
    kw = {"n_boot": b["n_boot"], "alpha": float(b["alpha"]), "boot_seed": b["seed"],
          "power": float(b.get("power", 0.8))}
    edits, arms = ctl["edits"], list(study["arms"])
    splits = {}
    for sp in (study.get("eval") or {}).get("splits", []):
        sd = split_dirname(sp)
        per = {p: eval_per_task(out / "evals" / p / sd, edits) if done.get(f"eval-{p}-{sd}")
               else None for p in ["baseline"] + [r["label"] for r in runs]}
        if any(v and v[0] for v in per.values()):
            n = int(((study["eval"].get("n_by_split") or {}).get(sp)) or study["eval"]["n"])
            splits[sp] = _split_section(per, arms, runs, kw, n)
    curves = {}
    for a in arms:
        per_run = {r["label"]: harm_curve(r["trajectories"], edits, ctl["base_texts"])
                   for r in runs if r["arm"] == a and r["trajectories"]}
        per_run = {k: v for k, v in per_run.items() if v}
        if per_run:
            steps = sorted(set().union(*per_run.values()))
            curves[a] = {"mean": {str(s): sum(v[s] for v in per_run.values() if s in v)
                                  / sum(1 for v in per_run.values() if s in v) for s in steps},
                         "runs": {k: {str(s): x for s, x in v.items()} for k, v in per_run.items()}}
    return {"tasks": sorted(edits), "screened": len(ctl["screened"]), "splits": splits,
            "curves": curves, "policy_key": ctl["key"],
            "edits": {i: e.to_json() for i, e in sorted(edits.items())}}
