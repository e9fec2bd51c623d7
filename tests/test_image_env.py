"""Agent environments on image-held tasks: the tree is the image's /testbed,
copy-on-write, with its untracked build outputs; commands run in a login shell of the task
image; S_0 is the tree at reset; the artifact applies in a fresh container of the image."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import git

pytestmark = pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman")

CALC = "def add(a, b):\n    return a - b\n"
TESTS = ("from _gen import VALUE\nfrom calc import add\n\n\n"
         "def test_add():\n    assert add(2, 3) == 5\n\n\n"
         "def test_gen():\n    assert VALUE == 42\n")
EVAL = ("#!/bin/bash\n. /etc/profile\ncd /testbed\necho '>>>>> Start Test Output'\n"
        "python -m pytest -rA -p no:cacheprovider test_calc.py\n"
        "echo \">>>>> Test Exit Code: $?\"\necho '>>>>> End Test Output'\n")
IID = "img__calc-1"


def _podman(*args: str) -> str:
    from sandbox.runtimes.podman_runtime import podman_env

    return subprocess.run(["podman", *args], check=True, capture_output=True, text=True,
                          env=podman_env()).stdout.strip()


@pytest.fixture(scope="module")
def task_image(tmp_path_factory, podman_runtime):
    """A task image built from the offline image: /testbed = a git repo with history, a
    .gitignored generated module its tests import, an untracked (not ignored) file, and an
    environment dir put on PATH by /etc/profile.d (the SWE-bench way)."""
    from sandbox.images import default_image

    ctx = tmp_path_factory.mktemp("imgctx")
    repo = ctx / "testbed"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / ".gitignore").write_text("_gen.py\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "pristine")
    (repo / "calc.py").write_text(CALC)
    (repo / "test_calc.py").write_text(TESTS)
    for rel in ("pkg/__init__.py", "pkg/util.py", "pkg/sub/deep.py", "docs/guide.txt",
                "docs/more/a.txt"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(f"# {rel}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (repo / "_gen.py").write_text("VALUE = 42\n")  # a build output: ignored, tests need it
    (repo / "NOTES.txt").write_text("untracked, not ignored\n")
    env = ctx / "opt" / "testenv" / "bin"
    env.mkdir(parents=True)
    (env / "python").write_text('#!/bin/sh\nexec /usr/bin/python3 "$@"\n')
    (env / "python").chmod(0o755)
    (ctx / "testenv.sh").write_text("echo noise from the profile\n"
                                    "export PATH=/opt/testenv/bin:$PATH\n")
    # SWE-bench images activate `testbed` from /root/.bashrc (sourced by ~/.profile)
    (ctx / "bashrc").write_text("export ECREDIT_ACTIVE_ENV=testbed\n")
    (ctx / "Containerfile").write_text(
        f"FROM {default_image()}\nCOPY testbed /testbed\nCOPY opt /opt\n"
        "COPY testenv.sh /etc/profile.d/testenv.sh\nCOPY bashrc /root/.bashrc\n"
        "WORKDIR /testbed\n")
    digest = hashlib.sha256(default_image().encode() + b"".join(
        p.read_bytes() for p in sorted(ctx.rglob("*")) if p.is_file() and ".git" not in
        p.parts)).hexdigest()[:12]
    name = f"localhost/ecredit-test-imagetask:{digest}"
    _podman("build", "-q", "--pull=never", "-t", name, str(ctx))
    return name, git(repo, "rev-parse", "HEAD")


def _task(image: str, base: str):
    from eval.tasks.schema import task_from_row

    row = {"instance_id": IID, "repo": "local/calc", "base_commit": base,
           "problem_statement": "add subtracts", "patch": "", "test_patch": "", "version": "0",
           "environment_setup_commit": base, "FAIL_TO_PASS": ["test_calc.py::test_add"],
           "PASS_TO_PASS": ["test_calc.py::test_gen"], "image": image, "eval_script": EVAL,
           "log_parser": "parse_log_pytest"}
    t = task_from_row(row, 1)
    assert t.repo_dir is None
    return t


@pytest.fixture
def task(task_image):
    return _task(*task_image)


@pytest.fixture
def ctx(task, tmp_path, podman_runtime):
    from ecredit_trl.agent.env import AgentContext

    c = AgentContext(tasks={IID: task}, runtime=podman_runtime, workroot=str(tmp_path / "wr"))
    yield c
    c.close()


def _trial(runtime, task, artifact: str, trial_id: str) -> dict:
    from eval.evaluation.verification import grade_trial
    from eval.tasks.trialspec import task_trial_spec

    r = runtime.run_trial(task_trial_spec(task, artifact, trial_id, timeout_s=120))
    assert r.exit_class == "ok", r.log
    return grade_trial(task, r, None)


def _mounted(path: Path) -> bool:
    return f" {path} " in Path("/proc/self/mountinfo").read_text()


def _tree_containers(run_id: str) -> list[str]:
    return _podman("ps", "-a", "--filter", f"label=ecredit.run={run_id}", "--filter",
                   "label=ecredit.role=tree", "--format", "{{.Names}}").split()


@pytest.mark.podman
def test_image_task_rollout_tree_env_artifact_and_release(ctx, task, podman_runtime):
    from ecredit_trl.agent.env import SWEAgentEnv, release
    from sandbox.snapshots.snapshot import artifact, changed_paths, read_blob

    env = SWEAgentEnv(ctx)
    env.reset(instance_id=IID)
    assert env.failure is None, env.failure
    tree, mountpoint = env.image_tree, env.image_tree.mountpoint
    assert _mounted(mountpoint) and _tree_containers(podman_runtime.run_id) == [tree.name]
    assert tree.name in podman_runtime._live  # runtime.close() / `sandbox gc` remove it
    # the image's tree with everything in it: the ignored build output, the untracked file
    assert (env.workdir / "_gen.py").read_text() == "VALUE = 42\n"
    assert (env.workdir / "NOTES.txt").is_file() and (env.workdir / ".git").is_dir()
    # S_0 = the tree at reset: tracked + untracked-not-ignored files, not the ignored one
    files = subprocess.run(["git", f"--git-dir={env.snapshot_repo}", "ls-tree", "-r",
                            "--name-only", env.base_tree], capture_output=True, text=True,
                           check=True).stdout.split()
    assert files == [".gitignore", "NOTES.txt", "calc.py", "docs/guide.txt", "docs/more/a.txt",
                     "pkg/__init__.py", "pkg/sub/deep.py", "pkg/util.py", "test_calc.py"]
    # the image's environment in a login shell; its history is not the agent's:
    # one commit, S_0, on the image's branch, and a clean status (the untracked file
    # is part of S_0, the ignored build output stays ignored)
    assert env.bash("which python").strip() == "/opt/testenv/bin/python"
    assert env.bash("python -c 'import _gen; print(_gen.VALUE)'").strip() == "42"
    assert env.bash("echo $ECREDIT_ACTIVE_ENV $HOME").split() == ["testbed", "/root"]
    assert env.bash("git log --all --format=%s").splitlines() == ["S_0: the tree at reset"]
    assert env.bash("git status --porcelain; git branch --show-current").split() == ["main"]
    assert env.trees == [env.base_tree] * 5  # nothing changed the tree
    out = env.str_replace("calc.py", "a - b", "a + b")
    assert "ERROR" not in out
    assert env.bash("python -m pytest -q -p no:cacheprovider test_calc.py").count("passed")
    assert [c.path for c in changed_paths(env.snapshot_repo, env.base_tree,
                                          env.final_tree)] == ["calc.py"]
    assert read_blob(env.snapshot_repo, env.final_tree, "calc.py")[1] == b"def add(a, b):\n" \
        b"    return a + b\n"
    patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
    g = _trial(podman_runtime, task, patch, "img-fix")
    assert (g["resolved"], g["f2p"], g["p2p"]) == (
        True, {"test_calc.py::test_add": "PASSED"}, {"test_calc.py::test_gen": "PASSED"})
    assert _trial(podman_runtime, task, "", "img-empty")["resolved"] is False
    env.submit()
    release(env)
    assert not _mounted(mountpoint) and _tree_containers(podman_runtime.run_id) == []
    assert tree.name not in podman_runtime._live
    assert not _podman("ps", "-a", "--filter", f"label=ecredit.run={podman_runtime.run_id}",
                       "--format", "{{.Names}}")


@pytest.mark.podman
def test_agent_breaking_git_and_build_outputs_keeps_true_bytes(ctx, task, podman_runtime):
    from ecredit_trl.agent.env import SWEAgentEnv, release
    from sandbox.snapshots.snapshot import artifact, changed_paths

    env = SWEAgentEnv(ctx)
    env.reset(instance_id=IID)
    first = env.image_tree.name
    base_store = ctx._image_bases[(task.image, "/testbed")].store
    # a same-size edit with the old mtime put back is still seen (ctime, not mtime+size)
    env.bash("m=$(stat -c %Y calc.py); sed -i 's/a - b/a + b/' calc.py; touch -d @$m calc.py")
    env.bash("rm -rf .git _gen.py NOTES.txt; echo 'VALUE = 0' > _gen.py")
    env.bash("printf 'x' > new.txt")
    changed = {c.path: c.status for c in changed_paths(env.snapshot_repo, env.base_tree,
                                                        env.final_tree)}
    assert changed == {"calc.py": "M", "NOTES.txt": "D", "new.txt": "A"}
    patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
    # the ignored build output the agent broke is not part of the artifact: the verifier's
    # fresh container has the image's own, as for repo_dir tasks (ignored files never count)
    g = _trial(podman_runtime, task, patch, "img-broken")
    assert g["resolved"] is True, g
    release(env)
    # a second rollout: a fresh tree from the image, the same cached base
    env2 = SWEAgentEnv(ctx)
    env2.reset(instance_id=IID)
    assert env2.image_tree.name != first and (env2.workdir / ".git").is_dir()
    assert (env2.workdir / "calc.py").read_text() == CALC
    assert ctx._image_bases[(task.image, "/testbed")].store == base_store
    assert env2.view("calc.py").count("a - b") == 1
    assert env2.final_tree == env2.base_tree == env.base_tree
    release(env2)
    assert _tree_containers(podman_runtime.run_id) == []


@pytest.mark.podman
def test_disk_budget_on_an_image_tree_counts_what_the_rollout_wrote(task, tmp_path,
                                                                    podman_runtime):
    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release

    ctx = AgentContext(tasks={IID: task}, runtime=podman_runtime, workroot=str(tmp_path),
                       tree_budget_bytes=1_000_000)
    env = SWEAgentEnv(ctx)
    env.reset(instance_id=IID)
    # the image's files are not the rollout's: only the upper layer (empty) and the store
    assert env.usage_at_reset < 200_000
    env.bash("head -c 600000 /dev/zero > a.bin")
    assert env.failure is None
    env.bash("head -c 600000 /dev/zero > b.bin")
    assert env.failure is not None and env.failure[0] == "disk_budget", env.failure
    assert env.image_tree is None and _tree_containers(podman_runtime.run_id) == []
    release(env)
    ctx.close()


@pytest.mark.podman
def test_snapshots_from_the_upper_layer_equal_a_full_scan(ctx, task, podman_runtime):
    """Snapshots of an image tree look only at what the overlay's upper layer holds; after
    renames (redirected dirs), deleted-and-recreated dirs (opaque), mode changes, symlinks,
    deletions and new trees they equal a snapshot that scans the whole tree."""
    from ecredit_trl.agent.env import SWEAgentEnv, release
    from sandbox.snapshots.snapshot import Snapshotter, changed_paths

    env = SWEAgentEnv(ctx)
    env.reset(instance_id=IID)
    base = ctx._image_bases[(task.image, "/testbed")]

    def full_scan() -> str:
        with Snapshotter(env.workdir, base=base.commit, objects_from=base.store) as snap:
            tree = snap.snapshot()
            return tree if snap.tree_of(tree) else ""

    env.bash("mv pkg pkg2")
    assert env.image_tree.changes("/testbed") is not None
    assert env.final_tree == full_scan()
    assert {c.path for c in changed_paths(env.snapshot_repo, env.base_tree,
                                          env.final_tree)} == {
        "pkg/__init__.py", "pkg/util.py", "pkg/sub/deep.py",
        "pkg2/__init__.py", "pkg2/util.py", "pkg2/sub/deep.py"}
    for cmd in ("rm -rf docs && mkdir -p docs && echo new > docs/x.txt", "chmod +x calc.py",
                "echo '# more' >> test_calc.py", "rm NOTES.txt", "mkdir -p n/s && echo 1 > n/s/f",
                "ln -s calc.py link", "mv pkg2/sub pkg2/sub2 && rm pkg2/util.py",
                "echo VALUE = 1 > _gen.py && mkdir -p __pycache__ && touch __pycache__/x.pyc",
                "rm -rf n && echo back > NOTES.txt"):
        out = env.bash(cmd)
        assert "exit code" not in out, (cmd, out)
    assert env.failure is None
    assert env.final_tree == full_scan()
    got = {c.path: c.status for c in changed_paths(env.snapshot_repo, env.base_tree,
                                                   env.final_tree)}
    assert got == {"NOTES.txt": "M", "calc.py": "X", "docs/guide.txt": "D", "docs/more/a.txt": "D",
                   "docs/x.txt": "A", "link": "A", "pkg/__init__.py": "D", "pkg/util.py": "D",
                   "pkg/sub/deep.py": "D", "pkg2/__init__.py": "A", "pkg2/sub2/deep.py": "A",
                   "test_calc.py": "M"}
    release(env)


def test_image_task_needs_a_local_podman_runtime(tmp_path):
    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv
    from sandbox.runtimes.local_runtime import LocalRuntime

    task = _task("localhost/no-such-image:1", "0" * 40)
    ctx = AgentContext(tasks={IID: task}, runtime=LocalRuntime(), workroot=str(tmp_path))
    with pytest.raises(ValueError, match="runtime: task img__calc-1 is held in image"):
        SWEAgentEnv(ctx).reset(instance_id=IID)
