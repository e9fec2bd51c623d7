"""Study budget: where a study's wall time goes, and what a whole study would cost (issue 14 §2).

Reads finished records only (it runs nothing):

* training run dirs (``train.py`` output): per step ``wall_s`` and its stages from
  ``ledger.jsonl`` (``generation_busy_s``, ``tool_busy_s``, ``verifier_busy_s``), trials per
  step (factual / counterfactual / control) and the run's wall seconds from the first to the
  last ledger row;
* evaluation dirs (``eval.run --out``): slots, wall seconds (``results.json`` ``wall_s``),
  factual trials and empty-patch controls, and the **verdict-cache candidate**: slots whose
  (task, artifact sha256) repeats an earlier non-empty slot of the same evaluation (a trial a
  cache keyed on identical artifacts would not run; empty artifacts are already answered by
  the task's control).

Then a projection of a study of ``--arms``/``--seeds`` training runs of ``--steps`` steps and
``1 + runs`` evaluations of each split, from the measured per-step and per-eval means (B and M
add their measured counterfactual share per step when a B/M run is given; otherwise
``--cf-share`` of the factual trials).  Timings depend on the machine's load: the script
prints the 1-minute load average so each table carries it.

    python benchmarks/study_budget.py --runs exp/runs/* --evals exp/eval-* \
        [--steps 12] [--startup-s 35] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file (blank lines skipped). Raises FileNotFoundError naming the path."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_summary(run_dir: Path) -> dict:
    """Per-step means of one training run dir: ``wall_s``, stages (s), trials; ``arm``.

    Raises ValueError naming the run dir when its ledger has no rows."""
    rows = read_jsonl(run_dir / "ledger.jsonl")
    if not rows:
        raise ValueError(f"{run_dir}/ledger.jsonl: no step rows")
    arm = json.loads((run_dir / "config.json").read_text()).get("arm") if (
        run_dir / "config.json").exists() else rows[0].get("arm")

    def mean(key: str) -> float:
        return statistics.fmean(float(r.get(key) or 0.0) for r in rows)

    return {"run": run_dir.name, "arm": arm or rows[0].get("arm"), "steps": len(rows),
            "wall_s": mean("wall_s"), "generation_s": mean("generation_busy_s"),
            "tool_s": mean("tool_busy_s"), "verifier_s": mean("verifier_busy_s"),
            "factual": mean("trials_factual"), "counterfactual": mean("trials_counterfactual"),
            "control": mean("trials_control"), "rollouts": mean("rollouts"),
            "resolved_rate": sum(r["resolved"] for r in rows) / max(1, sum(r["rollouts"] for r in rows))}


def eval_summary(eval_dir: Path) -> dict:
    """Slots, wall seconds, trials and duplicate (task, artifact) slots of one eval dir.

    The last row per (task, rollout_index) of ``slots.jsonl`` counts (a resumed eval appends)."""
    res = json.loads((eval_dir / "results.json").read_text())
    last: dict[tuple, dict] = {}
    for r in read_jsonl(eval_dir / "slots.jsonl"):
        last[(r["task_id"], r["rollout_index"])] = r
    rows = list(last.values())
    nonempty = [r for r in rows if (r.get("artifact_bytes") or 0) > 0]
    unique = collections.Counter((r["task_id"], r["artifact_sha256"]) for r in nonempty)
    s = res["summary"]
    return {"eval": eval_dir.name, "split": res.get("split"), "slots": len(rows),
            "success": s.get("success"), "wall_s": res.get("wall_s"),
            "nonempty": len(nonempty), "unique_task_artifact": len(unique),
            "cache_saves": len(nonempty) - len(unique),
            "controls": len({r["task_id"] for r in rows}),
            "service_s": (res.get("cost") or {}).get("service_s")}


def project(runs: list[dict], evals: list[dict], *, arms: dict[str, int], steps: int,
            startup_s: float, cf_share: float, step_s: float | None = None) -> dict:
    """Projected study wall seconds: training (per arm: seeds × (startup + steps × step s))
    plus evaluations (per split: (1 + number of runs) × mean eval wall s). An O step's wall
    seconds scale by (factual + counterfactual + control) / (factual + control) for B/M, with
    the measured share of a B/M run when one is given, else ``cf_share``. ``step_s``
    replaces the measured mean O step seconds (e.g. a figure taken on a quiet machine)."""
    o_step = step_s or statistics.fmean(r["wall_s"] for r in runs)
    bm = [r for r in runs if r["arm"] in ("B", "M") and r["factual"]]
    share = statistics.fmean(r["counterfactual"] / r["factual"] for r in bm) if bm else cf_share
    fac = statistics.fmean(r["factual"] for r in runs)
    ctl = statistics.fmean(r["control"] for r in runs)
    train = {}
    for arm, seeds in arms.items():
        k = (fac * (1 + share) + ctl) / (fac + ctl) if arm in ("B", "M") else 1.0
        train[arm] = seeds * (startup_s + steps * o_step * k)
    n_runs = sum(arms.values())
    by_split: dict[str, list[float]] = collections.defaultdict(list)
    for e in evals:
        if e["wall_s"]:
            by_split[e["split"]].append(float(e["wall_s"]))
    ev = {sp: (1 + n_runs) * statistics.fmean(w) for sp, w in by_split.items()}
    return {"train_s": train, "eval_s": ev, "cf_share": share,
            "total_s": sum(train.values()) + sum(ev.values())}


def main(argv: list[str] | None = None) -> int:
    """CLI: print the run and eval tables and the projection (exit 0; 2 on bad input)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="*", default=[], help="training run dirs")
    ap.add_argument("--evals", nargs="*", default=[], help="eval.run --out dirs")
    ap.add_argument("--steps", type=int, default=12, help="training steps per run (projection)")
    ap.add_argument("--arms", default="O:2,B:2,M:2,E:1", help="ARM:SEEDS,... (projection)")
    ap.add_argument("--startup-s", type=float, default=35.0, help="seconds per run before step 1")
    ap.add_argument("--cf-share", type=float, default=0.6,
                    help="counterfactual trials per factual trial of B/M without a B/M run")
    ap.add_argument("--step-s", type=float, default=None,
                    help="seconds per O step for the projection (default: the measured mean)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args(argv)
    try:
        arms = {k: int(v) for k, v in (p.split(":") for p in a.arms.split(","))}
        runs = [run_summary(Path(p)) for p in a.runs]
        evals = [eval_summary(Path(p)) for p in a.evals]
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"load average (1 min): {os.getloadavg()[0]:.1f}")
    print("| run | arm | steps | wall s/step | gen s | tool s | verifier s | factual | cf | "
          "control | resolved |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['run']} | {r['arm']} | {r['steps']} | {r['wall_s']:.1f} | "
              f"{r['generation_s']:.1f} | {r['tool_s']:.1f} | {r['verifier_s']:.1f} | "
              f"{r['factual']:.1f} | {r['counterfactual']:.1f} | {r['control']:.1f} | "
              f"{r['resolved_rate']:.2f} |")
    print("\n| eval | split | slots | success | wall s | s/slot | non-empty | unique (task, artifact) "
          "| cache would save | controls |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for e in evals:
        per = f"{e['wall_s'] / e['slots']:.2f}" if e["wall_s"] else "Pending"
        print(f"| {e['eval']} | {e['split']} | {e['slots']} | {e['success']:.3f} | "
              f"{e['wall_s'] or 'Pending'} | {per} | {e['nonempty']} | "
              f"{e['unique_task_artifact']} | {e['cache_saves']} | {e['controls']} |")
    out = {"runs": runs, "evals": evals}
    if runs and evals:
        p = project(runs, evals, arms=arms, steps=a.steps, startup_s=a.startup_s,
                    cf_share=a.cf_share, step_s=a.step_s)
        out["projection"] = p
        print(f"\nprojection ({a.arms}, {a.steps} steps, cf share {p['cf_share']:.2f}): "
              + ", ".join(f"train {k} {v / 60:.1f} min" for k, v in p["train_s"].items())
              + ", " + ", ".join(f"eval {k} {v / 60:.1f} min" for k, v in p["eval_s"].items())
              + f"; total {p['total_s'] / 60:.1f} min")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
