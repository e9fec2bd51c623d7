"""Every exhaustion a policy can cause in its own container is charged to it, whatever the timing
(design page, "Who caused a failure decides the reward").

Live Podman agent episodes (:class:`ecredit_trl.agent.env.SWEAgentEnv`) of the cases of
``benchmarks/agent_exhaustion_loop.py`` (which runs them 20 times each beside a CPU-heavy
process): a bounded shell fork bomb (twice: its processes outlive the call and are reaped at
their own pace), a ``setsid`` sleep flood past the pids limit, ``/tmp`` filled past the
memory limit, an fd flood. Each episode ends with the agent's failure class or with no
failure (the container survived); never as ``sandbox_error`` charged to the infrastructure.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from sandbox.trials.trial import Limits

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"fork_bomb": Limits(pids=256), "pids_flood": Limits(pids=64),
         "memory": Limits(memory="96m"), "fd_flood": Limits(pids=256)}
"""Smaller limits than the benchmark's, so each case is over in seconds."""


@pytest.fixture(scope="module")
def loop():
    spec = importlib.util.spec_from_file_location(
        "agent_exhaustion_loop", ROOT / "benchmarks" / "agent_exhaustion_loop.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["agent_exhaustion_loop"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.podman
@pytest.mark.parametrize("case, runs", [("fork_bomb", 2), ("pids_flood", 1), ("memory", 1),
                                        ("fd_flood", 1)])
def test_exhaustion_is_the_agents_or_no_failure(loop, case, runs, calc_task, tmp_path,
                                                podman_runtime):
    """The episode's class is the agent's or there is no failure; the limit the case aims
    at was hit (its counter grew), so a pass is not a container the attack missed."""
    for i in range(runs):
        got, counters = loop.episode(case, calc_task, podman_runtime, str(tmp_path / f"w{i}"),
                                     limits=SMALL[case])
        assert got in ("agent", "none"), (case, got)
        if case in ("fork_bomb", "pids_flood"):
            assert got == "agent" or (counters or {}).get("pids_max_events"), (got, counters)
        if case == "memory":
            assert got == "agent", counters
        if case == "fd_flood":
            assert got == "none", counters  # a per-process limit: the next exec starts
