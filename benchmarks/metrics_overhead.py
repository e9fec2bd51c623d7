"""Overhead of computing the metrics through the ``evaluate`` modules.

Times, in one process: the first ``load_metric`` (``import evaluate`` + ``evaluate.load`` of
the local folder), then per call (median of ``--repeats``):

* ``per_rollout_success`` on ``--tasks`` × ``--n`` slot rows (default 500 × 16 = 8000)
  against the pure-numpy arithmetic alone (the module's own function, no ``evaluate``);
* ``paired_bootstrap`` of two arms over ``--tasks`` tasks with ``--n-boot`` resamples
  (default 10k) against the same arithmetic alone.

The difference is what ``evaluate`` adds per call (Arrow encoding of the inputs, format,
bookkeeping).

    python benchmarks/metrics_overhead.py [--tasks 500] [--n 16] [--n-boot 10000]
        [--repeats 5] [--json OUT]
"""

from __future__ import annotations

import importlib.util
import json
import random
import statistics
import sys
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Int, OutFile

REPO = Path(__file__).resolve().parent.parent


def _own(name: str):
    """The module file imported directly (its arithmetic without ``evaluate``'s machinery)."""
    path = REPO / "eval" / "metrics" / name / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    """Print the timings (seconds) as JSON; ``--json`` also writes them to a file."""
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=Int(ge=1), default=500)
    ap.add_argument("--n", type=Int(ge=1), default=16)
    ap.add_argument("--n-boot", type=Int(ge=1), default=10000)
    ap.add_argument("--repeats", type=Int(ge=1), default=5)
    ap.add_argument("--json", type=OutFile(), default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from eval.metrics import compute_metric, load_metric

    rng = random.Random(0)
    tasks = [f"task-{i:04d}" for i in range(args.tasks)]
    cols = {"task_id": [], "rollout_index": [], "resolved": [], "unknown": []}
    for t in tasks:
        for i in range(args.n):
            cols["task_id"].append(t)
            cols["rollout_index"].append(i)
            cols["resolved"].append(rng.random() < 0.3)
            cols["unknown"].append(rng.random() < 0.02)
    a = [rng.randrange(args.n + 1) / args.n for _ in tasks]
    b = [rng.randrange(args.n + 1) / args.n for _ in tasks]

    t0 = time.perf_counter()
    load_metric("per_rollout_success")
    first_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_metric("paired_bootstrap")
    second_load = time.perf_counter() - t0

    prs, pbm = _own("per_rollout_success"), _own("paired_bootstrap")
    out = {
        "slots": len(cols["task_id"]), "tasks": args.tasks, "n_boot": args.n_boot,
        "first_load_s (import evaluate + load)": first_load,
        "second_load_s": second_load,
        "per_rollout_success_module_s": _median_s(
            lambda: compute_metric("per_rollout_success", **cols, tasks=tasks, n=args.n),
            args.repeats),
        "per_rollout_success_arithmetic_s": _median_s(
            lambda: prs.per_rollout_success(**cols, tasks=tasks, n=args.n), args.repeats),
        "paired_bootstrap_module_s": _median_s(
            lambda: compute_metric("paired_bootstrap", task_id=tasks, a=a, b=b,
                                   n_boot=args.n_boot), args.repeats),
        "paired_bootstrap_arithmetic_s": _median_s(
            lambda: pbm.paired_bootstrap(tasks, a, b, n_boot=args.n_boot), args.repeats),
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
