"""SWE-smith tasks start from a branch of the image's repository: the verifier
checks the instance branch out in /testbed before applying the artifact, the agent's reset
checks it out in the rollout's tree before S_0 is taken, and an image without the branch is
a clear error, never a grade of the image's default tree. Live Podman throughout."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest

from tests.conftest import git

pytestmark = pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman")

REPO = "swesmith/me__calc.0123abcd"
IID = "me__calc.0123abcd.func_pm_op_swap__x1"
FETCHED = "me__calc.0123abcd.func_pm_op_swap__x2"  # only as origin/<id> (a plain git fetch)
MISSING = "me__calc.0123abcd.func_pm_remove_cond__zz9"
F2P = ["tests/test_add.py::test_add"]
P2P = ["tests/test_keep.py::test_keep"]
# the stand-in of SWE-smith's `source /opt/miniconda3/bin/activate; conda activate testbed`
ACTIVATE = ('conda() { [ "$1" = activate ] && export CONDA_DEFAULT_ENV="$2" '
            'PATH="/opt/miniconda3/envs/$2/bin:$PATH"; }\n')
PYTEST = '#!/bin/sh\nexec /usr/bin/python3 -m pytest -p no:cacheprovider "$@"\n'
FILES = (("pkg/__init__.py", ""), ("conftest.py", ""),
         ("pkg/calc.py", "def add(a, b):\n    return a + b\n"),
         ("tests/test_add.py",
          "from pkg.calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"),
         ("tests/test_keep.py", "def test_keep():\n    assert True\n"))


def _podman(*args: str) -> str:
    from sandbox.runtimes.podman_runtime import podman_env

    return subprocess.run(["podman", *args], check=True, capture_output=True, text=True,
                          env=podman_env()).stdout.strip()


@pytest.fixture(scope="module")
def smith_image(tmp_path_factory, podman_runtime):
    """An image laid out like a SWE-smith repository image with one instance branch fetched
    in: /testbed on ``main`` (clean), branch ``IID`` = the bug commit + the commit removing
    the FAIL_TO_PASS test file; a conda stand-in at /opt/miniconda3. Returns (image, bug)."""
    from sandbox.images import default_image

    ctx = tmp_path_factory.mktemp("smithctx")
    repo = ctx / "testbed"
    for rel, text in FILES:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "clean")
    git(repo, "checkout", "-q", "-b", IID)
    (repo / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "commit", "-qam", "bug")
    bug = git(repo, "diff", "HEAD~1", "HEAD") + "\n"
    git(repo, "rm", "-q", "tests/test_add.py")
    git(repo, "commit", "-qm", "remove F2P tests")
    git(repo, "update-ref", f"refs/remotes/origin/{FETCHED}", IID)
    git(repo, "checkout", "-q", "main")  # the image's default checkout is NOT the instance
    conda = ctx / "opt" / "miniconda3"
    (conda / "bin").mkdir(parents=True)
    (conda / "bin" / "activate").write_text(ACTIVATE)
    (conda / "envs" / "testbed" / "bin").mkdir(parents=True)
    (conda / "envs" / "testbed" / "bin" / "pytest").write_text(PYTEST)
    (conda / "envs" / "testbed" / "bin" / "pytest").chmod(0o755)
    (ctx / "Containerfile").write_text(
        f"FROM {default_image()}\nCOPY testbed /testbed\nCOPY opt /opt\nWORKDIR /testbed\n")
    digest = hashlib.sha256(json.dumps([default_image(), IID, FETCHED, FILES, ACTIVATE, PYTEST,
                                        bug]).encode()).hexdigest()[:12]
    name = f"localhost/ecredit-test-swesmith:{digest}"
    if subprocess.run(["podman", "image", "exists", name]).returncode != 0:  # built once
        _podman("build", "-q", "--pull=never", "-t", name, str(ctx))
    return name, bug


def _tasks(tmp_path, image: str, bug: str) -> dict:
    """The SWE-smith rows of the image (through the adapter): ``IID``, ``FETCHED`` (the same
    branch content, as a remote-tracking branch only) and one whose branch the image lacks."""
    from eval.tasks.splits import load_tasks

    rows = [{"instance_id": iid, "repo": REPO, "patch": bug, "FAIL_TO_PASS": F2P,
             "PASS_TO_PASS": P2P, "image_name": image, "problem_statement": "add subtracts"}
            for iid in (IID, FETCHED, MISSING)]
    path = tmp_path / "smith.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = {t.instance_id: t for t in load_tasks(f"swesmith:{path}")}
    assert tasks[IID].checkout_base and tasks[IID].base_commit == IID
    assert tasks[IID].repo_dir is None and tasks[IID].image == image
    return tasks


def _trial(runtime, task, artifact: str, trial_id: str):
    from eval.tasks.trialspec import task_trial_spec

    spec = task_trial_spec(task, artifact, trial_id, timeout_s=120)
    assert spec.checkout == task.base_commit
    return runtime.run_trial(spec)


def _grade(runtime, task, artifact: str, trial_id: str) -> dict:
    from eval.evaluation.verification import grade_trial

    r = _trial(runtime, task, artifact, trial_id)
    assert r.exit_class == "ok", r.log
    assert f">>>>> ecredit checkout {task.base_commit} " in r.log
    return grade_trial(task, r, None)


@pytest.mark.podman
def test_verifier_checks_out_the_instance_branch(smith_image, tmp_path, podman_runtime):
    image, bug = smith_image
    task = _tasks(tmp_path, image, bug)[IID]
    gold = _grade(podman_runtime, task, task.patch, "smith-gold")
    assert (gold["resolved"], gold["f2p"], gold["p2p"]) == (
        True, {F2P[0]: "PASSED"}, {P2P[0]: "PASSED"})
    empty = _grade(podman_runtime, task, "", "smith-empty")
    assert empty["resolved"] is False and empty["f2p"] == {F2P[0]: "FAILED"}
    # a branch present only as origin/<id> (an image that ran a plain `git fetch`) works too
    fetched = _grade(podman_runtime, _tasks(tmp_path, image, bug)[FETCHED], task.patch,
                     "smith-fetched")
    assert (fetched["resolved"], fetched["f2p"]) == (True, {F2P[0]: "PASSED"})
    # on main (the image's default checkout) the gold would not even apply: the bug is absent
    assert "return a - b" in task.patch and "return a - b" not in git_show_main(image)


def git_show_main(image: str) -> str:
    return _podman("run", "--rm", "--network", "none", image, "git", "-C", "/testbed", "show",
                   "HEAD:pkg/calc.py")


@pytest.mark.podman
def test_verifier_missing_branch_is_a_clear_infra_error(smith_image, tmp_path, podman_runtime):
    image, bug = smith_image
    task = _tasks(tmp_path, image, bug)[MISSING]
    r = _trial(podman_runtime, task, task.patch, "smith-missing")
    assert r.exit_class == "infra_error" and r.test_exit_code is None
    assert r.error.startswith(f"checkout: no local branch {MISSING} in /testbed (nor origin/"
                              f"{MISSING});"), r.error
    assert "derived image" in r.error and ">>>>> ecredit test-start" not in r.log
    # a pool does not retry it: no retry can add the branch to the image
    from eval.integrity.retry import RetryPolicy
    from eval.tasks.trialspec import task_trial_spec
    from sandbox.trials.pool import VerifierPool
    with VerifierPool(podman_runtime, max_concurrency=1, retry=RetryPolicy(max_retries=2)) as pool:
        (res,) = pool.map([task_trial_spec(task, task.patch, "smith-missing-pool", timeout_s=120)])
    assert res.exit_class == "infra_error" and res.attempts == 1 and res.retried_errors == []
    assert pool.stats["retries"] == 0


@pytest.mark.podman
def test_agent_reset_starts_on_the_branch_and_its_artifact_resolves(smith_image, tmp_path,
                                                                    podman_runtime):
    from ecredit_trl.agent.env import AgentContext, SWEAgentEnv, release
    from eval.evaluation.verification import grade_trial
    from sandbox.snapshots.snapshot import artifact, changed_paths

    image, bug = smith_image
    tasks = _tasks(tmp_path, image, bug)
    ctx = AgentContext(tasks=tasks, runtime=podman_runtime, workroot=str(tmp_path / "wr"))
    try:
        env = SWEAgentEnv(ctx)
        env.reset(instance_id=IID)
        assert env.failure is None, env.failure
        # the branch's tree: the bug, the F2P test removed; git in the tree agrees
        assert (env.workdir / "pkg" / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
        assert not (env.workdir / "tests" / "test_add.py").exists()
        assert env.bash("git rev-parse --abbrev-ref HEAD").strip() == IID
        files = subprocess.run(["git", f"--git-dir={env.snapshot_repo}", "ls-tree", "-r",
                                "--name-only", env.base_tree], capture_output=True, text=True,
                               check=True).stdout.split()
        assert files == ["conftest.py", "pkg/__init__.py", "pkg/calc.py", "tests/test_keep.py"]
        assert env.final_tree == env.base_tree  # the checkout itself is S_0, not an edit
        assert (image, "/testbed", IID) in ctx._image_bases
        env.str_replace("pkg/calc.py", "a - b", "a + b")
        assert [c.path for c in changed_paths(env.snapshot_repo, env.base_tree,
                                              env.final_tree)] == ["pkg/calc.py"]
        patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
        release(env)
        r = _trial(podman_runtime, tasks[IID], patch, "smith-agent")
        assert r.exit_class == "ok", r.log
        g = grade_trial(tasks[IID], r, None)
        assert (g["resolved"], g["f2p"]) == (True, {F2P[0]: "PASSED"})
        # the pilot's / scripted rollouts' S_0 (host-side replay) is the same branch tree
        from ecredit_trl.credit.taskbase import s0_source

        store, commit = s0_source(tasks[IID], tmp_path / "replay")
        assert git(tmp_path, f"--git-dir={store}", "rev-parse", f"{commit}^{{tree}}") \
            == env.base_tree
        # a second rollout: a fresh tree on the branch, the same cached S_0
        env2 = SWEAgentEnv(ctx)
        env2.reset(instance_id=IID)
        assert env2.base_tree == env.base_tree and env2.final_tree == env2.base_tree
        assert "a - b" in (env2.workdir / "pkg" / "calc.py").read_text()
        release(env2)
        env4 = SWEAgentEnv(ctx)  # a branch only as origin/<id>: git makes the local one
        env4.reset(instance_id=FETCHED)
        assert env4.failure is None and env4.base_tree == env.base_tree
        assert env4.bash("git rev-parse --abbrev-ref HEAD").strip() == FETCHED
        release(env4)
        # an image without the instance branch: a clear error at reset, naming the remedy
        from sandbox.workspace.imagetree import ImageTreeError

        env3 = SWEAgentEnv(ctx)
        with pytest.raises(ImageTreeError, match=rf"no local branch {MISSING} in /testbed \(nor .*derived image"):
            env3.reset(instance_id=MISSING)
        release(env3)
    finally:
        ctx.close()
    assert not _podman("ps", "-a", "--filter", f"label=ecredit.run={podman_runtime.run_id}",
                       "--filter", "label=ecredit.role=tree", "--format", "{{.Names}}")


def test_trial_spec_refuses_a_bad_branch_name_and_a_branch_with_an_archive():
    from sandbox.trials.trial import TrialSpec
    with pytest.raises(ValueError, match="checkout: not a branch name"):
        TrialSpec("t1", "localhost/x:1", "true", checkout="-rf")
    with pytest.raises(ValueError, match="checkout: not a branch name"):
        TrialSpec("t1", "localhost/x:1", "true", checkout="a..b")
    with pytest.raises(ValueError, match="checkout: a branch is checked out in an image"):
        TrialSpec("t1", "localhost/x:1", "true", checkout=IID, repo_archive=b"")
    assert TrialSpec("t1", "localhost/x:1", "true", checkout=IID).checkout == IID
