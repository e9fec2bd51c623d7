"""Who broke the agent's container decides the reward (design page, "Who caused a failure decides the reward").

Live Podman agent sessions attacked as a policy would: a fork flood of background sleeps up
to the container's pids limit, memory filled to the container's limit, a tree past the disk
budget. Each ends the episode as the policy's failure (``agent_pids`` / ``agent_oom`` /
``agent_disk_budget``) with its evidence and the failure value, not excluded. The same
failed exec caused from outside (the container removed or killed by someone else, the
service gone) stays an infra failure: excluded with its reason, reward None. The agent
cannot stop its own container by signalling its init (a uid of its own).
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
from ecredit_trl.agent.failures import apply_episode_failure
from ecredit_trl.runs.rollout_record import RolloutRecord
from eval.integrity.agent import agent_failure_verdict, classify_exec_failure
from eval.integrity.failure_value import failure_utility
from sandbox.runtimes.podman_runtime import podman_env
from sandbox.trials.trial import Limits

# a fork flood of background sleeps from a process in its own session (out of reach of the
# call's group kill) that takes every pid freed, so the limit stays full once the call
# returns (5,000 `sleep &` from bash fill it too, but the pids its own exit frees can let
# the next exec start: a race, not a test)
FLOOD = ("python3 -c \"import os, time\nos.setsid()\nn = 0\nwhile n < 5000:\n try:\n"
         "  if os.fork() == 0:\n   os.execvp('sleep', ['sleep', '1000'])\n  n += 1\n"
         " except OSError:\n  time.sleep(0.001)\" >/dev/null 2>&1 &\n"
         "g=/sys/fs/cgroup/pids; read max < $g/pids.max; read cur < $g/pids.current\n"
         "while [ $cur -lt $max ]; do read cur < $g/pids.current; done; echo full $cur")


def _env(task, tmp_path, runtime, **kw) -> SWEAgentEnv:
    ctx = AgentContext(tasks={task.instance_id: task}, runtime=runtime,
                       workroot=str(tmp_path / "work"), **kw)
    env = SWEAgentEnv(ctx)
    env.reset(instance_id=task.instance_id)
    ctx.turn = 1
    return env


def _record(env, task, terminal_reward="utility"):
    rec = RolloutRecord(task_id=task.instance_id, rollout_index=0, format_error=False,
                        num_turns=1, snapshots=[])
    cfg = SimpleNamespace(terminal_reward=terminal_reward, mask_truncated_completions=False)
    return apply_episode_failure(rec, env, task, cfg, False)


def _task(calc_task, p2p=("test_calc.py::test_sub",)):
    fields = {**vars(calc_task), "FAIL_TO_PASS": ["test_calc.py::test_add"],
              "PASS_TO_PASS": list(p2p)}
    return SimpleNamespace(**fields)


@pytest.fixture
def task(calc_task):
    return _task(calc_task)


def _podman(*args: str) -> None:
    subprocess.run(["podman", *args], check=True, capture_output=True, env=podman_env())


# -- live sessions -------------------------------------------------------------------------
@pytest.mark.podman
def test_fork_flood_in_its_own_container_is_the_agents_failure(task, tmp_path, podman_runtime):
    """Background sleeps up to a pids limit of 64: the next exec cannot start. The
    cgroup is at its limit, the service answers: ``agent_pids``, scored U = -1 (one P2P
    test), reward per the utility, not excluded, no trial."""
    env = _env(task, tmp_path, podman_runtime, limits=Limits(pids=64), bash_timeout_s=30)
    try:
        assert env.bash(FLOOD).strip() == "full 64"
        out = env.bash("echo hello")
        assert out.startswith("ERROR: the sandbox failed (SandboxExecError") and "hello" not in out
        assert env.failure[0] == "sandbox_error" and env.failure_class == "agent_pids"
        ev = env.failure_evidence
        assert ev["service_ok"] is True and ev["container"] == "running"
        assert ev["cgroup"]["pids_max"] == 64 and ev["cgroup"]["pids_current"] >= 60
        assert ev["cgroup"]["pids_max_events"] > 0 and ev["limits"]["pids"] == 64
        assert env.session is None  # released at once
    finally:
        release(env)
    rec = _record(env, task)
    assert (rec.exclusion, rec.failure_class, rec.resolved) == (None, "agent_pids", False)
    assert rec.utility == rec.reward == -1.0 and rec.contrast is None and rec.factual is None
    assert rec.failure_evidence is ev and rec.failure == ["sandbox_error", env.failure[1]]
    assert _record(env, task, "resolved").reward == 0.0


@pytest.mark.podman
def test_memory_filled_to_its_own_limit_is_the_agents_failure(task, tmp_path, podman_runtime):
    """/tmp (a tmpfs charged to the container's memory) filled past a 96 MiB limit: the OOM
    killer empties the container, the next exec cannot start; the last call's sample shows
    an OOM kill at the container's own limit, or (when the kill came during the filling call
    and the sample after it found the cgroup gone: seen in a loaded full run) the kernel's
    ``CONSTRAINT_MEMCG`` record names the container's cgroup: ``agent_oom``."""
    env = _env(task, tmp_path, podman_runtime, limits=Limits(memory="96m"), bash_timeout_s=30)
    try:
        assert env.bash("echo up").strip() == "up"
        env.bash("for i in 1 2 3; do head -c 50M /dev/zero > /tmp/fill$i; done; echo filled")
        out = env.bash("echo hello")
        assert out.startswith("ERROR: the sandbox failed"), out
        assert env.failure_class == "agent_oom", env.failure_evidence
        ev = env.failure_evidence
        assert ev["service_ok"] is True
        seen = ev["cgroup"] if ev["container"] == "running" else ev["cgroup_last"]
        if seen and seen.get("oom_kill"):
            assert seen["memory_limit_bytes"] == 96 * 2**20
            assert seen["memory_peak_bytes"] >= seen["memory_limit_bytes"] - 4 * 2**20
        else:
            assert ev["container"] != "running", ev
            assert "constraint=CONSTRAINT_MEMCG" in ev["memcg_oom"], ev
    finally:
        release(env)
    rec = _record(env, task)
    assert rec.exclusion is None and rec.reward == -1.0 and rec.failure_class == "agent_oom"


