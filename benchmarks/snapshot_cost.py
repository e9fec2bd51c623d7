"""Per-turn snapshot cost on synthetic repositories of 1k, 5k and 20k files.

Each turn changes 3 files, then takes a snapshot (private index, ``git add -A`` +
``git write-tree``). Reports the first snapshot of a rollout (seeded from the
repo's own index: must not re-hash the tree), the steady-state median and p90,
and, for contrast, a snapshot from a cold index (read-tree, full re-hash).

Targets: steady state ≤ 20 ms at 5k files and ≤ 80 ms at 20k.

    python benchmarks/snapshot_cost.py [--sizes 1000 5000 20000] [--turns 15]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Int
from sandbox.snapshots.snapshot import Snapshotter

TARGET_MS = {5000: 20.0, 20000: 80.0}


def make_repo(root: Path, n_files: int) -> None:
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@e",
               GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@e",
               GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="gc.auto", GIT_CONFIG_VALUE_0="0")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    per_dir = 100
    for i in range(n_files):
        d = root / f"pkg{i // per_dir:04d}"
        d.mkdir(exist_ok=True)
        (d / f"mod{i:05d}.py").write_text(f"# module {i}\nVALUE = {i}\n" + "x = 1\n" * 20)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "commit", "-qm", "base"], check=True, env=env)
    time.sleep(1.1)  # leave the racy-git window, as a checkout followed by a model turn does


def bench(n_files: int, turns: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        make_repo(root, n_files)
        files = sorted(root.glob("pkg*/mod*.py"))
        snap = Snapshotter(root)
        t0 = time.perf_counter()
        snap.snapshot()
        first = (time.perf_counter() - t0) * 1e3
        times = []
        for t in range(turns):
            for j in range(3):
                f = files[(t * 7 + j * 131) % len(files)]
                f.write_text(f.read_text() + f"# turn {t}\n")
            t0 = time.perf_counter()
            snap.snapshot()
            times.append((time.perf_counter() - t0) * 1e3)
        snap.close()
        # cold index: what a naive implementation pays on every rollout start
        cold = Snapshotter(root, base="HEAD")
        cold.index_file.unlink()
        subprocess.run(["git", "-C", str(root), "read-tree", "HEAD"], check=True,
                       env=dict(os.environ, GIT_INDEX_FILE=str(cold.index_file)))
        t0 = time.perf_counter()
        cold.snapshot()
        cold_ms = (time.perf_counter() - t0) * 1e3
        cold.close()
    times.sort()
    return {"files": n_files, "first_ms": first, "median_ms": statistics.median(times),
            "p90_ms": times[int(0.9 * (len(times) - 1))], "cold_ms": cold_ms}


def main() -> None:
    ap = ArgumentParser()
    ap.add_argument("--sizes", type=Int(ge=1), nargs="+", default=[1000, 5000, 20000])
    ap.add_argument("--turns", type=Int(ge=1), default=15)
    args = ap.parse_args()
    print(f"{'files':>7} {'first ms':>9} {'median ms':>10} {'p90 ms':>8} {'cold-index ms':>14} "
          f"{'target ms':>10} {'ok':>4}")
    for n in args.sizes:
        r = bench(n, args.turns)
        target = TARGET_MS.get(n)
        ok = "-" if target is None else ("yes" if r["median_ms"] <= target else "NO")
        print(f"{r['files']:>7} {r['first_ms']:>9.1f} {r['median_ms']:>10.1f} {r['p90_ms']:>8.1f} "
              f"{r['cold_ms']:>14.1f} {target or '-':>10} {ok:>4}")


if __name__ == "__main__":
    main()
