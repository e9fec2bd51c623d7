"""Study budget: where a study's wall time goes, and what a whole study would cost.

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

Without records, ``--service`` projects a study from **service times** instead (for
the official template on a cluster, whose trials this machine cannot time): per training step
``--rollouts`` rollouts, each verified by one factual trial plus, for B and M, one
counterfactual trial (``--trials-per-rollout`` is that upper bound), ``--trial-s LO HI``
seconds a trial and ``--concurrency`` trials at once per verifier host × ``--hosts``; an
evaluation of a split is ``tasks × n`` slots plus one empty-patch control per task. The
verifier wall of a batch of k trials is ``ceil(k / (concurrency × hosts)) × trial s``
(whole waves, every trial as long as LO or as HI): a lower bound on a step's wall, which
adds generation and the optimizer step on top.

    python benchmarks/study_budget.py --service --steps 80 --arms O:3,B:3,M:3,E:3 \
        --rollouts 64 --trials-per-rollout 2 --trial-s 115 237 --concurrency 24 \
        --split official500=500x2 --split holdout100=100x16
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
from pathlib import Path

from sandbox.bounds import ArgumentParser, Float, InDir, Int, OutFile, Source, Text


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


def service_projection(*, arms: dict[str, int], steps: int, rollouts: int,
                       trials_per_rollout: int, trial_s: tuple[float, float],
                       concurrency: int, hosts: int = 1,
                       splits: dict[str, tuple[int, int]] | None = None) -> dict:
    """Trials and verifier-bound wall of a study from service times (pure; module docstring).

    Args:
        arms: arm → seeds (training runs). steps: optimizer steps per run.
        rollouts: rollouts per step. trials_per_rollout: trials a B/M rollout needs at most
            (factual + counterfactual); O and E rollouts need 1.
        trial_s: (low, high) seconds one verifier trial takes.
        concurrency, hosts: trials at once per verifier host, and hosts.
        splits: split → (tasks, n); each of the ``1 + runs`` policies is evaluated on each.

    Returns: ``{"per_step": {arm: {"trials", "waves", "wall_s": [lo, hi]}}, "train":
        {arm: {"trials", "wall_s": [lo, hi]}}, "eval": {split: {"trials", "wall_s": [lo,
        hi]}}, "trials", "wall_s": [lo, hi], "trial_hours": [lo, hi]}`` (wall in seconds,
        trial hours = trials × trial s / 3600, the verifier service bought).

    Raises: ValueError naming a count < 1 or a bad trial_s range.
    """
    for name, v in (("steps", steps), ("rollouts", rollouts), ("concurrency", concurrency),
                    ("hosts", hosts), ("trials_per_rollout", trials_per_rollout)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    lo, hi = trial_s
    if not 0 < lo <= hi:
        raise ValueError(f"trial_s: expected 0 < low <= high, got {trial_s!r}")
    slots = concurrency * hosts
    per_step, train = {}, {}
    for arm, seeds in arms.items():
        k = rollouts * (trials_per_rollout if arm in ("B", "M") else 1)
        waves = -(-k // slots)
        per_step[arm] = {"trials": k, "waves": waves, "wall_s": [waves * lo, waves * hi]}
        train[arm] = {"trials": seeds * steps * k,
                      "wall_s": [seeds * steps * waves * lo, seeds * steps * waves * hi]}
    policies = 1 + sum(arms.values())
    ev = {}
    for split, (tasks, n) in (splits or {}).items():
        k = tasks * n + tasks  # slots + one empty-patch control per task
        waves = -(-k // slots)
        ev[split] = {"trials": policies * k,
                     "wall_s": [policies * waves * lo, policies * waves * hi]}
    trials = sum(t["trials"] for t in train.values()) + sum(e["trials"] for e in ev.values())
    wall = [sum(t["wall_s"][i] for t in train.values()) + sum(e["wall_s"][i] for e in ev.values())
            for i in (0, 1)]
    return {"per_step": per_step, "train": train, "eval": ev, "trials": trials,
            "wall_s": wall, "trial_hours": [trials * lo / 3600, trials * hi / 3600]}


def _print_service(p: dict, a) -> None:
    h = 3600.0
    print(f"service projection: {a.arms}, {a.steps} steps, {a.rollouts} rollouts/step, up to "
          f"{a.trials_per_rollout} trials/rollout (B, M), {a.trial_s[0]:g}-{a.trial_s[1]:g} s "
          f"a trial, {a.concurrency} trials at once x {a.hosts} verifier host(s)")
    print("| unit | trials | verifier-bound wall h (low-high) |")
    print("|---|---|---|")
    for arm, d in p["per_step"].items():
        print(f"| one {arm} step | {d['trials']} ({d['waves']} waves) | "
              f"{d['wall_s'][0] / 60:.1f}-{d['wall_s'][1] / 60:.1f} min |")
    for arm, d in p["train"].items():
        print(f"| train {arm} (all seeds) | {d['trials']} | "
              f"{d['wall_s'][0] / h:.1f}-{d['wall_s'][1] / h:.1f} |")
    for sp, d in p["eval"].items():
        print(f"| eval {sp} (every policy) | {d['trials']} | "
              f"{d['wall_s'][0] / h:.1f}-{d['wall_s'][1] / h:.1f} |")
    print(f"total: {p['trials']} trials, verifier-bound wall {p['wall_s'][0] / h:.1f}-"
          f"{p['wall_s'][1] / h:.1f} h, verifier service {p['trial_hours'][0]:.0f}-"
          f"{p['trial_hours'][1]:.0f} trial-hours")


def _split_arg(v: str) -> tuple[str, tuple[int, int]]:
    name, _, size = v.partition("=")
    tasks, _, n = size.partition("x")
    if not name or not tasks.isdigit() or not n.isdigit():
        raise ValueError(f"--split: expected NAME=TASKSxN (official500=500x2), got {v!r}")
    return name, (int(tasks), int(n))


def main(argv: list[str] | None = None) -> int:
    """CLI: print the run and eval tables and the projection (exit 0; 2 on bad input)."""
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=InDir(), nargs="*", default=[], help="training run dirs")
    ap.add_argument("--evals", type=InDir(), nargs="*", default=[], help="eval.run --out dirs")
    ap.add_argument("--steps", type=Int(ge=1), default=12, help="training steps per run (projection)")
    ap.add_argument("--arms", type=Text(), default="O:2,B:2,M:2,E:1", help="ARM:SEEDS,... (projection)")
    ap.add_argument("--startup-s", type=Float(ge=0, why="seconds"), default=35.0, help="seconds per run before step 1")
    ap.add_argument("--cf-share", type=Float(ge=0, le=1, why="a fraction"), default=0.6,
                    help="counterfactual trials per factual trial of B/M without a B/M run")
    ap.add_argument("--step-s", type=Float(gt=0, why="seconds"), default=None,
                    help="seconds per O step for the projection (default: the measured mean)")
    ap.add_argument("--json", type=OutFile(), default=None, help="also write the figures here")
    ap.add_argument("--service", action="store_true",
                    help="project from service times (no records; see the module docstring)")
    ap.add_argument("--rollouts", type=Int(ge=1), default=64, help="--service: rollouts per step")
    ap.add_argument("--trials-per-rollout", type=Int(ge=1), default=2,
                    help="--service: trials a B/M rollout needs at most")
    ap.add_argument("--trial-s", type=Float(gt=0, why="seconds"), nargs=2, default=(115.0, 237.0),
                    metavar=("LOW", "HIGH"), help="--service: seconds one verifier trial takes")
    ap.add_argument("--concurrency", type=Int(ge=1), default=24,
                    help="--service: trials at once per verifier host")
    ap.add_argument("--hosts", type=Int(ge=1), default=1, help="--service: verifier hosts")
    ap.add_argument("--split", type=Source(), action="append", default=[],
                    help="--service: NAME=TASKSxN evaluated for every policy (repeatable)")
    a = ap.parse_args(argv)
    if a.service:
        try:
            arms = {k: int(v) for k, v in (p.split(":") for p in a.arms.split(","))}
            p = service_projection(arms=arms, steps=a.steps, rollouts=a.rollouts,
                                   trials_per_rollout=a.trials_per_rollout,
                                   trial_s=tuple(a.trial_s), concurrency=a.concurrency,
                                   hosts=a.hosts, splits=dict(map(_split_arg, a.split)))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        _print_service(p, a)
        if a.json:
            Path(a.json).write_text(json.dumps(p, indent=1))
        return 0
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