def test_disk_budget_is_the_agents_failure_with_its_bytes(task, tmp_path):
    """A tree past its budget: ``agent_disk_budget`` with the budget and the bytes; files gone;
    scored, not excluded (U = 0 for a task with no PASS_TO_PASS test)."""
    env = _env(task, tmp_path, None, tree_budget_bytes=200)
    workdir = env.workdir
    try:
        env.create("big.txt", "x" * 300)
        assert env.failure[0] == "disk_budget" and env.failure_class == "agent_disk_budget"
        ev = env.failure_evidence
        assert ev["tree_budget_bytes"] == 200 and ev["grown_bytes"] >= 300
        assert not workdir.exists()
    finally:
        release(env)
    no_p2p = _task(task, p2p=())
    rec = _record(env, no_p2p)
    assert (rec.exclusion, rec.reward, rec.utility, rec.resolved) == (None, 0.0, 0.0, False)


@pytest.mark.podman
def test_agent_cannot_stop_its_own_container(task, tmp_path, podman_runtime):
    """The init and main process run as a uid of their own: the agent (root, no
    capabilities) gets EPERM signalling them, and its container keeps working."""
    env = _env(task, tmp_path, podman_runtime)
    try:
        out = env.bash("id -u; kill -TERM 1; kill -KILL 1; echo rc=$?")
        assert out.startswith("0\n") and "Operation not permitted" in out
        assert env.bash("echo alive").strip() == "alive" and env.failure is None
    finally:
        release(env)


@pytest.mark.podman
@pytest.mark.parametrize("outside", ["rm", "kill"])
def test_container_broken_from_outside_stays_an_infra_failure(task, tmp_path, podman_runtime,
                                                              outside):
    """The container removed (``podman rm -f``) or killed (``podman kill``) by someone else:
    the same failed exec, but no limit of the container was hit: excluded as
    ``sandbox_error``, reward None."""
    env = _env(task, tmp_path, podman_runtime)
    try:
        assert env.bash("echo up").strip() == "up"
        if outside == "rm":
            _podman("rm", "-f", env.session.name)
        else:
            _podman("kill", "-s", "KILL", env.session.name)
        out = env.bash("echo hello")
        assert out.startswith("ERROR: the sandbox failed") and env.failure[0] == "sandbox_error"
        assert env.failure_class is None
        ev = env.failure_evidence
        assert ev["service_ok"] is True
        assert ev["container"] in (("missing",) if outside == "rm" else ("exited", "stopped"))
    finally:
        release(env)
    rec = _record(env, task)
    assert (rec.exclusion, rec.reward, rec.failure_class) == ("sandbox_error", None, None)


@pytest.mark.podman
def test_dead_service_stays_an_infra_failure(task, tmp_path):
    """The Podman service dies under a live session: the exec fails and the ping does not
    answer: infrastructure, excluded, reward None (containers removed by run label)."""
    from sandbox.runtimes.podman_runtime import PodmanRuntime, gc

    rt = PodmanRuntime()
    env = _env(task, tmp_path, rt)
    try:
        assert env.bash("echo up").strip() == "up"
        rt._service.proc.kill()
        rt._service.proc.wait()
        out = env.bash("echo hello")
        assert out.startswith("ERROR: the sandbox failed")
        assert env.failure[0] == "sandbox_error" and env.failure_class is None
        assert env.failure_evidence["service_ok"] is False
    finally:
        release(env)
        rt.close()
        gc(rt.run_id)
    assert _record(env, task).exclusion == "sandbox_error"


