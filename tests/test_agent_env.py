"""SWEAgentEnv: tools over a real working tree and a real Podman container."""

from __future__ import annotations

from pathlib import Path

import pytest

from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release, tool_schemas
from sandbox.snapshots.snapshot import read_blob


@pytest.fixture
def task(calc_task):
    return calc_task


def test_tool_schemas_cover_the_tool_set():
    names = [s["function"]["name"] for s in tool_schemas()]
    assert names == ["bash", "view", "create", "str_replace", "insert", "submit"]


def test_only_tools_are_public_methods():
    """TRL exposes every public method of an environment as a tool."""
    import inspect

    public = sorted(n for n, _ in inspect.getmembers(SWEAgentEnv, predicate=inspect.isfunction)
                    if not n.startswith("_") and n != "reset")
    assert public == sorted(["bash", "view", "create", "str_replace", "insert", "submit"])


@pytest.mark.podman
def test_env_runs_tools_in_its_own_container_and_snapshots(task, tmp_path, podman_runtime):
    ctx = AgentContext(tasks={task.instance_id: task}, runtime=podman_runtime,
                       workroot=str(tmp_path / "work"))
    env = SWEAgentEnv(ctx)
    env.reset(instance_id=task.instance_id)
    try:
        ctx.turn = 1
        assert "return a - b" in env.view("calc.py")
        out = env.str_replace("calc.py", "return a - b", "return a + b")
        assert "has been edited" in out
        ctx.turn = 2
        assert env.bash("python3 -c 'import calc; print(calc.add(2, 3))'").strip() == "5"
        # the sandbox has no network and cannot see the host's files
        assert "unreachable" in env.bash("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\" 2>&1 | tail -1")
        assert env.bash(f"ls {tmp_path} 2>&1; echo done").strip().endswith("done")
        assert "No such file" in env.bash(f"ls {tmp_path}")
        err = env.str_replace("calc.py", "not there", "x")
        assert err.startswith("ERROR: No replacement was performed")
        ctx.turn = 3
        env.submit()
        assert env.bash("echo hi").startswith("ERROR: The patch was already submitted")
        assert [c.turn for c in env.calls] == [1, 1, 2, 2, 2, 2, 2, 3, 3]
        assert [c.ok for c in env.calls] == [True, True, True, True, True, True, False, True, False]
        assert env.valid_calls == 7
        trees = env.trees
        assert trees[0] == env.base_tree and trees[1] != env.base_tree
        assert read_blob(env.snapshot_repo, env.final_tree, "calc.py")[1].endswith(
            b"return a + b\n")
    finally:
        release(env)
    assert env.workdir is None


def test_unknown_task_is_refused(task, tmp_path):
    env = SWEAgentEnv(AgentContext(tasks={}, workroot=str(tmp_path)))
    with pytest.raises(KeyError, match="instance_id"):
        env.reset(instance_id="nope")


@pytest.mark.podman
def test_rollout_bash_is_confined_to_its_working_tree(task, tmp_path, podman_runtime):
    """The agent's bash runs in its own container: it sees and writes only the rollout's
    working tree (and a private /tmp), never the host's files, processes or network."""
    import socket
    import uuid

    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only\n")
    marker = f"ecredit-probe-{uuid.uuid4().hex[:8]}"
    ctx = AgentContext(tasks={task.instance_id: task}, runtime=podman_runtime,
                       workroot=str(tmp_path / "work"))
    env = SWEAgentEnv(ctx)
    env.reset(instance_id=task.instance_id)
    try:
        ctx.turn = 1
        sh = env.bash
        # host files outside the working tree do not exist in there
        assert "No such file" in sh(f"cat {secret}")
        assert "No such file" in sh(f"ls {env.workdir}")  # not even its own host path
        assert sh("cat /etc/hostname").strip() != socket.gethostname()
        # writable: the working tree (seen on the host) and a private /tmp; nothing else
        sh("echo inside > made_here.txt")
        assert (env.workdir / "made_here.txt").read_text() == "inside\n"
        for path in ("/etc/x", "/usr/x", "/root/x", "/x"):
            assert "Read-only file system" in sh(f"touch {path}"), path
        assert sh(f"touch /tmp/{marker} && echo ok").strip() == "ok"
        assert not (Path("/tmp") / marker).exists()
        # no capabilities, no privilege escalation, own process namespace
        assert "CapEff:\t0000000000000000" in sh("grep CapEff /proc/self/status")
        assert "NoNewPrivs:\t1" in sh("grep NoNewPrivs /proc/self/status")
        assert sh("cat /proc/1/cmdline | tr '\\0' ' '").split() == ["/run/podman-init", "--", "sleep", "infinity"]
        assert "exit code" in sh("mount -t tmpfs none /mnt 2>&1")
        # no network: only the loopback interface, outside addresses unreachable
        assert sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").split() == ["lo"]
        probe = ("python3 -c \"import socket\ntry:\n socket.create_connection(('1.1.1.1', 53), "
                 "timeout=2); print('REACHED')\nexcept OSError as e: print('BLOCKED')\"")
        assert sh(probe).strip() == "BLOCKED"
    finally:
        release(env)
