"""Rollout setup + first snapshot on an image-held task with a big tree.

Builds (once; kept with ``--keep-image``) a task image from the offline sandbox image whose
``/testbed`` is a git repository of ``--files`` files totalling ``--mb`` MB: 96% tracked
(two commits), 3% ignored build outputs (``build/``, as compiled extensions are), 1%
untracked and not ignored. Then, on the real :class:`ecredit_trl.agent.env.SWEAgentEnv`
with a Podman runtime:

* the per-image base cache (:func:`sandbox.workspace.imagetree.base_cache`, once per image);
* per rollout (``--rollouts``, median): ``reset`` (tree container + ``podman mount``,
  snapshotter seeded from the cached index, the agent's container started) + the first
  snapshot (disk check + ``Snapshotter.snapshot``), and the same with one ``bash`` call
  (``true``) before the snapshot, as a real first turn;
* a plain ``cp -a`` of the same tree (from the image, page cache warm; best of two).

Targets: setup + first snapshot ≤ 2 s and ≤ 10% of ``cp -a``.

    PYTHONPATH=. CONTAINERS_CONF=sandbox/containers.conf \\
        python benchmarks/rollout_setup.py [--files 50000] [--mb 1024] [--rollouts 5]
"""

from __future__ import annotations

import hashlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Int, OutDir
from sandbox.runtimes.podman_runtime import podman_env

IMAGE_REPO = "localhost/ecredit-bench-rollout"


def _git(repo: Path, *args: str) -> None:
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@e", GIT_COMMITTER_NAME="b",
               GIT_COMMITTER_EMAIL="b@e", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    subprocess.run(["git", "-C", str(repo), "-c", "gc.auto=0", *args], check=True, env=env,
                   capture_output=True)