# -- the rule, pure -----------------------------------------------------------------------
def _cg(**kw):
    base = {"pids_current": 3, "pids_max": 1024, "pids_max_events": 0,
            "memory_limit_bytes": 2**30, "memory_peak_bytes": 2**20,
            "memory_current_bytes": 2**20, "oom_kill": 0}
    return {**base, **kw}


@pytest.mark.parametrize("evidence, expected", [
    ({"service_ok": True, "container": "running",
      "cgroup": _cg(pids_current=1023, pids_max_events=9)}, "agent_pids"),
    # at the limit but the service is dead: infrastructure
    ({"service_ok": False, "container": "running",
      "cgroup": _cg(pids_current=1024, pids_max_events=9)}, None),
    # near the limit but no fork was ever refused: not the pids
    ({"service_ok": True, "container": "running", "cgroup": _cg(pids_current=1022)}, None),
    ({"service_ok": True, "container": "running",
      "cgroup": _cg(oom_kill=3, memory_peak_bytes=2**30), "cgroup_last": _cg()}, "agent_oom"),
    # an OOM kill the agent recovered from before the last call says nothing now
    ({"service_ok": True, "container": "running",
      "cgroup": _cg(oom_kill=3, memory_peak_bytes=2**30),
      "cgroup_last": _cg(oom_kill=3, memory_peak_bytes=2**30)}, None),
    # a host-wide OOM kill below the container's limit is not the agent's
    ({"service_ok": True, "container": "running",
      "cgroup": _cg(oom_kill=1, memory_peak_bytes=2**29), "cgroup_last": _cg()}, None),
    ({"service_ok": True, "container": "exited", "cgroup": None,
      "cgroup_last": _cg(oom_kill=2, memory_peak_bytes=2**30), "cgroup_prev": _cg()},
     "agent_oom"),
    ({"service_ok": True, "container": "exited", "cgroup": None, "cgroup_last": _cg(),
      "cgroup_prev": _cg()}, None),
    ({"service_ok": True, "container": "missing",
      "cgroup_last": _cg(oom_kill=2, memory_peak_bytes=2**30)}, None),
    # stopped during the failing call (no sample saw it): the kernel's record of an OOM kill
    # at this container's own limit
    ({"service_ok": True, "container": "exited", "cgroup": None, "cgroup_last": None,
      "memcg_oom": "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/p/libpod-a,task=bash"},
     "agent_oom"),
    ({"service_ok": True, "container": "exited", "cgroup": None, "cgroup_last": None,
      "memcg_oom": None}, None),
    # -- counters that only grow decide, however the pids were freed by the time of the read
    # a fork bomb that started in the last call that returned and filled the limit in the
    # failing one: 953 of 1024 pids left by the time of the read (seen live), 1001 refusals
    ({"service_ok": True, "container": "running",
      "cgroup": _cg(pids_current=953, pids_max_events=1001),
      "cgroup_last": _cg(pids_current=56), "cgroup_prev": _cg(pids_current=2)}, "agent_pids"),
    # the bomb hit the limit during the last call that returned; its processes were reaped
    # before the read
    ({"service_ok": True, "container": "running",
      "cgroup": _cg(pids_current=5, pids_max_events=40),
      "cgroup_last": _cg(pids_current=700, pids_max_events=40),
      "cgroup_prev": _cg(pids_max_events=0)}, "agent_pids"),
    # refusals before the window (two calls back) and none since: not this failure
    ({"service_ok": True, "container": "running",
      "cgroup": _cg(pids_current=5, pids_max_events=40),
      "cgroup_last": _cg(pids_max_events=40), "cgroup_prev": _cg(pids_max_events=40)}, None),
    # no call returned yet: the window starts at the session's first sample
    ({"service_ok": True, "container": "running",
      "cgroup": _cg(pids_current=5, pids_max_events=3), "cgroup_last": _cg()}, "agent_pids"),
    # the counters now unreadable; those read the moment the exec failed show the refusals
    ({"service_ok": True, "container": "running", "cgroup": None,
      "cgroup_at_failure": _cg(pids_current=1000, pids_max_events=7),
      "cgroup_last": _cg()}, "agent_pids"),
    # the same counters, but the service is dead, or the container gone: infrastructure
    ({"service_ok": False, "container": "running",
      "cgroup": _cg(pids_current=953, pids_max_events=1001), "cgroup_last": _cg()}, None),
    ({"service_ok": True, "container": "missing",
      "cgroup_at_failure": _cg(pids_current=953, pids_max_events=1001),
      "cgroup_last": _cg()}, None),
    # the cgroup went OOM at its own limit (v2 memory.events oom) with nothing killed: the
    # exec got ENOMEM
    ({"service_ok": True, "container": "running",
      "cgroup": _cg(memory_oom_events=2, memory_current_bytes=2**30 - 2**20),
      "cgroup_last": _cg(memory_oom_events=0)}, "agent_oom"),
    # OOM kills while the last call that returned filled /tmp, then the next exec's setns
    # failed with no further kill (seen live: the counters of one such episode)
    ({"service_ok": True, "container": "running",
      "cgroup": _cg(memory_limit_bytes=100663296, memory_peak_bytes=100663296,
                    memory_current_bytes=21139456, oom_kill=2),
      "cgroup_at_failure": _cg(memory_limit_bytes=100663296, memory_peak_bytes=100663296,
                               memory_current_bytes=25583616, oom_kill=2),
      "cgroup_last": _cg(memory_limit_bytes=100663296, memory_peak_bytes=100663296,
                         memory_current_bytes=100507648, oom_kill=2),
      "cgroup_prev": _cg(memory_limit_bytes=100663296, memory_peak_bytes=4681728,
                         memory_current_bytes=593920, oom_kill=0)}, "agent_oom"),
    # stopped by the OOM killer during the failing call: the counters read at the failure
    ({"service_ok": True, "container": "exited", "cgroup": None,
      "cgroup_at_failure": _cg(oom_kill=1, memory_peak_bytes=2**30),
      "cgroup_last": _cg(), "cgroup_prev": _cg()}, "agent_oom"),
    # stopped, an OOM kill the agent recovered from before the failing call: not this one
    ({"service_ok": True, "container": "exited", "cgroup": None,
      "cgroup_at_failure": _cg(oom_kill=1, memory_peak_bytes=2**30),
      "cgroup_last": _cg(oom_kill=1, memory_peak_bytes=2**30),
      "cgroup_prev": _cg(oom_kill=1, memory_peak_bytes=2**30)}, None),
])
def test_classify_exec_failure(evidence, expected):
    assert classify_exec_failure(evidence) == expected


