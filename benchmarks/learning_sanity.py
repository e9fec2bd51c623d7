"""Does the trainer learn? Train on the tasks the starting policy solves sometimes, and
measure success on them before and after.

The field's first sanity check of an RL trainer (prime-rl's: problems the starting model
solves 20–80 % of the time, trained on alone, must end above 95 %), on the embedded default:

1. **Select.** ``eval.run`` of the starting policy (default: the embedded warm policy) on
   ``--select-from`` (default ``bundled:train``) with ``--n`` rollouts a task (seed 0) at the
   training run's own generation settings (max turns, new tokens, temperature: those of
   :func:`ecredit_trl.train.embedded_defaults`, stated in every ``results.json``); of the
   tasks solved in ``[--lo, --hi]`` of their rollouts, the ``--max-tasks`` closest to one
   half are the sanity tasks (``sanity_tasks.jsonl``).
2. **Before.** A fresh evaluation of the starting policy on the sanity tasks (seed 1): the
   selection's own figures are biased upwards and downwards by the selection (regression to
   the mean), so the start is measured again.
3. **Train** each arm (``--arms``, default O then M, B, E) on exactly the sanity tasks,
   ``--steps`` steps, with the trainer's defaults plus any ``--train-flag`` given
   (``python ecredit_trl/train.py``; arms share the seed). Every step holds every sanity
   task's group of ``--group`` rollouts (``num_generations`` = group,
   ``per_device_train_batch_size`` = tasks x group), unless a ``--train-flag`` sets either
   (the other then keeps the trainer's default). Why: with one task's group a step, the
   updates for the other tasks moved a task the policy solved down as often as up (docs:
   "Does it learn?").
4. **After.** ``eval.run`` of each trained run on the sanity tasks (seed 1, the run's own
   settings, which ``eval.run`` reads from the run). The benchmark stops, naming the field,
   when any evaluation's generation settings differ from the others'.

Prints, and writes to ``--out`` (``sanity.json``, ``sanity.md``, ``curve.png``): the per-step
resolved rate of each arm's training rollouts (from its ``ledger.jsonl``), the sampling–
training agreement of its steps, and per arm before → after success with the task-paired
difference and its 95 % bootstrap CI (:func:`eval.metrics.paired_bootstrap`). Every phase
is skipped when its output exists (rerun the same command to resume).

    python benchmarks/learning_sanity.py --out OUT [--arms O M B E] [--steps 12] [--group 8]
        [--n 8] [--lo 0.2] [--hi 0.8] [--max-tasks 4] [--runtime podman]
        [--train-flag=--learning_rate=2e-4 ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ecredit_trl.train import embedded_defaults  # noqa: E402
from eval.metrics import paired_bootstrap  # noqa: E402
from eval.tasks.schema import save_tasks  # noqa: E402
from eval.tasks.splits import load_tasks  # noqa: E402
from sandbox.bounds import ArgumentParser, Choice, Float, Int, OutDir, Text  # noqa: E402

ENV = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


PHASES = "phases.json"
"""Seconds of each phase that ran, by its log's name, kept across resumed invocations."""


