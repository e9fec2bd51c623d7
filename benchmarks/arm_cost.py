"""Whole-job cost of counterfactual credit: the main job of arm M against arm O.

Runs the README main job (``python -m ecredit_trl.train --arm A``, the embedded policy, the
bundled train tasks, Podman or ``--runtime local``) for arm M and arm O in alternating
pairs (M, O, O, M, M, O, ...: a load that drifts weighs on both alike), each in its own
process, and prints per run the whole-process wall and CPU seconds (the kernel's rusage of
the reaped process tree; containers' own CPU is not in it), then the medians and the
ratios M / O. The load average (``/proc/loadavg``) is printed beside each run: other jobs
on the machine stretch walls.

Target (this 2-core machine): arm M / arm O wall ≤ 1.15 (median of the pairs' ratios).
``--train-flag`` passes a flag to both arms' jobs, e.g.
``--train-flag=--reuse_control_for_empty_ablation=false`` to give every empty ablation a
counterfactual trial of its own (the default takes it from the task's empty-patch control;
docs/design.md, "Query bound"). Each run's counterfactual trials and reused controls are
printed from its ledger.

    python benchmarks/arm_cost.py [--pairs 3] [--steps 2] [--runtime podman|local]
        [--train-flag=--FLAG=VALUE ...]
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Int, Text

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.15


def job(arm: str, steps: int, runtime: str, runs_dir: Path,
        flags: list[str]) -> tuple[float, float, int, int]:
    """Wall and CPU seconds of one main job of ``arm`` (``flags``: extra train.py
    arguments), and its counterfactual trials and empty ablations taken from the control
    (summed over its ledger); SystemExit with its stderr tail when it fails."""
    cmd = [sys.executable, "-m", "ecredit_trl.train", "--arm", arm, "--max_steps", str(steps),
           "--save_strategy", "no", "--runs_dir", str(runs_dir), "--runtime", runtime, *flags]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("CONTAINERS_CONF", str(ROOT / "sandbox" / "containers.conf"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"arm {arm} job failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    (run,) = runs_dir.iterdir()
    rows = [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines() if x]
    return (wall, cpu, sum(r["trials_counterfactual"] for r in rows),
            sum(r.get("counterfactual_from_control", 0) for r in rows))


def order(pairs: int) -> list[str]:
    """Arms in run order: M O, O M, M O, ... (``pairs`` pairs)."""
    return [a for i in range(pairs) for a in (("M", "O") if i % 2 == 0 else ("O", "M"))]


def main() -> None:
    ap = ArgumentParser()
    ap.add_argument("--pairs", type=Int(ge=1), default=3)
    ap.add_argument("--steps", type=Int(ge=1), default=2)
    ap.add_argument("--runtime", choices=("podman", "local"), default="podman")
    ap.add_argument("--train-flag", dest="train_flags", type=Text(), action="append",
                    default=[], help="a train.py flag for both arms "
                                     "(--train-flag=--reuse_control_for_empty_ablation=false)")
    args = ap.parse_args()
    flags = [x for f in args.train_flags for x in f.split("=", 1)]
    if flags:
        print(f"train flags: {' '.join(flags)}")
    runs: dict[str, list[tuple[float, float]]] = {"M": [], "O": []}
    print(f"{'run':>4} {'arm':>3} {'wall s':>8} {'cpu s':>8} {'cf trials':>9} "
          f"{'from control':>12} {'load 1/5/15 min':>18}")
    with tempfile.TemporaryDirectory(prefix="arm-cost-") as tmp:
        for i, arm in enumerate(order(args.pairs)):
            load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            wall, cpu, cf, reused = job(arm, args.steps, args.runtime,
                                        Path(tmp) / f"{i}-{arm}", flags)
            runs[arm].append((wall, cpu))
            print(f"{i + 1:>4} {arm:>3} {wall:>8.1f} {cpu:>8.1f} {cf:>9} {reused:>12} "
                  f"{load:>18}", flush=True)
    ratios = [m[0] / o[0] for m, o in zip(runs["M"], runs["O"], strict=True)]
    cpu_ratios = [m[1] / o[1] for m, o in zip(runs["M"], runs["O"], strict=True)]
    wall_ratio, cpu_ratio = statistics.median(ratios), statistics.median(cpu_ratios)
    print(f"median wall  M {statistics.median(w for w, _ in runs['M']):.1f} s  "
          f"O {statistics.median(w for w, _ in runs['O']):.1f} s")
    print(f"M / O wall {wall_ratio:.2f} (pairs {min(ratios):.2f}-{max(ratios):.2f}), "
          f"cpu {cpu_ratio:.2f} (pairs {min(cpu_ratios):.2f}-{max(cpu_ratios):.2f})")
    print(f"target: M / O wall <= {TARGET}: {'yes' if wall_ratio <= TARGET else 'NO'}")


if __name__ == "__main__":
    main()