def make_tree(root: Path, n_files: int, total_mb: int) -> None:
    """A repository of ``n_files`` files, ``total_mb`` MB in all (see module doc)."""
    size = total_mb * 2**20 // n_files
    n_ignored, n_untracked = n_files * 3 // 100, n_files // 100
    n_tracked = n_files - n_ignored - n_untracked
    root.mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text("build/\n")
    filler = (b"# generated line of a synthetic module, padding to the file size\n" *
              (size // 66 + 1))
    for i in range(n_files):
        if i < n_tracked:
            d = root / f"pkg{i // 100:04d}"
            name = f"mod{i:05d}.py"
        elif i < n_tracked + n_ignored:
            d, name = root / "build" / f"b{i // 100:04d}", f"ext{i:05d}.so"
        else:
            d, name = root / "extra", f"note{i:05d}.txt"
        d.mkdir(parents=True, exist_ok=True)
        head = f"VALUE = {i}\n".encode()
        (d / name).write_bytes(head + filler[:size - len(head)])
    _git(root, "add", "-A")
    _git(root, "reset", "-q", "--", "extra")
    _git(root, "commit", "-qm", "one")
    (root / "pkg0000" / "mod00000.py").write_text("VALUE = -1\n")
    _git(root, "commit", "-qam", "two")


def build_image(n_files: int, total_mb: int, log) -> str:
    """The benchmark's task image (built when absent); returns its name."""
    from sandbox.images import default_image

    tag = hashlib.sha256(f"{default_image()} {n_files} {total_mb} v1".encode()).hexdigest()[:12]
    name = f"{IMAGE_REPO}:{tag}"
    env = podman_env()
    if subprocess.run(["podman", "image", "exists", name], env=env).returncode == 0:
        return name
    with tempfile.TemporaryDirectory(prefix="ecredit-bench-img-", dir="/var/tmp") as tmp:
        t0 = time.perf_counter()
        make_tree(Path(tmp) / "testbed", n_files, total_mb)
        log(f"generated {n_files} files / {total_mb} MB in {time.perf_counter() - t0:.1f} s")
        (Path(tmp) / "Containerfile").write_text(
            f"FROM {default_image()}\nCOPY testbed /testbed\nWORKDIR /testbed\n")
        t0 = time.perf_counter()
        subprocess.run(["podman", "build", "-q", "--pull=never", "-t", name, tmp], check=True,
                       env=env, capture_output=True)
        log(f"built {name} in {time.perf_counter() - t0:.1f} s")
    return name


def time_cp(image: str, runs: int = 2) -> float:
    """Best of ``runs`` plain ``cp -a`` of the image's /testbed (seconds)."""
    env = podman_env()
    root = subprocess.run(["podman", "image", "mount", image], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()
    best = float("inf")
    try:
        for _ in range(runs):
            tmp = tempfile.mkdtemp(prefix="ecredit-bench-cp-", dir="/var/tmp")
            try:
                t0 = time.perf_counter()
                subprocess.run(["cp", "-a", f"{root}/testbed", f"{tmp}/t"], check=True)
                best = min(best, time.perf_counter() - t0)
            finally:
                subprocess.run(["rm", "-rf", tmp], check=False)
    finally:
        subprocess.run(["podman", "image", "umount", image], env=env, capture_output=True)
    return best


def bench(image: str, rollouts: int, log, cache_dir: str | None = None) -> dict:
    from types import SimpleNamespace

    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
    from sandbox.runtimes.podman_runtime import PodmanRuntime

    task = SimpleNamespace(instance_id="bench__big-1", repo_dir=None, base_commit="",
                           image=image, workdir="/testbed", checkout_base=False)
    out: dict = {"setup_s": [], "snapshot_s": [], "with_bash_s": []}
    with PodmanRuntime() as rt, tempfile.TemporaryDirectory(prefix="ecredit-bench-") as wr:
        ctx = AgentContext(tasks={task.instance_id: task}, runtime=rt, workroot=wr)
        t0 = time.perf_counter()
        from sandbox.workspace.imagetree import base_cache

        ctx._image_bases[(image, "/testbed")] = base_cache(
            image, "/testbed", Path(cache_dir or Path(wr) / ".images"))
        out["cache_s"] = time.perf_counter() - t0
        log(f"base cache (once per image): {out['cache_s']:.1f} s")
        for i in range(rollouts):
            env = SWEAgentEnv(ctx)
            t0 = time.perf_counter()
            env.reset(instance_id=task.instance_id)
            t1 = time.perf_counter()
            tree = env._snapshot_after()
            t2 = time.perf_counter()
            assert env.failure is None and tree == env.base_tree, (env.failure, tree)
            out["setup_s"].append(t1 - t0)
            out["snapshot_s"].append(t2 - t1)
            t3 = time.perf_counter()
            env.bash("true")
            out["with_bash_s"].append(t1 - t0 + time.perf_counter() - t3)
            release(env)
            log(f"rollout {i}: reset {t1 - t0:.3f} s, first snapshot {t2 - t1:.3f} s, "
                f"first bash call + snapshot {time.perf_counter() - t3:.3f} s")
        ctx.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=Int(ge=1), default=50000)
    ap.add_argument("--mb", type=Int(ge=1), default=1024)
    ap.add_argument("--rollouts", type=Int(ge=1), default=5)
    ap.add_argument("--cache-dir", type=OutDir(), default=None,
                    help="keep the per-image base cache here for the next run (default: a "
                         "temp dir, so the cache is built and timed)")
    ap.add_argument("--keep-image", action="store_true",
                    help="keep the benchmark image for the next run (else removed)")
    args = ap.parse_args(argv)
    image = build_image(args.files, args.mb, print)
    try:
        res = bench(image, args.rollouts, print, args.cache_dir)
        cp = time_cp(image)
    finally:
        if not args.keep_image:
            subprocess.run(["podman", "rmi", "-f", image], env=podman_env(), capture_output=True)
    setup = statistics.median(a + b for a, b in zip(res["setup_s"], res["snapshot_s"], strict=True))
    first_turn = statistics.median(res["with_bash_s"])
    print(f"tree: {args.files} files, {args.mb} MB")
    print(f"plain cp -a of the tree:               {cp:.2f} s")
    print(f"rollout setup + first snapshot (median of {args.rollouts}): {setup:.3f} s "
          f"= {100 * setup / cp:.1f}% of cp -a  (reset {statistics.median(res['setup_s']):.3f}"
          f" s, snapshot {statistics.median(res['snapshot_s']):.3f} s)")
    print(f"  reset + a first bash call (with its snapshot): {first_turn:.3f} s")
    ok = setup <= 2.0 and setup <= 0.10 * cp
    print(f"target (<= 2 s and <= 10% of cp -a): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
