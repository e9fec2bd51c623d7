"""Agent sandboxes on Ray: bytes and latency each tool call adds, against the local backend.

    python benchmarks/ray_sandbox.py [--n 20] [--reps 3]

Re-executes itself inside a loopback-only network namespace (``unshare -n``, root), starts
a local Ray cluster there (a head node without the sandbox resource, one sandbox node) and
runs the same rollout of a small repository task through ``SWEAgentEnv`` twice: workspace
on this host (local Podman) and on the sandbox node (:mod:`sandbox.cluster.workspace_host`). Prints,
median over ``--reps`` interleaved episodes × ``--n`` calls of each tool (each call = the tool + the snapshot after it):

1. seconds per call, local and Ray, and the difference (what Ray adds per tool call);
2. bytes that cross per call (pickled arguments + results of the actor calls; Ray's own
   framing is not counted);
3. the workspace's setup (reset) and, at the episode's end, the one pack of snapshot
   objects that crosses back (bytes, seconds).

Both "nodes" are processes on this one machine sharing its CPUs and its one Podman, so the
figures are the cost of the indirection (serialisation, one actor round trip per call and
per snapshot, loopback gRPC), not of a network between machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox.bounds import ArgumentParser, Int

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CALC = "def add(a, b):\n    return a - b\n"


def _task(root: Path):
    """A small repository task: one module and 40 filler files (a tree worth snapshotting)."""
    from types import SimpleNamespace

    from sandbox.images import default_image

    repo = root / "origin"
    (repo / "pkg").mkdir(parents=True)
    (repo / "calc.py").write_text(CALC)
    for i in range(40):
        (repo / "pkg" / f"m{i}.py").write_text(f"VALUE_{i} = {i}\n" * 20)
    git = ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    return SimpleNamespace(instance_id="bench__calc-1", repo_dir=str(repo), base_commit=head,
                           image=default_image(), workdir="/testbed", checkout_base=False)


def episode(runtime, task, workroot: Path, n: int) -> dict:
    """``n`` calls each of bash / view / str_replace (+ snapshots); seconds per call, setup,
    the artifact's fetch, and the proxy's byte counters (Ray only)."""
    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release, release_sandbox
    from sandbox.snapshots.snapshot import artifact

    ctx = AgentContext(tasks={task.instance_id: task}, runtime=runtime, workroot=str(workroot))
    env = SWEAgentEnv(ctx)
    t0 = time.perf_counter()
    env.reset(instance_id=task.instance_id)
    out = {"setup_s": time.perf_counter() - t0, "bash": [], "view": [], "str_replace": []}
    ctx.turn = 1
    env.bash("true")  # warm: first exec, first snapshot
    for i in range(n):
        ctx.turn = i + 2
        old = "a - b" if i == 0 else f"a - b + {i - 1}"
        for name, call in (("bash", lambda: env.bash("echo hi")),
                           ("view", lambda: env.view("calc.py")),
                           ("str_replace", lambda old=old, i=i: env.str_replace(
                               "calc.py", old, f"a - b + {i}"))):
            t = time.perf_counter()
            call()
            out[name].append(time.perf_counter() - t)
    env.submit()
    release_sandbox(env)
    assert env.failure is None and all(c.ok for c in env.calls), env.failure
    t = time.perf_counter()
    patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
    out["fetch_s"] = time.perf_counter() - t
    out["artifact_bytes"] = len(patch)
    out["stats"] = dict(getattr(env.ws, "stats", {}))
    out["calls"] = len(env.calls)
    release(env)
    ctx.close()
    return out


def inside(args) -> None:
    from ray.cluster_utils import Cluster

    from sandbox.cluster.dispatch import RayOptions
    from sandbox.cluster.trials import RayRoutedRuntime
    from sandbox.runtimes.podman_runtime import PodmanRuntime

    root = Path(tempfile.mkdtemp(prefix="ecredit-bench-"))
    task = _task(root)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    local_rt = PodmanRuntime(run_id=f"bench-local-{os.getpid()}")
    runs: dict[str, list[dict]] = {"local": [], "ray": []}
    try:
        cluster.add_node(num_cpus=1, resources={"ecredit_sandbox": 4})
        cluster.wait_for_nodes()
        rr = RayRoutedRuntime(run_id=f"bench-ray-{os.getpid()}",
                              options=RayOptions(address=cluster.address, max_in_flight=4))
        try:
            rts = {"local": local_rt, "ray": rr}
            for name, rt in rts.items():  # warm: services, the host actor, the base store
                episode(rt, task, root / f"warm-{name}", 2)
            for rep in range(args.reps):  # interleaved, so drift in the load hits both
                for name, rt in rts.items():
                    runs[name].append(episode(rt, task, root / f"{name}{rep}", args.n))
        finally:
            rr.close()
    finally:
        local_rt.close()
        cluster.shutdown()
    local = {k: sum((r[k] for r in runs["local"]), []) for k in ("bash", "view", "str_replace")}
    ray_ = {k: sum((r[k] for r in runs["ray"]), []) for k in ("bash", "view", "str_replace")}
    for k in ("setup_s", "fetch_s", "artifact_bytes", "calls", "stats"):
        local[k], ray_[k] = runs["local"][-1][k], runs["ray"][-1][k]
    med = statistics.median
    print(f"# Agent sandbox on Ray vs local: {args.reps} x {args.n} calls of each tool, "
          "median (tool + snapshot)\n")
    print("| tool call | local | ray | added by ray |")
    print("|---|---|---|---|")
    for name in ("bash", "view", "str_replace"):
        a, b = med(local[name]), med(ray_[name])
        print(f"| {name} | {a * 1e3:.1f} ms | {b * 1e3:.1f} ms | {(b - a) * 1e3:+.1f} ms |")
    st = ray_["stats"]
    actor_calls = st["calls"]
    print(f"\nactor calls: {actor_calls} for {ray_['calls']} tool calls (the tool, then its "
          f"snapshot), {st['call_s'] / actor_calls * 1e3:.1f} ms each on average "
          "(the work on the node included)")
    print(f"bytes per actor call (pickled payloads): sent {st['sent_bytes'] / actor_calls:.0f}, "
          f"received {st['received_bytes'] / actor_calls:.0f}; per tool call "
          f"{(st['sent_bytes'] + st['received_bytes']) / ray_['calls']:.0f} in all")
    print(f"setup (reset): local {local['setup_s']:.2f} s, ray {ray_['setup_s']:.2f} s "
          "(warm host actor)")
    print(f"end of episode: one pack of {st['pack_bytes']} bytes back (the objects new since "
          f"S_0; S_0 comes from the trainer's copy of the task repository), fetched and "
          f"unpacked in {ray_['fetch_s'] * 1e3:.0f} ms vs {local['fetch_s'] * 1e3:.0f} ms "
          f"locally (artifact {ray_['artifact_bytes']} bytes)")
    print("\n(2 CPU cores shared with other work; head + sandbox node + trainer on one host.)")


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=Int(ge=1), default=20, help="calls of each tool per backend")
    ap.add_argument("--reps", type=Int(ge=1), default=3, help="interleaved episodes per backend")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        inside(args)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ray_dispatch import run_in_loopback_namespace  # the sibling benchmark's launcher

    sys.exit(run_in_loopback_namespace(Path(__file__),
                                       ["--n", str(args.n), "--reps", str(args.reps)]))


if __name__ == "__main__":
    main()
