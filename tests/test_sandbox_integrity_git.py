"""Host-side git never obeys the agent's repository; what we record is
what the agent changed; git works inside the agent's container.

The ``podman`` tests run a live agent session (``SWEAgentEnv`` + its Podman container):
the agent sets things up with its ``bash`` tool *inside* its container and then makes
further tool calls, after each of which the host snapshots the tree.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import AgentTask, git

from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
from ecredit_trl.credit.planning import generated_by_turn, plan_query, turn_snapshots
from sandbox.images import default_image
from sandbox.snapshots.snapshot import artifact, changed_paths, read_blob


@pytest.fixture
def task(tmp_path):
    """A task repository whose base commit has a parent holding the 'fix' (as bundled tasks
    do): the agent must not be able to reach it."""
    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "run.sh").write_text("echo run\n")
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "m.py").write_text("M = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "pristine")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "commit", "-qam", "mutation")
    return AgentTask("demo__calc-1", str(repo), git(repo, "rev-parse", "HEAD"), default_image())


def _env(task, tmp_path, runtime) -> tuple[SWEAgentEnv, AgentContext]:
    ctx = AgentContext(tasks={task.instance_id: task}, runtime=runtime,
                       workroot=str(tmp_path / "work"))
    env = SWEAgentEnv(ctx)
    env.reset(instance_id=task.instance_id)
    ctx.turn = 1
    return env, ctx


def _final(env) -> dict[str, tuple[str, bytes]]:
    """path -> (mode, bytes) of every path the rollout changed, read from the record."""
    return {c.path: read_blob(env.snapshot_repo, env.final_tree, c.path)
            for c in changed_paths(env.snapshot_repo, env.base_tree, env.final_tree)
            if c.status != "D"}


def _apply_in_fresh_base(task, patch: str, tmp_path) -> Path:
    clone = tmp_path / f"verify-{uuid.uuid4().hex[:6]}"
    git(tmp_path, "clone", "-q", task.repo_dir, str(clone))
    git(clone, "checkout", "-q", task.base_commit)
    if patch:
        (tmp_path / "p.diff").write_text(patch, errors="surrogateescape")
        git(clone, "apply", "--whitespace=nowarn", str(tmp_path / "p.diff"))
    return clone


# -- program-running keys the agent sets up inside its container ---------------------------

SETUPS = {
    "fsmonitor": "git config core.fsmonitor 'touch {m}; false'\n",
    "filter": ("printf '* filter=evil\\n' > .gitattributes\n"
               "git config filter.evil.clean 'touch {m}; cat'\n"
               "git config filter.evil.smudge 'cat'\n"),
    "textconv": ("printf '*.py diff=evil\\n' > .gitattributes\n"
                 "git config diff.evil.textconv 'touch {m}; cat'\n"),
}


@pytest.mark.podman
@pytest.mark.parametrize("kind", sorted(SETUPS))
def test_agent_git_config_never_runs_on_the_host(kind, task, tmp_path, podman_runtime):
    marker = Path("/tmp") / f"ecredit-marker-{uuid.uuid4().hex}"  # visible if run on the host
    env, ctx = _env(task, tmp_path, podman_runtime)
    try:
        env.bash(SETUPS[kind].format(m=marker) + "echo 'x = 1' >> calc.py\n")
        ctx.turn = 2
        env.str_replace("calc.py", "return a - b", "return a + b")
        env.bash("git status --short >/dev/null 2>&1; git diff >/dev/null 2>&1; true")
        snaps = turn_snapshots(env.base_tree, [c.turn for c in env.calls],
                               env.trees, 2)
        plan = plan_query(env.snapshot_repo, snaps, task_id=task.instance_id, rollout_index=0,
                          run_seed=0, test_patterns=["tests/"], format_error=False)
        patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
        assert not marker.exists(), f"{kind}: the agent's command ran on the host"
        # what we recorded is the true content of calc.py
        assert _final(env)["calc.py"][1] == (env.workdir / "calc.py").read_bytes()
        assert "return a + b" in plan.final_artifact and patch == plan.final_artifact
        # control: the same repository makes naive host-side git run the agent's command
        # (proof that the setup above was armed)
        objects = next(Path(task.repo_dir).parent.glob("work/.bases/*.git/objects"))
        host = subprocess.run(["git", "-C", str(env.workdir), "diff", "HEAD"],
                              capture_output=True,
                              env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull,
                                   "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(objects)})
        assert host.returncode in (0, 1)
        assert marker.exists(), f"{kind}: the control did not fire"
    finally:
        marker.unlink(missing_ok=True)
        release(env)


# -- no-code variants: the recorded artifact is the true change ----------------------------

@pytest.mark.podman
def test_agent_config_without_code_cannot_change_the_record(task, tmp_path, podman_runtime):
    env, ctx = _env(task, tmp_path, podman_runtime)
    try:
        env.bash("git config core.fileMode false\n"
                 "git config core.autocrlf true\n"
                 "printf 'secret.py\\n' > /tmp/excl && git config core.excludesFile /tmp/excl\n"
                 "printf 'hidden.py\\n*.txt\\n' >> .git/info/exclude\n"
                 "printf '* eol=crlf\\n' > .gitattributes\n"
                 "printf 'notes.txt\\nnew_ignored.py\\n' >> .gitignore\n")
        ctx.turn = 2
        env.bash("chmod +x run.sh\n"
                 "printf 'def add(a, b):\\r\\n    return a + b\\r\\n' > calc.py\n"
                 "echo 'S = 1' > secret.py; echo 'H = 1' > hidden.py; echo n > notes.txt\n"
                 "echo 'N = 1' > new_ignored.py; echo 'L' > build.log\n")
        got = _final(env)
        disk = {p: (env.workdir / p).read_bytes() for p in got}
        assert {p: b for p, (_m, b) in got.items()} == disk  # bytes as on disk
        assert got["calc.py"][1] == b"def add(a, b):\r\n    return a + b\r\n"  # CRLF kept
        assert got["run.sh"][0] == "100755"  # core.fileMode=false ignored
        assert {"secret.py", "hidden.py", "notes.txt", "new_ignored.py", ".gitattributes",
                ".gitignore"} <= set(got)  # the agent's excludes hide nothing
        assert "build.log" not in got  # the base commit's own ignore rules still hold
        # the artifact rebuilds exactly those bytes and modes on a fresh base checkout
        patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
        clone = _apply_in_fresh_base(task, patch, tmp_path)
        for p, (_mode, data) in got.items():
            assert (clone / p).read_bytes() == data, p
        assert os.access(clone / "run.sh", os.X_OK)
    finally:
        release(env)


# -- the agent's own git actions, deleted .git, nested repositories ------------------------

@pytest.mark.podman
def test_agent_git_actions_and_reinit_never_break_the_record(task, tmp_path, podman_runtime):
    env, ctx = _env(task, tmp_path, podman_runtime)
    try:
        # a normal repository inside: status / diff / stash / checkout -- f / commit
        assert env.bash("git status --short; echo rc=$?").strip() == "rc=0"
        assert env.bash("git log --oneline | wc -l").strip() == "1"  # history = the base only
        pristine = git(Path(task.repo_dir), "rev-parse", "HEAD^")
        assert "exit code" in env.bash(f"git cat-file -t {pristine}")  # the fix is unreachable
        env.bash("sed -i 's/a - b/a * b/' calc.py")
        assert "a * b" in env.bash("git diff")
        env.bash("git stash -q")
        assert "a - b" in env.bash("cat calc.py")
        env.bash("git stash pop -q")
        env.bash("git checkout -- calc.py")
        assert "a - b" in env.bash("cat calc.py")
        alt = env.bash("cat .git/objects/info/alternates").strip()
        assert "Read-only file system" in env.bash(f"touch {alt}/x")  # shared store: read-only
        env.bash("echo 'def mul(a, b): return a * b' > mul.py && git add -A && "
                 "git commit -qm agent && git log --oneline | wc -l")
        ctx.turn = 2
        # the agent throws its repository away and starts another
        env.bash("rm -rf .git && git init -q && git add -A && git commit -qm fresh")
        ctx.turn = 3
        env.str_replace("calc.py", "return a - b", "return a + b")
        # nested repositories: one without a commit, one with a commit
        env.bash("mkdir sub && cd sub && git init -q && echo 'S = 1' > s.py\n"
                 "mkdir ../sub2 && cd ../sub2 && git init -q && echo 'T = 1' > t.py && "
                 "git add t.py && git commit -qm inner")
        ctx.turn = 4
        env.bash("echo 'T = 2' > sub2/t.py && echo 'U = 1' > sub2/u.py")
        snaps = turn_snapshots(env.base_tree, [c.turn for c in env.calls], env.trees, 4)
        plan = plan_query(env.snapshot_repo, snaps, task_id=task.instance_id, rollout_index=0,
                          run_seed=0, test_patterns=["tests/"], format_error=False)
        got = _final(env)
        assert got["calc.py"][1].endswith(b"return a + b\n")
        assert got["mul.py"][1] == b"def mul(a, b): return a * b\n"
        assert got["sub/s.py"] == ("100644", b"S = 1\n")
        assert got["sub2/t.py"] == ("100644", b"T = 2\n")
        assert got["sub2/u.py"] == ("100644", b"U = 1\n")
        assert not any(m == "160000" for m, _ in got.values())  # never a gitlink
        assert not any(p.startswith((".git/", "sub/.git", "sub2/.git")) for p in got)
        assert "Subproject commit" not in plan.final_artifact
        assert {b["turn"] for b in plan.selection.blocks} == {1, 3, 4}
        clone = _apply_in_fresh_base(task, plan.final_artifact, tmp_path)
        assert (clone / "sub2" / "u.py").read_text() == "U = 1\n"
    finally:
        release(env)


# -- generated files and bytecode ----------------------------------------------------------

@pytest.mark.podman
def test_generated_files_are_not_edits_and_are_reported(task, tmp_path, podman_runtime):
    env, ctx = _env(task, tmp_path, podman_runtime)
    try:
        assert env.bash("echo $PYTHONDONTWRITEBYTECODE").strip() == "1"
        env.bash("mkdir -p tests && printf 'import calc\\ndef test_a():\\n    assert calc.add(1, 1)"
                 " == 2\\n' > tests/test_calc.py")
        ctx.turn = 2
        # a test run, plus what other tools leave behind
        env.bash("python3 -m pytest -q -p no:cacheprovider tests >/dev/null 2>&1\n"
                 "python3 -B -c 'import calc'\n"
                 "mkdir -p .pytest_cache/v pkg/__pycache__ demo.egg-info htmlcov\n"
                 "touch .pytest_cache/v/x pkg/__pycache__/m.cpython-311.pyc calc.pyc "
                 "demo.egg-info/PKG-INFO .coverage coverage.xml htmlcov/index.html")
        assert not (env.workdir / "__pycache__").exists()  # PYTHONDONTWRITEBYTECODE
        ctx.turn = 3
        env.str_replace("calc.py", "return a - b", "return a + b")
        calls = env.calls
        snaps = turn_snapshots(env.base_tree, [c.turn for c in calls], env.trees, 3)
        plan = plan_query(env.snapshot_repo, snaps, task_id=task.instance_id, rollout_index=0,
                          run_seed=0, test_patterns=["tests/"], format_error=False,
                          generated=generated_by_turn([c.turn for c in calls],
                                                      [c.generated for c in calls], 3))
        changed = {c.path for c in changed_paths(env.snapshot_repo, env.base_tree,
                                                  env.final_tree)}
        assert changed == {"calc.py", "tests/test_calc.py"}
        assert {b["turn"] for b in plan.selection.blocks} == {1, 3}
        assert plan.selection.generated_only == [{"turn": 2, "paths": [
            ".coverage", ".pytest_cache/v/x", "calc.pyc", "coverage.xml",
            "demo.egg-info/PKG-INFO", "htmlcov/index.html", "pkg/__pycache__/m.cpython-311.pyc"]}]
    finally:
        release(env)


# -- the same guarantees without Podman (the agent's writes done from the host side) -------

@pytest.fixture
def agent_tree(task, tmp_path):
    """An agent working tree made as SWEAgentEnv makes it, and its snapshotter."""
    from sandbox.snapshots.snapshot import Snapshotter
    from sandbox.workspace.agent_repo import agent_clone

    work = tmp_path / "agent"
    agent_clone(task.repo_dir, task.base_commit, work, tmp_path / "bases")
    snap = Snapshotter(work, base=task.base_commit, objects_from=task.repo_dir)
    yield work, snap
    snap.close()


def test_private_store_reads_no_agent_config_hooks_or_objects(agent_tree, tmp_path):
    work, snap = agent_tree
    marker = tmp_path / "marker"
    cfg = work / ".git" / "config"
    cfg.write_text(cfg.read_text() + (
        f"[core]\n\tfsmonitor = touch {marker}; false\n\tfileMode = false\n\tautocrlf = true\n"
        f"[filter \"evil\"]\n\tclean = touch {marker}; cat\n"
        f"[diff \"evil\"]\n\ttextconv = touch {marker}; cat\n"
        f"[include]\n\tpath = {tmp_path / 'more'}\n"))
    (work / ".gitattributes").write_text("* filter=evil diff=evil eol=crlf ident\n")
    hooks = work / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    for h in ("pre-commit", "post-index-change", "reference-transaction"):
        (hooks / h).write_text(f"#!/bin/sh\ntouch {marker}\n")
        os.chmod(hooks / h, 0o755)
    # forged objects / alternates in the agent's store are never consulted
    (work / ".git" / "objects" / "info" / "alternates").write_text("/nonexistent\n")
    (work / "calc.py").write_bytes(b"def add(a, b):\r\n    return a + b  # $Id$\r\n")
    os.chmod(work / "run.sh", 0o755)
    s1 = snap.snapshot()
    patch = artifact(snap.git_dir, snap.base_tree, s1)
    assert not marker.exists()
    assert read_blob(snap.git_dir, s1, "calc.py") == (
        "100644", b"def add(a, b):\r\n    return a + b  # $Id$\r\n")
    assert read_blob(snap.git_dir, s1, "run.sh")[0] == "100755"
    assert "old mode 100644\nnew mode 100755" in patch
    # the agent may even delete its .git entirely
    subprocess.run(["rm", "-rf", str(work / ".git")], check=True)
    (work / "x.py").write_text("X = 1\n")
    s2 = snap.snapshot()
    assert {c.path for c in changed_paths(snap.git_dir, s1, s2)} == {"x.py"}


def test_special_files_and_nested_repos_never_crash_a_snapshot(agent_tree):
    work, snap = agent_tree
    os.mkfifo(work / "fifo")
    (work / "sub").mkdir()
    subprocess.run(["git", "init", "-q", str(work / "sub")], check=True)
    (work / "sub" / "a.py").write_text("A = 1\n")
    (work / "sub" / "pkg").mkdir()
    (work / "sub" / "pkg" / "b.py").write_text("B = 1\n")
    os.symlink("a.py", work / "sub" / "link")
    s1 = snap.snapshot()
    got = {c.path: c.new_mode for c in changed_paths(snap.git_dir, snap.base_tree, s1)}
    assert got == {"sub/a.py": "100644", "sub/pkg/b.py": "100644", "sub/link": "120000"}
    # a tracked file replaced by a FIFO is recorded as deleted, not a crash
    (work / "run.sh").unlink()
    os.mkfifo(work / "run.sh")
    s2 = snap.snapshot()
    assert [(c.path, c.status) for c in changed_paths(snap.git_dir, s1, s2)] == [("run.sh", "D")]


def test_translate_ignore_and_generated_patterns():
    from sandbox.snapshots.snapshot import is_generated, translate_ignore

    assert translate_ignore("# c\n\n*.log\n/build\n!keep.log\ndocs/out/\n", "") == [
        "*.log", "/build", "!keep.log", "docs/out/"]
    assert translate_ignore("*.tmp\n/only\n!x.tmp\na/b\nd/\n", "sub/dir") == [
        "sub/dir/**/*.tmp", "sub/dir/only", "!sub/dir/**/x.tmp", "sub/dir/a/b",
        "sub/dir/**/d/"]
    for p in ("a/__pycache__/m.pyc", "m.pyc", ".pytest_cache/v/x", "x.egg-info/PKG-INFO",
              ".coverage", ".coverage.host.1", "htmlcov/i.html", "deep/.tox/x"):
        assert is_generated(p), p
    for p in ("__pycache__", "pyc.py", "src/egg-info.py", "coverage.py", "a/.coveragerc"):
        assert not is_generated(p), p
    assert is_generated("out/gen.txt", ["out/*.txt"]) and not is_generated("a/out/gen.txt",
                                                                          ["out/*.txt"])


def test_symlinked_directories_are_never_followed_on_the_host(agent_tree, tmp_path):
    """In the container a symlink to /etc is the container's /etc; on the host it would be
    the host's. Snapshots record the link itself, never what it points to on the host."""
    work, snap = agent_tree
    host_dir = tmp_path / "host-only"
    host_dir.mkdir()
    (host_dir / "m.py").write_text("HOST SECRET\n")
    (host_dir / "new.py").write_text("HOST SECRET\n")
    subprocess.run(["rm", "-rf", str(work / "pkg")], check=True)
    os.symlink(host_dir, work / "pkg")
    os.mkfifo(work / "run.sh.fifo")
    s1 = snap.snapshot()
    got = {c.path: (c.status, c.new_mode) for c in changed_paths(snap.git_dir, snap.base_tree, s1)}
    assert got == {"pkg": ("A", "120000"), "pkg/m.py": ("D", "000000")}
    assert read_blob(snap.git_dir, s1, "pkg") == ("120000", str(host_dir).encode())
    assert "HOST SECRET" not in artifact(snap.git_dir, snap.base_tree, s1)


def test_local_runtime_tree_has_a_working_git_too(task, tmp_path):
    """With the (explicitly chosen, not isolated) local runtime the clone's alternates name
    the base store's host path, so git works there as well."""
    from sandbox.runtimes.local_runtime import LocalRuntime

    with pytest.warns(RuntimeWarning, match="not isolated"):
        runtime = LocalRuntime(run_id="t")
    env, _ctx = _env(task, tmp_path, runtime)
    try:
        assert env.bash("git status --short; git log --oneline | wc -l").strip() == "1"
        assert env.bash("git show HEAD:calc.py").endswith("return a - b\n")
    finally:
        release(env)