def run(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` (from the repository root), its output to ``log``; exit on failure. Its
    seconds are added to ``PHASES`` beside the log."""
    t0 = time.monotonic()
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=ENV).returncode
    took = time.monotonic() - t0
    print(f"  [{took:6.0f} s] {' '.join(cmd[1:4])} ... (log {log})", flush=True)
    if rc != 0:
        sys.exit(f"learning_sanity: {' '.join(cmd)} exited {rc}; see {log}")
    phases = log.parent / PHASES
    seen = json.loads(phases.read_text()) if phases.is_file() else {}
    seen[log.stem] = round(took, 1)
    phases.write_text(json.dumps(seen, indent=1))


def evaluate(model: str, split: str, out: Path, *, n: int, seed: int, runtime: str,
             settings: list[str]) -> dict:
    """``eval.run`` of ``model`` on ``split`` into ``out`` (skipped when done); its
    ``results.json``."""
    if not (out / "results.json").is_file():
        run([sys.executable, "-m", "eval.run", "--model", model, "--split", split,
             "--n", str(n), "--seed", str(seed), "--runtime", runtime, "--out", str(out),
             *settings], out.with_suffix(".log"))
    return json.loads((out / "results.json").read_text())


def same_settings(a: dict, b: dict, where: str) -> None:
    """Exit naming the generation settings two evaluations differ in: a before/after
    comparison at different budgets (a bare model directory gets ``eval.run``'s defaults,
    a run directory its training settings) would compare different things."""
    sa, sb = a.get("settings") or {}, b.get("settings") or {}
    differ = sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k))
    if differ:
        sys.exit(f"learning_sanity: {where}: the evaluations' generation settings differ in "
                 + ", ".join(f"{k} ({sa.get(k)!r} vs {sb.get(k)!r})" for k in differ))


def per_task(results: dict) -> dict[str, float]:
    """task id → resolved rollouts / n."""
    return {t: v["success"] for t, v in results["summary"]["per_task"].items()}


def ledger(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines() if x]


def train(arm: str, tasks: Path, out: Path, *, steps: int, runtime: str, policy: str,
          flags: list[str]) -> Path:
    """Train ``arm`` on ``tasks`` (skipped when its run completed); the run directory."""
    runs = out / f"runs-{arm}"
    done = [d for d in runs.glob("*/checkpoint-final")] if runs.is_dir() else []
    if not done:
        run([sys.executable, "ecredit_trl/train.py", "--arm", arm, "--model", policy,
             "--tasks", str(tasks), "--max_steps", str(steps), "--runtime", runtime,
             "--runs_dir", str(runs), *flags], out / f"train-{arm}.log")
        done = list(runs.glob("*/checkpoint-final"))
    return done[0].parent


def same_tasks(tasks_file: Path, chosen: list[str]) -> None:
    """Stop, naming ``tasks_file``, when a resumed invocation selects other tasks than the
    ones its earlier phases ran on (another ``--max-tasks``, ``--lo`` or ``--hi``): its batch
    and its before/after figures would describe different tasks."""
    kept = sorted(json.loads(x)["instance_id"] for x in tasks_file.read_text().splitlines() if x)
    if kept != sorted(chosen):
        sys.exit(f"learning_sanity: {tasks_file} holds {len(kept)} tasks ({', '.join(kept)}), "
                 f"this invocation selects {len(chosen)} ({', '.join(chosen)}): resume with "
                 "the first invocation's --max-tasks/--lo/--hi, or use a new --out")


SHAPE_FIELDS = ("num_generations", "per_device_train_batch_size")


def batch_flags(flags: list[str], *, tasks: int, group: int) -> list[str]:
    """The train.py flags that put every sanity task's group in every step: ``group``
    rollouts a task (``num_generations``), ``tasks x group`` a step; none when ``flags``
    (split ``--name value`` pairs) already set either, so a user's shape is kept whole."""
    if any(f.split("=", 1)[0].lstrip("-").replace("-", "_") in SHAPE_FIELDS for f in flags):
        return []
    return ["--num_generations", str(group), "--per_device_train_batch_size", str(tasks * group)]


def running_mean(ys: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each step (fewer at the start): with one task a
    step, a window of the task count averages over one visit of each task."""
    return [sum(ys[max(0, i + 1 - window):i + 1]) / (i + 1 - max(0, i + 1 - window))
            for i in range(len(ys))]


def plot(curves: dict[str, list[float]], before: float, window: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for arm, ys in curves.items():
        xs = range(1, len(ys) + 1)
        (line,) = ax.plot(xs, running_mean(ys, window), label=f"arm {arm}")
        ax.plot(xs, ys, linestyle="none", marker=".", alpha=0.35, color=line.get_color())
    ax.axhline(before, color="grey", linestyle="--", label="start (evaluation)")
    ax.set(xlabel="step", ylabel="resolved rate of the training rollouts", ylim=(-0.05, 1.05),
           title=f"Training on the sanity tasks (dots: each step; lines: mean of {window})")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--out", type=OutDir(), required=True, help="work and result folder")
    ap.add_argument("--arms", type=Choice("O", "M", "B", "E"), nargs="+",
                    default=["O", "M", "B", "E"])
    ap.add_argument("--steps", type=Int(ge=1), default=12, help="training steps per arm (12)")
    ap.add_argument("--group", type=Int(ge=2), default=8,
                    help="rollouts of each sanity task in every step (8; num_generations, the "
                         "batch holds every task's group; off when a --train-flag sets "
                         "num_generations or per_device_train_batch_size: the other then "
                         "keeps the trainer's default)")
    ap.add_argument("--n", type=Int(ge=2), default=8, help="rollouts per task, each eval")
    ap.add_argument("--lo", type=Float(ge=0, le=1), default=0.2)
    ap.add_argument("--hi", type=Float(ge=0, le=1), default=0.8)
    ap.add_argument("--max-tasks", dest="max_tasks", type=Int(ge=1), default=4,
                    help="at most this many sanity tasks (4; each is in every step's batch)")
    ap.add_argument("--select-from", dest="select_from", type=Text(), default="bundled:train")
    ap.add_argument("--model", type=Text(), default=None,
                    help="starting policy (default: the embedded warm policy)")
    ap.add_argument("--runtime", type=Choice("podman", "local"), default="podman")
    ap.add_argument("--train-flag", dest="train_flags", type=Text(), action="append",
                    default=[], help="a train.py flag (--train-flag=--learning_rate=2e-4)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()

    policy = a.model
    if policy is None:
        from ecredit_trl.policy.warmstart import ensure_default_policy

        policy = str(ensure_default_policy(load_tasks("bundled:train", purpose="train")))
    d = embedded_defaults(on_gpu=False)
    settings = ["--max-turns", str(d["max_turns"]), "--max-new-tokens",
                str(d["max_completion_length"]), "--temperature", str(d["temperature"])]
    flags = [x for f in a.train_flags for x in f.split("=", 1)]

    print(f"1. select: {a.select_from}, n={a.n}, solved in [{a.lo}, {a.hi}]", flush=True)
    sel = evaluate(policy, a.select_from, out / "select", n=a.n, seed=0, runtime=a.runtime,
                   settings=settings)
    # closest to one half first (the most mixed groups, the most signal), then by id
    ranked = sorted((abs(s - 0.5), t) for t, s in per_task(sel).items() if a.lo <= s <= a.hi)
    chosen = sorted(t for _, t in ranked[:a.max_tasks])
    if not chosen:
        sys.exit(f"learning_sanity: no task of {a.select_from} is solved in [{a.lo}, {a.hi}]")
    tasks_file = out / "sanity_tasks.jsonl"
    if tasks_file.is_file():
        same_tasks(tasks_file, chosen)
    else:
        by_id = {t.instance_id: t for t in load_tasks(a.select_from, purpose="train")}
        save_tasks([by_id[t] for t in chosen], tasks_file)
    print(f"   {len(chosen)} sanity tasks: {', '.join(chosen)}", flush=True)
    flags = batch_flags(flags, tasks=len(chosen), group=a.group) + flags

    print("2. before (seed 1)", flush=True)
    before_res = evaluate(policy, str(tasks_file), out / "before", n=a.n, seed=1,
                          runtime=a.runtime, settings=settings)
    same_settings(sel, before_res, "select vs before")
    before = per_task(before_res)
    result = {"tasks": chosen, "n": a.n, "steps": a.steps, "train_flags": flags,
              "settings": sel.get("settings"), "select": per_task(sel), "before": before,
              "arms": {}}
    for arm in a.arms:
        print(f"3. train arm {arm}, then evaluate it", flush=True)
        run_dir = train(arm, tasks_file, out, steps=a.steps, runtime=a.runtime, policy=policy,
                        flags=flags)
        rows = ledger(run_dir)
        after_res = evaluate(str(run_dir), str(tasks_file), out / f"after-{arm}", n=a.n,
                             seed=1, runtime=a.runtime, settings=[])
        same_settings(before_res, after_res, f"before vs after arm {arm}")
        after = per_task(after_res)
        pb = paired_bootstrap(after, before, n_boot=10000, seed=0)
        result["arms"][arm] = {
            "run": str(run_dir), "after": after,
            "curve": [r["resolved"] / max(1, r["rollouts"]) for r in rows],
            "logp_diff_mean": max((r.get("sampling_logp_diff_mean") or 0) for r in rows),
            "before_mean": sum(before.values()) / len(before),
            "after_mean": sum(after.values()) / len(after),
            "diff": pb["mean"], "ci": pb["ci"]}
    result["wall_s"] = round(time.monotonic() - t_start, 1)
    phases = out / PHASES
    result["phase_s"] = json.loads(phases.read_text()) if phases.is_file() else {}

    lines = ["| arm | start | end | end − start | 95 % CI (task-paired) | "
             "max step logp-diff mean |", "|---|---|---|---|---|---|"]
    for arm, r in result["arms"].items():
        lines.append(f"| {arm} | {r['before_mean']:.3f} | {r['after_mean']:.3f} | "
                     f"{r['diff']:+.3f} | [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}] | "
                     f"{r['logp_diff_mean']:.1e} |")
    curves = ["", "Per-step resolved rate of the training rollouts:"]
    curves += [f"  {arm}: " + " ".join(f"{x:.2f}" for x in r["curve"])
               for arm, r in result["arms"].items()]
    curves += ["", f"The same, mean over the last {len(chosen)} steps (one visit of each task):"]
    curves += [f"  {arm}: " + " ".join(f"{x:.2f}" for x in running_mean(r["curve"], len(chosen)))
               for arm, r in result["arms"].items()]
    text = "\n".join([f"{len(chosen)} sanity tasks, n = {a.n}, {a.steps} steps, "
                      f"flags {' '.join(flags) or '(defaults)'}", "", *lines, *curves,
                      "", f"wall {result['wall_s']:.0f} s (this invocation); phases that ran, "
                      "over every invocation: " + ", ".join(
                          f"{k} {v:.0f} s" for k, v in result["phase_s"].items())
                      + f"; total {sum(result['phase_s'].values()):.0f} s"])
    print("\n" + text)
    (out / "sanity.json").write_text(json.dumps(result, indent=1))
    (out / "sanity.md").write_text(text + "\n")
    if result["arms"]:
        plot({k: v["curve"] for k, v in result["arms"].items()},
             sum(before.values()) / len(before), len(chosen), out / "curve.png")


if __name__ == "__main__":
    main()
