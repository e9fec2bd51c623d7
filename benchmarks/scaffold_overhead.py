"""Per-action overhead of the mini-swe-agent adapter against the built-in ``bash`` tool.

The same scripted episode (ten bash commands: listing, reading, two edits, git status, a test
run, the stop command) runs on the first bundled training task in a real Podman container
three ways, interleaved round by round (``--rounds``, medians per action):

* **exec**: the sandbox's own exec (``RolloutWorkspace.run``: ``podman exec`` of the command);
* **built-in**: :class:`ecredit_trl.agent.env.SWEAgentEnv` ``.bash`` (exec + record + the
  snapshot after the call);
* **mini-swe-agent**: :class:`ecredit_trl.agent.scaffolds.mini_swe_agent.MiniSweAgentEnv`
  ``.bash`` (the adapter's parse, the config's interpreter and environment around the
  command, the exit-status marker, the observation template, the stop rule; exec + record +
  snapshot as above).

Reported: median ms per action of each, and the adapter's overhead per action above the
built-in tool (same exec, same snapshot). Target: ≤ 5 ms a turn above the sandbox's own exec
plus the snapshot the built-in tool also pays.

    PYTHONPATH=. python benchmarks/scaffold_overhead.py [--rounds 5]
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
from ecredit_trl.agent.scaffolds import get_scaffold
from ecredit_trl.agent.scaffolds.mini_swe_agent import MiniSweAgentEnv
from eval.tasks.splits import load_tasks
from sandbox.bounds import ArgumentParser, Int
from sandbox.images import build_offline
from sandbox.runtimes.podman_runtime import PodmanRuntime

os.environ.setdefault("CONTAINERS_CONF", str(Path(__file__).resolve().parents[1] / "sandbox"
                                              / "containers.conf"))
MODULE = "inflection/__init__.py"
COMMANDS = [
    "ls", f"grep -n 'if not word' {MODULE}", f"nl -ba {MODULE} | sed -n '295,305p'",
    f"sed -i 's/if not word and word.lower/if not word or word.lower/' {MODULE}",
    "git status --short", f"python3 -c \"import ast; ast.parse(open('{MODULE}').read())\"",
    f"sed -i 's/if not word or word.lower/if not word and word.lower/' {MODULE}",
    "git diff --stat", "echo checking", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff",
]


def _episode(env, task, kind: str) -> list[float]:
    """Seconds per action of one episode of ``kind`` (exec / built-in / mini-swe-agent)."""
    env.reset(instance_id=task.instance_id)
    out = []
    try:
        for cmd in COMMANDS:
            t0 = time.perf_counter()
            if kind == "exec":
                env.ws.run(cmd, timeout_s=30, max_output_chars=2000)
            else:
                env.bash(cmd)
            out.append(time.perf_counter() - t0)
    finally:
        release(env)
    return out


def main() -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=Int(ge=1), default=5, help="episodes of each kind, interleaved")
    args = ap.parse_args()
    build_offline(log=lambda *_: None)
    task = load_tasks("bundled:train", purpose="train")[0]
    sc = get_scaffold("mini-swe-agent")
    times = {"exec": [], "built-in": [], "mini-swe-agent": []}
    with PodmanRuntime() as rt, tempfile.TemporaryDirectory(prefix="ecredit-bench-") as wr:
        ctx = AgentContext(tasks={task.instance_id: task}, runtime=rt, scaffold=sc, workroot=wr)
        envs = {"exec": SWEAgentEnv(ctx), "built-in": SWEAgentEnv(ctx),
                "mini-swe-agent": MiniSweAgentEnv(ctx)}
        for _ in range(args.rounds):
            for kind, env in envs.items():
                times[kind] += _episode(env, task, kind)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{len(COMMANDS)} actions x {args.rounds} rounds, medians (ms per action)")
    print("| tool surface | per action | above exec |")
    print("|---|---|---|")
    for k in times:
        print(f"| {k} | {med[k]:.1f} ms | {med[k] - med['exec']:+.1f} ms |")
    print(f"adapter overhead above the built-in tool: {med['mini-swe-agent'] - med['built-in']:+.1f}"
          " ms per action")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
