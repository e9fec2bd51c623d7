"""Training-step pipeline: ``pipeline: sequential`` vs ``overlapped`` on one seeded config.

Runs the main job twice from one invocation (each in its own process, same seed, same
config: the embedded policy, the bundled train tasks, Podman, ``--rollouts`` rollouts
per step, ``--steps`` steps) and prints, per pipeline and step, from the run's own
records (``ledger.jsonl`` timing fields, TRL's ``step_time`` in ``metrics.jsonl``):

* busy seconds per stage: generation, tool execution, verification (unions of
  intervals: concurrent work counts once, see ``ecredit_trl.runs.timings``);
* the round wall (``wall_s``: environments, generation, tools, trials, scoring) and the
  step wall (TRL's ``step_time``: the round plus the optimizer step);
* ``round wall / max(stage busy)`` and ``overlapped / sequential`` walls;
* whether the two runs' records are identical except timings (the seeded contract).

Targets (issue 15 §3, this 2-core machine): overlapped step wall ≤ 0.7 × sequential,
round wall / max(stage busy) ≤ 1.3.

With ``--repeats 2`` the runs go sequential, overlapped, overlapped, sequential (a load
that drifts during the benchmark then weighs on both alike); figures are summed.

    python benchmarks/step_pipeline.py [--steps 3] [--rollouts 8] [--arm B] [--repeats 1]
                                       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = (("generation", "generation_busy_s"), ("tools", "tool_busy_s"),
          ("verification", "verifier_busy_s"))
TIMING_KEYS = {"seconds", "queue_wait_s", "setup_s", "test_s", "apply_s", "cleanup_s",
               "service_s", "wall_s", "gpu_hours", "verify_s", "generation_busy_s",
               "tool_busy_s", "verifier_busy_s", "generation_wait_s", "verifier_idle_s",
               "rollout_setup_s", "endpoint"}


def without_timings(x):
    """``x`` (a record row) without timing fields and the per-run Podman endpoint."""
    if isinstance(x, dict):
        return {k: without_timings(v) for k, v in x.items() if k not in TIMING_KEYS}
    if isinstance(x, list):
        return [without_timings(v) for v in x]
    return x


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def run(pipeline: str, args, runs_dir: Path) -> dict:
    """One training run; returns its ledger rows, step times and record rows."""
    cmd = [sys.executable, "-m", "ecredit_trl.train", "--arm", args.arm,
           "--pipeline", pipeline, "--max_steps", str(args.steps),
           "--per_device_train_batch_size", str(args.rollouts),
           "--num_generations", str(args.num_generations), "--seed", str(args.seed),
           "--verifier_concurrency", str(args.verifier_concurrency),
           "--agent_concurrency", str(args.agent_concurrency),
           "--save_strategy", "no", "--runs_dir", str(runs_dir)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("CONTAINERS_CONF", str(ROOT / "sandbox" / "containers.conf"))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{pipeline} run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    (run_dir,) = list(runs_dir.iterdir())
    metrics = [m for m in _jsonl(run_dir / "metrics.jsonl") if "step_time" in m]
    return {"ledger": _jsonl(run_dir / "ledger.jsonl"),
            "step_time": [m["step_time"] for m in metrics],
            "trajectories": _jsonl(run_dir / "trajectories.jsonl")}


def summary(res: dict) -> dict:
    """Totals over the steps: stage busy seconds, round and step walls, the ratio."""
    led = res["ledger"]
    out = {name: sum(r[key] for r in led) for name, key in STAGES}
    out["round_wall"] = sum(r["wall_s"] for r in led)
    out["step_wall"] = sum(res["step_time"])
    out["generation_wait"] = sum(r["generation_wait_s"] for r in led)
    out["verifier_idle"] = sum(r["verifier_idle_s"] for r in led)
    out["rollout_setup"] = sum(r["rollout_setup_s"] for r in led)
    out["ratio"] = out["round_wall"] / max(out[name] for name, _ in STAGES)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rollouts", type=int, default=8, help="rollouts per step")
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--arm", default="B")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verifier-concurrency", type=int, default=2)
    ap.add_argument("--agent-concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    results: dict = {}
    order = []
    for k in range(args.repeats):
        pair = ["sequential", "overlapped"]
        order += pair if k % 2 == 0 else pair[::-1]
    with tempfile.TemporaryDirectory(prefix="step-pipeline-") as tmp:
        for n, pipeline in enumerate(order):
            print(f"running {pipeline} ...", flush=True)
            res = run(pipeline, args, Path(tmp) / f"{n}-{pipeline}")
            if pipeline in results:  # a repeat: same records expected, timings add up
                prev = results[pipeline]
                res = {k: prev[k] + res[k] for k in ("ledger", "step_time")} | {
                    "trajectories": res["trajectories"]}
            results[pipeline] = res
    sums = {p: summary(r) for p, r in results.items()}
    same = ([without_timings(t) for t in results["sequential"]["trajectories"]]
            == [without_timings(t) for t in results["overlapped"]["trajectories"]]
            and [without_timings(r) for r in results["sequential"]["ledger"]]
            == [without_timings(r) for r in results["overlapped"]["ledger"]])

    print(f"\n{args.steps} steps x {args.rollouts} rollouts x {args.repeats} repeats, arm "
          f"{args.arm}, load average {os.getloadavg()[0]:.1f} at the end, verifier "
          f"concurrency {args.verifier_concurrency}, agent concurrency {args.agent_concurrency}")
    for p, res in results.items():
        print(f"\n{p}: step  generation  tools  verification  round-wall  step-wall  "
              f"wall/max(busy)")
        for r, st in zip(res["ledger"], res["step_time"], strict=True):
            mx = max(r[k] for _, k in STAGES)
            print(f"  {r['step']:>4}  {r['generation_busy_s']:10.2f}  {r['tool_busy_s']:5.2f}  "
                  f"{r['verifier_busy_s']:12.2f}  {r['wall_s']:10.2f}  {st:9.2f}  "
                  f"{r['wall_s'] / mx:14.2f}")
        s = sums[p]
        print(f"   all  {s['generation']:10.2f}  {s['tools']:5.2f}  {s['verification']:12.2f}  "
              f"{s['round_wall']:10.2f}  {s['step_wall']:9.2f}  {s['ratio']:14.2f}   "
              f"(gen waited on tools {s['generation_wait']:.2f} s, verifier idle "
              f"{s['verifier_idle']:.2f} s, env setup {s['rollout_setup']:.2f} s)")
    seq, ov = sums["sequential"], sums["overlapped"]
    print(f"\noverlapped / sequential: step wall {ov['step_wall'] / seq['step_wall']:.2f} "
          f"(target <= 0.70), round wall {ov['round_wall'] / seq['round_wall']:.2f}; "
          f"overlapped round wall / max(stage busy) {ov['ratio']:.2f} (target <= 1.30)")
    print(f"records identical except timings: {'yes' if same else 'NO'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": sums,
                                               "identical": same,
                                               "ledger": {p: r["ledger"] for p, r in
                                                          results.items()},
                                               "step_time": {p: r["step_time"] for p, r in
                                                             results.items()}}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
