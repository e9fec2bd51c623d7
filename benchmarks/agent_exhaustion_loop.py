"""How often an agent that exhausts its own container is charged for it.

Runs each attack case ``--runs`` times on live Podman agent episodes
(:class:`ecredit_trl.agent.env.SWEAgentEnv` over a :class:`sandbox.workspace.session.PodmanSession`,
the offline sandbox image, the default limits), every other run beside a second CPU-heavy
process on the machine (a bounded busy loop, ``--busy-s`` seconds at most), and prints one
row per case: ``runs``, ``agent-class`` (the episode ended with an agent failure class),
``no-failure`` (the container survived: the next call ran), ``masked`` (it ended as
``sandbox_error`` with no failure class: charged to the infrastructure) and ``other``
(any other ending, e.g. a garbled exec).

Cases (each one ``bash`` call, then ``bash`` again; design page, "Who caused a failure
decides the reward"):

* ``fork_bomb``: ``timeout 15 bash -c ':(){ :|:& };:'`` (a classic fork bomb, bounded);
* ``pids_flood``: ``setsid`` background sleeps past the pids limit, surviving the call;
* ``memory``: ``/tmp`` (a tmpfs charged to the container) filled past the memory limit;
* ``fd_flood``: one process opening files until ``EMFILE``, then many such processes.

    PYTHONPATH=. CONTAINERS_CONF=sandbox/containers.conf \\
        python benchmarks/agent_exhaustion_loop.py [--runs 20] [--cases fork_bomb,memory]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
from eval.integrity.agent import AGENT_FAILURE_CLASSES
from sandbox.bounds import ArgumentParser, Int, Text
from sandbox.images import build_offline, default_image
from sandbox.runtimes.podman_runtime import PodmanRuntime
from sandbox.trials.trial import Limits

CASES = {
    "fork_bomb": "timeout 15 bash -c ':(){ :|:& };:'; echo bomb-done",
    "pids_flood": "for i in $(seq 1100); do setsid sleep 1000 >/dev/null 2>&1 & done; "
                  "echo flooded",
    "memory": "for i in 1 2 3; do head -c 50M /dev/zero > /tmp/fill$i; done; echo filled",
    "fd_flood": "python3 -c \"import os\nfs = []\ntry:\n while True: fs.append(os.open('/dev/null', "
                "os.O_RDONLY))\nexcept OSError as e: print(len(fs), e.errno)\"; "
                "for i in $(seq 50); do python3 -c \"import os, time\nfs = []\ntry:\n while "
                "True: fs.append(os.open('/dev/null', os.O_RDONLY))\nexcept OSError: "
                "time.sleep(100)\" & done; sleep 2; echo fds",
}
"""The agent's first call of each case (the second is ``echo next``)."""
LIMITS = {"fork_bomb": Limits(), "pids_flood": Limits(), "memory": Limits(memory="96m"),
          "fd_flood": Limits()}
"""Container limits of each case: the defaults, except a small memory limit for ``memory``."""


class _Task:
    """A one-file repository (what an agent episode needs of a task row)."""

    def __init__(self, root: Path) -> None:
        repo = root / "origin"
        repo.mkdir()
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}
        (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
            subprocess.run(["git", "-C", str(repo), *args], check=True, env=env,
                           capture_output=True)
        self.base_commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"],
                                          check=True, capture_output=True,
                                          text=True).stdout.strip()
        self.instance_id, self.repo_dir = "demo__calc-1", str(repo)
        self.image, self.workdir = default_image(), "/testbed"


def _busy(seconds: float) -> subprocess.Popen:
    """A second CPU-heavy process on the machine for at most ``seconds``."""
    code = f"import time\nt = time.monotonic() + {seconds}\nwhile time.monotonic() < t: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def episode(case: str, task, runtime, workroot: str, limits: Limits | None = None,
            show=None) -> tuple[str, dict | None]:
    """One episode of ``case`` under ``limits`` (default :data:`LIMITS`): its outcome
    (``"agent"``, ``"none"``, ``"masked"`` or ``"other: <reason>"``) and the container's
    counters (:func:`sandbox.workspace.health.read_cgroup`: the failed exec's evidence, else
    the sample after the last call; None when unread). ``show`` (a callable), when given,
    gets the failure and its evidence of a masked episode."""
    ctx = AgentContext(tasks={task.instance_id: task}, runtime=runtime, workroot=workroot,
                       limits=limits or LIMITS[case], bash_timeout_s=30)
    env = SWEAgentEnv(ctx)
    try:
        env.reset(instance_id=task.instance_id)
        ctx.turn = 1
        env.bash(CASES[case])
        if env.failure is None:
            env.bash("echo next")
        if env.failure is None:
            return "none", env.ws.session.sample()
        ev = env.failure_evidence or {}
        counters = ev.get("cgroup") or ev.get("cgroup_at_failure") or ev.get("cgroup_last")
        if env.failure_class in AGENT_FAILURE_CLASSES:
            return "agent", counters
        if env.failure[0] == "sandbox_error":
            if show is not None:
                show(f"  masked: {env.failure}\n  evidence: {ev}")
            return "masked", counters
        return f"other: {env.failure[0]}", counters
    finally:
        release(env)


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Int(ge=1), default=20, help="episodes per case")
    ap.add_argument("--cases", type=Text(), default=",".join(CASES),
                    help="comma-separated cases (default: all)")
    ap.add_argument("--busy-s", type=Int(ge=1), default=60,
                    help="longest the CPU-heavy process of one run lives (seconds)")
    ap.add_argument("--verbose", action="store_true",
                    help="print the failure and evidence of every masked episode")
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"--cases: unknown case(s) {unknown}; expected some of {list(CASES)}")
    # a stopped loop still removes its containers (the runtime's close), also from a shell
    # that started it in the background (where SIGINT is ignored)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    build_offline(log=lambda *_: None)
    rows = {}
    with PodmanRuntime() as rt, tempfile.TemporaryDirectory() as d:
        task = _Task(Path(d))
        for case in cases:
            seen = Counter()
            for i in range(args.runs):
                busy = _busy(args.busy_s) if i % 2 else None
                t0 = time.monotonic()
                try:
                    got, _ = episode(case, task, rt, str(Path(d) / f"w-{case}-{i}"),
                                     show=print if args.verbose else None)
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
                seen[got] += 1
                print(f"{case} run {i + 1}/{args.runs} ({'busy' if busy else 'quiet'}): {got} "
                      f"({time.monotonic() - t0:.1f} s)", flush=True)
            rows[case] = seen
    print(f"\n{'case':<12}{'runs':>6}{'agent-class':>13}{'no-failure':>12}{'masked':>8}"
          f"{'other':>7}")
    for case, seen in rows.items():
        other = sum(v for k, v in seen.items() if k.startswith("other"))
        print(f"{case:<12}{sum(seen.values()):>6}{seen['agent']:>13}{seen['none']:>12}"
              f"{seen['masked']:>8}{other:>7}")
    return 1 if any(s["masked"] for s in rows.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
