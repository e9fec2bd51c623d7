"""Agent containers under a hostile policy: every call recorded and
snapshotted whatever it raised; init as PID 1; an exec the runtime could not start is a
sandbox failure, charged to whoever caused it (``tests/test_agent_failures.py``); per-file and per-rollout disk limits; temp directories of dead runs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
from sandbox.runtimes.tempdirs import OWNER_FILE, gc_temp_dirs, mark_owner
from sandbox.workspace.disk import tree_usage
from sandbox.workspace.session import SandboxExecError

MiB = 2**20


@pytest.fixture
def task(calc_task):
    return calc_task


def _env(task, tmp_path, runtime, **kw) -> tuple[SWEAgentEnv, AgentContext]:
    ctx = AgentContext(tasks={task.instance_id: task}, runtime=runtime,
                       workroot=str(tmp_path / "work"), **kw)
    env = SWEAgentEnv(ctx)
    env.reset(instance_id=task.instance_id)
    ctx.turn = 1
    return env, ctx


def _tree_git(env, *args: str) -> str:
    """git on the rollout's private snapshot store (where the trees live)."""
    import subprocess

    return subprocess.run(["git", "--git-dir", str(env.snapshot_repo), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def _show(env, tree: str, path: str) -> str:
    return _tree_git(env, "show", f"{tree}:{path}")


@pytest.mark.podman
def test_call_that_changes_files_then_fails_is_recorded_with_its_change(task, tmp_path,
                                                                        podman_runtime):
    """The runtime raises after the command ran (a lost API connection): the call is
    recorded (ok=False, its error, status infra) with the tree it left, in its own turn;
    the episode ends as an infra failure and the container is released."""
    env, ctx = _env(task, tmp_path, podman_runtime)
    try:
        env.view("calc.py")
        ctx.turn = 2
        session = env.session
        real_run = session.run

        def run_then_fail(command, **kw):
            real_run(command, **kw)  # the command really runs in the container
            raise ConnectionError("podman API: connection reset by peer")

        session.run = run_then_fail
        out = env.bash("sed -i 's/a - b/a + b/' calc.py && echo changed > new.txt")
        assert out.startswith("ERROR: the sandbox failed (ConnectionError: podman API")
        last = env.calls[-1]
        assert (last.name, last.ok, last.status, last.turn) == ("bash", False, "infra", 2)
        assert "connection reset" in last.error
        # the change is in the failing call's own snapshot, not credited to a later call
        assert last.tree != env.calls[0].tree
        assert _show(env, last.tree, "calc.py").endswith("return a + b")
        assert _show(env, last.tree, "new.txt") == "changed"
        assert env.failure[0] == "sandbox_error"
        assert env.failure_class is None  # a healthy container under its limits: not the agent
        assert env.session is None  # released at once
        assert podman_runtime._live.get(session.name) is None
        ctx.turn = 3
        out = env.view("calc.py")
        assert out.startswith("ERROR: The episode has ended (sandbox_error")
        assert env.calls[-1].status == "ended" and env.calls[-1].tree == last.tree
    finally:
        release(env)


def test_snapshot_error_is_recorded_and_ends_the_episode(task, tmp_path):
    """A snapshot that raises: the call is still recorded (with the last good tree), the
    episode ends with ``snapshot_error``; nothing propagates to TRL's tool loop."""
    env, ctx = _env(task, tmp_path, None)
    try:
        env.create("a.txt", "one\n")
        good = env.calls[-1].tree

        def broken():
            raise RuntimeError("git write-tree: index corrupt")

        env.snapshotter.snapshot = broken
        out = env.create("b.txt", "two\n")
        assert "has been created" in out or "File created" in out or "b.txt" in out
        assert out.endswith("(snapshot_error: RuntimeError: git write-tree: index corrupt).")
        assert len(env.calls) == 2 and env.calls[-1].ok and env.calls[-1].tree == good
        assert env.failure == ("snapshot_error", "RuntimeError: git write-tree: index corrupt")
        assert env.insert("a.txt", 0, "x\n").startswith("ERROR: The episode has ended")
        assert (env.workdir / "a.txt").read_text() == "one\n"  # not run
    finally:
        release(env)


@pytest.mark.podman
def test_init_reaps_orphans_of_timed_out_calls(task, tmp_path, podman_runtime):
    """Three timed-out calls each start 400 background sleeps (1200 > the pids limit of
    1024 if they stayed as zombies); the init as PID 1 reaps them and a normal call works."""
    env, ctx = _env(task, tmp_path, podman_runtime, bash_timeout_s=3)
    try:
        assert env.bash("cat /proc/1/cmdline | tr '\\0' ' '").split()[0] == "/run/podman-init"
        for _ in range(3):
            out = env.bash("for i in $(seq 400); do sleep 1000 & done; sleep 100")
            assert out.endswith("<command timed out after 3 s>"), out[-200:]
        time.sleep(0.5)
        assert env.bash("echo alive").strip() == "alive"
        procs = int(env.bash("ls -d /proc/[0-9]* | wc -l").strip())
        assert procs < 10, procs
        assert env.failure is None and all(c.status == "ok" for c in env.calls)
    finally:
        release(env)


@pytest.mark.podman
def test_exec_its_own_processes_block_is_the_agents_failure(task, tmp_path, podman_runtime):
    """Live processes the group kill cannot reach (own sessions) fill the pids limit: the
    next exec fails in the OCI runtime. It is recorded as a sandbox failure, never tool
    output, and charged to the agent (``agent_pids``: its own processes, the
    service healthy); an agent's own ``exit 125`` stays the command's status."""
    env, ctx = _env(task, tmp_path, podman_runtime, bash_timeout_s=60)
    try:
        assert env.bash("exit 125").endswith("<exit code 125>")
        # a filler in its own session (out of reach of the group kill) takes every free pid
        # as soon as one is released; the call returns once the pids cgroup is full
        filler = ("import os, signal, time\nos.setsid()\nwhile True:\n try:\n"
                  "  if os.fork() == 0:\n   signal.pause()\n except OSError:\n  time.sleep(0.001)")
        out = env.bash(f"python3 -c \"{filler}\" >/dev/null 2>&1 &\n"
                       "g=/sys/fs/cgroup/pids; read max < $g/pids.max; read cur < $g/pids.current\n"
                       "while [ $cur -lt $max ]; do read cur < $g/pids.current; done; echo full $cur")
        assert out.strip() == "full 1024", out
        out = env.bash("echo hello")
        assert out.startswith("ERROR: the sandbox failed (SandboxExecError: exec did not start")
        assert "hello" not in out
        assert env.calls[-1].status == "infra" and env.failure[0] == "sandbox_error"
        assert env.failure_class == "agent_pids"
        assert env.failure_evidence["cgroup"]["pids_max"] == 1024
        assert env.session is None
    finally:
        release(env)


def test_exec_error_type_is_a_runtime_error():
    assert issubclass(SandboxExecError, RuntimeError)


@pytest.mark.podman
def test_disk_limits_per_file_and_per_rollout(task, tmp_path, podman_runtime):
    """A bash call writing 200 MiB of random bytes gets its file cut at the per-file limit
    (fsize ulimit); the snapshot stores no file above it; a tree grown past the rollout's
    budget (files + snapshot store) ends the episode with ``disk_budget`` and its files are
    removed; the over-budget state is never snapshotted."""
    env, ctx = _env(task, tmp_path, podman_runtime, max_file_bytes=40 * MiB,
                    tree_budget_bytes=100 * MiB)
    workdir = env.workdir
    try:
        out = env.bash("head -c 200M /dev/urandom > big.bin; echo rc=$?; stat -c %s big.bin")
        assert "File size limit exceeded" in out and "rc=153" in out
        assert out.strip().endswith(str(40 * MiB))
        first = env.calls[-1]
        assert first.status == "ok" and env.failure is None
        size = _tree_git(env, "cat-file", "-s", f"{first.tree}:big.bin")
        assert int(size) == 40 * MiB  # stored, at the limit, not above
        # 40 MiB file + 40 MiB in the snapshot store + 30 MiB more > 100 MiB budget
        out = env.bash("head -c 30M /dev/urandom > more.bin; echo done")
        assert "done" in out and "episode has ended (disk_budget: the tree grew by" in out
        second = env.calls[-1]
        assert second.tree == first.tree  # the over-budget tree is not snapshotted
        assert env.failure[0] == "disk_budget" and env.failure_class == "agent_disk_budget"
        assert not workdir.exists() and env.session is None
        assert env.bash("ls").startswith("ERROR: The episode has ended (disk_budget")
    finally:
        release(env)


def test_file_over_the_limit_written_on_the_host_side_ends_the_episode(task, tmp_path):
    """The editor runs on the host (no ulimit): a file above the limit is never snapshotted."""
    env, ctx = _env(task, tmp_path, None, max_file_bytes=10_000)
    try:
        env.create("ok.txt", "x" * 10_000)
        assert env.failure is None
        ok_tree = env.calls[-1].tree
        env.create("big.txt", "x" * 10_001)
        assert env.failure[0] == "disk_budget" and "per-file limit of 10000" in env.failure[1]
        assert env.calls[-1].tree == ok_tree
    finally:
        release(env)


def test_tree_usage_counts_apparent_size_once_per_inode(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"x" * 10)
    os.link(tmp_path / "d" / "a", tmp_path / "hard")
    (tmp_path / "link").symlink_to("/etc/passwd")
    with open(tmp_path / "sparse", "wb") as fh:
        fh.truncate(5000)
    use = tree_usage([tmp_path, tmp_path / "missing"])
    assert (use.total_bytes, use.files, use.largest_bytes) == (5010, 2, 5000)
    assert use.largest_path.endswith("sparse")


def test_context_limits_are_checked_and_its_temp_root_is_removed(tmp_path):
    with pytest.raises(ValueError, match="tree_budget_bytes"):
        AgentContext(tasks={}, workroot=str(tmp_path), tree_budget_bytes=0)
    ctx = AgentContext(tasks={})
    root = Path(ctx.workroot)
    assert root.name.startswith("ecredit-rollouts-") and (root / OWNER_FILE).is_file()
    ctx.close()
    assert not root.exists()
    given = AgentContext(tasks={}, workroot=str(tmp_path / "mine"))
    given.close()
    assert (tmp_path / "mine").is_dir()  # a given workroot is the caller's


def test_gc_removes_temp_dirs_of_dead_processes_only(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    d_dead = tmp_path / "ecredit-rollouts-dead"
    d_live = tmp_path / "ecredit-snap-live"
    d_fresh = tmp_path / "ecredit-snap-unmarked-fresh"
    d_old = tmp_path / "ecredit-snap-unmarked-old"
    other = tmp_path / "not-ours-old"
    for d in (d_dead, d_live, d_fresh, d_old, other):
        d.mkdir()
        (d / "index").write_text("x")
    mark_owner(d_dead, pid=dead.pid)
    mark_owner(d_live)
    old = time.time() - 7 * 3600
    for d in (d_old, other):
        os.utime(d / "index", (old, old))
        os.utime(d, (old, old))
    proc = subprocess.run([sys.executable, "-m", "sandbox", "gc", "--run-id",
                           "no-such-run-xyz", "--temp-root", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO_ROOT,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert proc.returncode == 0, proc.stderr
    assert "removed 2 temp director(ies)" in proc.stdout
    assert not d_dead.exists() and not d_old.exists()
    assert d_live.exists() and d_fresh.exists() and other.exists()
    assert gc_temp_dirs(tmp_path) == []


def test_a_socket_directory_falls_back_to_a_short_root_that_gc_also_scans(tmp_path,
                                                                         monkeypatch):
    """socket_dir: in TMPDIR when the socket's path fits 107 bytes, else under SHORT_ROOT;
    gc with no temp root scans both, removes a dead owner's and keeps a live one's; with no
    root short enough, one error naming the length."""
    import shutil

    import sandbox.runtimes.tempdirs as td

    # short roots of this test's own (tmp_path itself may be too deep for a socket)
    short, shallow = (Path(tempfile.mkdtemp(prefix="s", dir="/tmp")) for _ in range(2))
    try:
        monkeypatch.setattr(td, "SHORT_ROOT", str(short))
        d = td.socket_dir("ecredit-podman-", "podman.sock", shallow)
        assert d.parent == shallow and (d / OWNER_FILE).is_file()
        deep = tmp_path / ("d" * 60) / ("e" * 60)
        deep.mkdir(parents=True)
        monkeypatch.setattr(tempfile, "tempdir", str(deep))
        far = td.socket_dir("ecredit-podman-", "podman.sock")
        assert far.parent == short and (far / OWNER_FILE).is_file()
        assert len(os.fsencode(far / "podman.sock")) <= td.MAX_SOCKET_PATH
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        mark_owner(far, pid=dead.pid)
        live = td.socket_dir("ecredit-podman-", "podman.sock")
        assert live.parent == short
        assert td.gc_temp_dirs() == [str(far)]
        assert live.exists() and not far.exists()
        monkeypatch.setattr(td, "SHORT_ROOT", str(deep))
        with pytest.raises(OSError, match="exceed 107 bytes"):
            td.socket_dir("ecredit-podman-", "podman.sock")
    finally:
        shutil.rmtree(short, ignore_errors=True)
        shutil.rmtree(shallow, ignore_errors=True)


def test_container_that_cannot_start_ends_the_episode_as_infra(task, tmp_path, monkeypatch):
    import sandbox.workspace.rollout as env_mod  # the workspace opens the rollout's session

    def no_container(*a, **kw):
        raise RuntimeError("OCI runtime error: cannot start")

    monkeypatch.setattr(env_mod, "open_session", no_container)

    class HereRuntime:  # a local runtime: it opens the workspace on this machine
        def open_workspace(self, task, site):
            return site.open_here(task)

    env, ctx = _env(task, tmp_path, HereRuntime())
    try:
        assert env.failure == ("sandbox_setup", "RuntimeError: OCI runtime error: cannot start")
        assert env.view("calc.py").startswith("ERROR: The episode has ended (sandbox_setup")
        assert [c.status for c in env.calls] == ["ended"]
    finally:
        release(env)