def test_memcg_oom_record_names_this_cgroup_and_its_own_limit(tmp_path):
    from sandbox.workspace.health import memcg_oom_logged

    def log(*lines: str) -> str:
        path = tmp_path / f"kmsg{len(list(tmp_path.iterdir()))}"
        path.write_text("".join(f"6,{i},{i * 10},-;{x}\n" for i, x in enumerate(lines)))
        return str(path)

    mine = "/libpod_parent/libpod-abc"
    rec = ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=libpod-abc,"
           f"mems_allowed=0,oom_memcg={mine},task_memcg={mine},task=bash,pid=7,uid=0")
    assert memcg_oom_logged(mine, log("hello", rec)) == rec
    # another container's kill, a host-wide kill, a prefix of another id: none of them
    assert memcg_oom_logged(mine, log(rec.replace("libpod-abc", "libpod-xyz"))) is None
    assert memcg_oom_logged(mine, log(rec.replace("CONSTRAINT_MEMCG", "CONSTRAINT_NONE"))) is None
    assert memcg_oom_logged("/libpod_parent/libpod-ab", log(rec)) is None
    assert memcg_oom_logged(mine, str(tmp_path / "absent")) is None
    assert memcg_oom_logged(None, log(rec)) is None


def test_failure_value_is_the_contracts():
    assert failure_utility(["a"], ["b", "c"]) == -1.0 and failure_utility(["a"], []) == 0.0
    t = SimpleNamespace(FAIL_TO_PASS=["a"], PASS_TO_PASS=["b"])
    v = agent_failure_verdict(t, "agent_oom")
    assert (v.resolved, v.utility, v.reward("utility"), v.reward("resolved")) == \
        (False, -1.0, -1.0, 0.0)
    with pytest.raises(ValueError, match="failure_class"):
        agent_failure_verdict(t, "artifact_timeout")


def test_exhaustion_evidence_names_the_counters_a_host_keeps():
    """v2 keeps all three; v1 has no ``memory.events`` ``oom``; no reading keeps none."""
    from sandbox.workspace.health import EXHAUSTION_COUNTERS, exhaustion_evidence

    assert exhaustion_evidence(_cg(memory_oom_events=0)) == dict.fromkeys(EXHAUSTION_COUNTERS,
                                                                          True)
    assert exhaustion_evidence(_cg(memory_oom_events=None)) == {
        "pids_max_events": True, "oom_kill": True, "memory_oom_events": False}
    assert exhaustion_evidence(None) == dict.fromkeys(EXHAUSTION_COUNTERS, False)
