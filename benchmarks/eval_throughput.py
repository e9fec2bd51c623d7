"""Evaluation throughput: one rollout at a time vs batched.

Runs the same seeded evaluation twice with ``eval.run.evaluate`` (embedded policy, the first
``--tasks`` tasks of ``bundled:train``, ``--n`` rollouts each, Podman verifier trials at
``--concurrency``): once with ``batch_size=1`` (the one-at-a-time loop) and once with
``--batch-size`` episodes in flight. Prints per mode:

* slots per minute = graded slots / the evaluation's wall seconds (model load, generation,
  trials and report included), and the ratio batched / one-at-a-time;
* generation seconds = the summed ``timings.generate_s`` of the rollout rows (a batched call's
  wall seconds are split over its rows, so the sum is the wall time spent generating);
* tool seconds (summed ``timings.tools_s``; concurrent in the batched mode) and verifier
  seconds (summed trial service seconds, ``results.json`` ``cost.service_s``);
* whether every slot's artifact sha256 and verdict agree between the two modes (they must
  for a seeded run: greedy by default, ``--temperature`` to sample).

Then the generation side alone (no verifier trials): ``run_rollouts`` in this process, agents
in Podman containers, same slots, one at a time vs batched: rollouts per minute and the ratio
(``--rollouts-only`` runs just this part).

    python benchmarks/eval_throughput.py [--tasks 10] [--n 2] [--batch-size 8]
        [--agent-concurrency 4] [--concurrency 2] [--temperature 0] [--rollouts-only]
        [--json OUT]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Float, Int, OutFile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "sandbox" / "containers.conf"))


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def run_mode(model: str, split: Path, out: Path, args, batch_size: int) -> dict:
    """One evaluation; returns its figures (seconds, slots/minute) and per-slot outcomes."""
    from eval.evaluation.options import EvalOptions
    from eval.run import evaluate
    from sandbox.backend import SandboxOptions

    t0 = time.monotonic()
    opts = EvalOptions(model=model, split=str(split), n=args.n, out=out,
                       concurrency=args.concurrency, seed=args.seed,
                       temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                       batch_size=batch_size, agent_concurrency=args.agent_concurrency)
    res = evaluate(opts, runtime=SandboxOptions(), log=lambda *_: None)
    wall = time.monotonic() - t0
    rollouts = _rows(out / "rollouts.jsonl")
    slots = res["summary"]["denominator"]["slots"]
    return {
        "batch_size": batch_size, "slots": slots, "wall_s": round(wall, 2),
        "slots_per_min": round(slots / wall * 60, 2),
        "generate_s": round(sum(r["timings"]["generate_s"] for r in rollouts), 2),
        "tools_s": round(sum(r["timings"]["tools_s"] for r in rollouts), 2),
        "verifier_s": round(res["cost"]["service_s"], 2),
        "success": res["summary"]["success"],
        "outcomes": {f"{r['task_id']}#{r['rollout_index']}":
                     [r.get("artifact_sha256"), r.get("resolved")] for r in res["slots"]},
    }


def rollouts_only(model: str, tasks: list, args) -> dict:
    """``run_rollouts`` one at a time and batched on the same slots (Podman agents); returns
    wall seconds and rollouts per minute of each, and whether the rows agree."""
    from ecredit_trl.agent.generation import GenerationSettings, load_rollout_policy
    from ecredit_trl.agent.rollouts import run_rollouts
    from sandbox.backend import make_runtime
    policy = load_rollout_policy(model, device="cpu")
    settings = GenerationSettings(temperature=args.temperature,
                                  max_new_tokens=args.max_new_tokens)
    work = Path(tempfile.mkdtemp(prefix="rollouts-throughput-"))
    out = {}
    rt = make_runtime(run_id=f"bench-{os.getpid()}")
    try:
        for name, b in (("one", 1), ("batched", args.batch_size)):
            s = run_rollouts(policy, tasks, work / f"{name}.jsonl", n=args.n, seed=args.seed,
                             settings=settings, runtime=rt, batch_size=b,
                             agent_concurrency=args.agent_concurrency, log=lambda *_: None)
            rows = {(r["task_id"], r["rollout_index"]): r["artifact_sha256"]
                    for r in _rows(work / f"{name}.jsonl")}
            out[name] = {"wall_s": s["wall_s"], "generate_s": s["generate_s"],
                         "per_min": round(s["written"] / s["wall_s"] * 60, 2), "rows": rows}
    finally:
        rt.close()
    out["same"] = out["one"].pop("rows") == out["batched"].pop("rows")
    return out


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=Int(ge=1), default=10, help="first K tasks of bundled:train")
    ap.add_argument("--n", type=Int(ge=1), default=2)
    ap.add_argument("--batch-size", type=Int(ge=1), default=8)
    ap.add_argument("--agent-concurrency", type=Int(ge=1), default=4)
    ap.add_argument("--concurrency", type=Int(ge=1), default=2, help="verifier trials at once")
    ap.add_argument("--temperature", type=Float(ge=0, why="0 = greedy decoding"), default=0.0)
    ap.add_argument("--max-new-tokens", type=Int(ge=1), default=640)
    ap.add_argument("--seed", type=Int(ge=0, le=2**32 - 1, why="32-bit seeds"), default=0)
    ap.add_argument("--rollouts-only", action="store_true", help="only the generation side")
    ap.add_argument("--json", type=OutFile(), default=None, help="write the figures here")
    args = ap.parse_args()

    from ecredit_trl.policy.warmstart import ensure_default_policy
    from eval.tasks.schema import save_tasks
    from eval.tasks.splits import load_tasks

    model = ensure_default_policy(load_tasks("bundled:train", purpose="train"))
    tasks = load_tasks("bundled:train", purpose="eval")[: args.tasks]
    if args.rollouts_only:
        _print_rollouts(rollouts_only(model, tasks, args), args)
        return
    work = Path(tempfile.mkdtemp(prefix="eval-throughput-"))
    split = work / "split.jsonl"
    save_tasks(tasks, split)
    one = run_mode(model, split, work / "one", args, 1)
    bat = run_mode(model, split, work / "batched", args, args.batch_size)
    same = one["outcomes"] == bat["outcomes"]
    print(f"eval throughput: {args.tasks} bundled:train tasks x n={args.n}, temperature "
          f"{args.temperature}, verifier concurrency {args.concurrency}, "
          f"agent concurrency {args.agent_concurrency}")
    print(f"{'mode':>14} {'slots':>5} {'wall s':>7} {'slots/min':>9} {'generate s':>10} "
          f"{'tools s':>7} {'verifier s':>10} {'success':>7}")
    for name, m in (("one-at-a-time", one), (f"batched ({args.batch_size})", bat)):
        print(f"{name:>14} {m['slots']:>5} {m['wall_s']:>7.1f} {m['slots_per_min']:>9.1f} "
              f"{m['generate_s']:>10.1f} {m['tools_s']:>7.1f} {m['verifier_s']:>10.1f} "
              f"{m['success']:>7.3f}")
    ratio = bat["slots_per_min"] / one["slots_per_min"]
    print(f"batched / one-at-a-time slots per minute: {ratio:.2f}x; "
          f"same artifacts and verdicts per slot: {'yes' if same else 'NO'}")
    gen = rollouts_only(model, tasks, args)
    _print_rollouts(gen, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"one": one, "batched": bat, "ratio": ratio,
                                               "same_outcomes": same, "rollouts": gen},
                                              indent=1))


def _print_rollouts(gen: dict, args) -> None:
    one, bat = gen["one"], gen["batched"]
    print(f"rollouts only ({args.tasks} tasks x n={args.n}, Podman agents, no trials): "
          f"one-at-a-time {one['wall_s']:.1f} s = {one['per_min']:.1f}/min "
          f"(generate {one['generate_s']:.1f} s), batched ({args.batch_size}) "
          f"{bat['wall_s']:.1f} s = {bat['per_min']:.1f}/min (generate {bat['generate_s']:.1f} s)"
          f": {bat['per_min'] / one['per_min']:.2f}x; same artifacts: "
          f"{'yes' if gen['same'] else 'NO'}")


if __name__ == "__main__":
    main()
