"""The answer is not readable in the task image's git history (design page, "Threat model").

Task images whose history holds the fix in every place git keeps things: a branch, an
annotated tag, a remote-tracking ref with its ``origin`` remote and ``FETCH_HEAD``, only the
reflog (``HEAD`` reset back to the base, ``ORIG_HEAD``), a stash, notes, packed refs, a
replace ref, grafts / shallow files, an unreachable loose object, ``.git/modules``, a linked
worktree and an alternate object store outside the workdir, a second clone inside the
workdir; a ``.git`` *file* naming a git dir elsewhere with the fix as ``HEAD~1`` (the
SWE-smith "fix committed, then reverted" layout); a SWE-smith instance branch whose parent
is the unbroken original, checked out with ``checkout_base``; a stand-in image task
(:mod:`eval.tasks.bundled.imagetasks`) with its own gold fix committed, reverted, branched, tagged
and on ``origin/main``; and a ``repo_dir`` task whose repository holds the fix too. Each fix line carries a marker. In a live agent session no
command prints a marker (git over every ref, reflog, object id the image holds; every
loose object and pack file anywhere in the container's file system; a grep), while the
same hunt in a plain container of the image finds every one (so the test can fail). Git
still works inside, and the unchanged verifier still sees the image's git metadata.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import shutil
import subprocess

import pytest

from tests.conftest import git

pytestmark = pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman")

MARK = "ECREDIT-LEAK-"
CALC_BUG = "def add(a, b):\n    return a - b\n"
TEST_CALC = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
TEST_META = ("import subprocess\n\n\ndef _git(*a):\n    return subprocess.run(['git', *a], "
             "capture_output=True, text=True, check=True).stdout.strip()\n\n\n"
             "def test_git_metadata():\n    # what setuptools_scm / a version test reads\n"
             "    assert _git('describe', '--tags', '--exact-match') == 'v1.0'\n"
             "    assert _git('rev-parse', 'HEAD') == _git('rev-parse', 'v1.0^{commit}')\n")
EVAL = ("#!/bin/bash\ncd /testbed\necho '>>>>> Start Test Output'\n"
        "python3 -m pytest -rA -p no:cacheprovider test_calc.py test_meta.py\n"
        "echo \">>>>> Test Exit Code: $?\"\necho '>>>>> End Test Output'\n")
GOLD = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
        " def add(a, b):\n-    return a - b\n+    return a + b\n")

# "future" layout: HEAD = main = the base, the fix everywhere else (built inside the image)
FUTURE_SH = r"""set -euo pipefail
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@e
export GIT_CONFIG_NOSYSTEM=1 HOME=/tmp
fix() { printf 'def add(a, b):\n    return a + b  # ECREDIT-LEAK-%s\n' "$1" > calc.py; }
commit_fix() { git checkout -q -b "$1" "$B"; fix "$2"; git commit -qam "work $1"; }
mkdir -p /testbed && cd /testbed && git init -q -b main
cp /ctx/calc.py /ctx/test_calc.py /ctx/test_meta.py . && git add -A && git commit -qm base
B=$(git rev-parse HEAD) && git tag -a v1.0 -m release
commit_fix fix BRANCH
commit_fix tagged TAG && git tag -a v2.0 -m next && git checkout -q main && git branch -D tagged -q
commit_fix remote REMOTE && git checkout -q main
git remote add origin https://example.invalid/calc.git
git update-ref refs/remotes/origin/main remote && git update-ref refs/remotes/origin/HEAD remote
printf '%s\t\tbranch main of https://example.invalid/calc\n' "$(git rev-parse remote)" > .git/FETCH_HEAD
git branch -D remote -q
commit_fix packed PACKED && git checkout -q main && git pack-refs --all
git checkout -q main && fix REFLOG && git commit -qam later && git reset -q --hard HEAD~1
git worktree add -q /opt/wt-fix fix
fix STASH && git stash -q
git notes add -m 'ECREDIT-LEAK-NOTES' HEAD
x=$(printf 'placeholder\n' | git hash-object -w --stdin)
y=$(printf 'ECREDIT-LEAK-REPLACE\n' | git hash-object -w --stdin)
git replace "$x" "$y"
git repack -a -d -q
printf 'ECREDIT-LEAK-LOOSE\n' | git hash-object -w --stdin >/dev/null
echo "$(git rev-parse HEAD) $(git rev-parse fix)" > .git/info/grafts
git rev-parse fix > .git/shallow
git clone -q --bare /testbed .git/modules/sub
git clone -q /testbed /tmp/alt && (cd /tmp/alt && fix ALTERNATE && git commit -qam alt)
git init -q --bare /opt/altstore && git -C /opt/altstore fetch -q /tmp/alt main:refs/heads/x
echo /opt/altstore/objects >> .git/objects/info/alternates
git update-ref refs/heads/alt "$(git -C /opt/altstore rev-parse x)" && rm -rf /tmp/alt
mkdir -p vendor && git clone -q --no-local /testbed vendor/mirror
test "$(git status --porcelain --untracked-files=no)" = "" && test "$(cat calc.py)" = "$(cat /ctx/calc.py)"
"""
FUTURE_MARKS = ("BRANCH", "TAG", "REMOTE", "PACKED", "REFLOG", "STASH", "NOTES", "REPLACE",
                "LOOSE", "ALTERNATE")

# SWE-smith "fix committed, then reverted": HEAD~1 is the fix; .git is a file naming /srv
REVERT_SH = r"""set -euo pipefail
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@e
export GIT_CONFIG_NOSYSTEM=1 HOME=/tmp
mkdir -p /testbed && cd /testbed && git init -q -b main --separate-git-dir=/srv/calc.git
cp /ctx/calc.py /ctx/test_calc.py /ctx/test_meta.py . && git add -A && git commit -qm base
printf 'def add(a, b):\n    return a + b  # ECREDIT-LEAK-PARENT\n' > calc.py
git commit -qam fix && git revert --no-edit HEAD >/dev/null && git tag -a v1.0 -m release
echo 'gitdir: ../srv/calc.git' > .git && git status -s >/dev/null
test -f .git && test "$(cat calc.py)" = "$(cat /ctx/calc.py)"
"""

SMITH_IID = "me__calc.0123abcd.func_pm_op_swap__h1"
# SWE-smith instance branch: its parent (main, the image's checkout) is the original code
SMITH_SH = rf"""set -euo pipefail
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@e
export GIT_CONFIG_NOSYSTEM=1 HOME=/tmp
mkdir -p /testbed && cd /testbed && git init -q -b main
printf 'def add(a, b):\n    return a + b  # ECREDIT-LEAK-ORIGINAL\n' > calc.py
cp /ctx/test_calc.py /ctx/test_meta.py . && git add -A && git commit -qm clean
git checkout -q -b {SMITH_IID} && cp /ctx/calc.py calc.py && git commit -qam bug
git rm -q test_calc.py && git commit -qm 'remove F2P tests' && git tag -a v1.0 -m release
git checkout -q main
"""


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    from sandbox.runtimes.podman_runtime import podman_env

    proc = subprocess.run(["podman", *args], capture_output=True, text=True,
                          env=podman_env(), timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {args[:2]} failed: {proc.stderr[-2000:]}")
    return proc


def _build(tmp_path_factory, kind: str, script: str) -> str:
    """A task image (FROM the offline sandbox image) whose /testbed is made by ``script``
    in a RUN step; built once (the tag hashes everything it is made of)."""
    from sandbox.images import default_image

    ctx = tmp_path_factory.mktemp(f"leak-{kind}")
    for name, text in (("calc.py", CALC_BUG), ("test_calc.py", TEST_CALC),
                       ("test_meta.py", TEST_META), ("setup.sh", script)):
        (ctx / name).write_text(text)
    (ctx / "Containerfile").write_text(
        f"FROM {default_image()}\nCOPY . /ctx\nRUN bash /ctx/setup.sh && rm -rf /ctx\n"
        "WORKDIR /testbed\n")
    tag = hashlib.sha256(json.dumps([default_image(), script, CALC_BUG, TEST_CALC,
                                     TEST_META]).encode()).hexdigest()[:12]
    name = f"localhost/ecredit-test-leak-{kind}:{tag}"
    if _podman("image", "exists", name, check=False).returncode != 0:
        _podman("build", "-q", "--pull=never", "--network=none", "--ulimit",
                "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "-t", name, str(ctx))
    return name


@pytest.fixture(scope="module")
def leak_images(tmp_path_factory, podman_runtime) -> dict[str, str]:
    return {kind: _build(tmp_path_factory, kind, script) for kind, script in
            (("future", FUTURE_SH), ("revert", REVERT_SH), ("smith", SMITH_SH))}


# -- the hunt: everything an agent could try, printing only what carries a marker ----------

HUNT_PY = r"""
import os, subprocess, sys, zlib
mark = sys.argv[1].encode()
skip = ('/proc', '/sys', '/dev', '/usr')
for top, dirs, files in os.walk('/'):
    if top.startswith(skip):
        dirs[:] = []
        continue
    for f in files:
        p = os.path.join(top, f)
        try:
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            if f.endswith('.pack'):
                d = '/tmp/hunt-' + str(abs(hash(p)))
                subprocess.run(['git', 'init', '-q', '--bare', d], check=True)
                with open(p, 'rb') as fh:
                    subprocess.run(['git', '-C', d, 'unpack-objects', '-q'], stdin=fh)
                out = subprocess.run(['git', '-C', d, 'cat-file', '--batch-all-objects',
                                      '--batch'], capture_output=True).stdout
            else:
                with open(p, 'rb') as fh:
                    raw = fh.read(4 << 20)
                out = raw
                if raw[:1] == b'x':
                    try:
                        out = raw + zlib.decompress(raw)
                    except zlib.error:
                        pass
            for line in out.splitlines():
                if mark in line:
                    print('FOUND', p, line[:120].decode(errors='replace'))
        except OSError:
            pass
"""

GIT_HUNT = " ; ".join([
    "git log --all --oneline -p", "git log -g --all -p", "git reflog", "git stash list -p",
    "git notes list", "git notes show", "git show-ref", "git branch -a", "git tag -l -n",
    "git remote -v", "git worktree list",
    "git for-each-ref --format='%(objectname)' | xargs -r git show",
    "git cat-file --batch-all-objects --batch",
    "git fsck --lost-found --unreachable --dangling; cat .git/lost-found/*/* ",
    "git fsck --unreachable 2>/dev/null | awk '{print $3}' | xargs -r -n1 git cat-file -p",
    "cat .git/packed-refs .git/FETCH_HEAD .git/ORIG_HEAD .git/shallow .git/info/grafts",
    "for m in .git/modules/*; do git --git-dir=$m log --all -p; done",
    "git -C vendor/mirror log --all -p", "git --git-dir=/srv/calc.git log --all -p",
    "git --git-dir=/opt/altstore log --all -p", "cat /opt/wt-fix/calc.py",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES=/opt/altstore/objects git log --all -p",
])


def _hunt_script(object_ids: list[str], needle: str = MARK) -> str:
    """One bash script: every git command above, ``git cat-file -p`` of every object id
    the image holds, a grep of the file system (``/usr`` left out: distribution files),
    and the loose-object / pack walk; only lines holding ``needle`` (or the walk's FOUND
    lines) come out."""
    show = "\n".join(f"git cat-file -p {o}" for o in object_ids)
    q = shlex.quote(needle)
    return (f"cd /testbed\n{{ {GIT_HUNT} ; }} 2>&1 | grep -aF -- {q}\n"
            f"{{\n{show}\n}} 2>&1 | grep -aF -- {q}\n"
            f"grep -rIF -- {q} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
            "--exclude-dir=usr 2>/dev/null\n"
            f"python3 - {q} <<'EOF'\n{HUNT_PY}\nEOF\ntrue\n")


def _image_objects_and_control(image: str, needle: str = MARK) -> tuple[list[str], str]:
    """Every object id the image's repository holds (alternates included), and what the
    hunt prints in a plain container of the image (the positive control)."""
    ids = _podman("run", "--rm", "--network", "none", image, "bash", "-c",
                  "cd /testbed && git cat-file --batch-all-objects --batch-check='%(objectname)'"
                  ).stdout.split()
    assert len(ids) > 5
    control = _podman("run", "--rm", "--network", "none", image, "bash", "-c",
                      _hunt_script(ids, needle)).stdout
    return ids, control


def _found(out: str) -> set[str]:
    return {w[len(MARK):].rstrip("\"'\\,.;:)") for w in out.replace("\\n", " ").split()
            if w.startswith(MARK) and len(w) > len(MARK)}


def _git_still_works(env, base_message: str = "S_0: the tree at reset") -> None:
    """status, diff, log, stash, checkout -- f, commit inside the agent's container."""
    assert env.bash("git status --porcelain").strip() == ""
    out = env.bash("echo '# x' >> calc.py && git diff --stat && git stash -q && "
                   "git status --porcelain && git stash pop -q && git diff --name-only")
    assert "calc.py | 1 +" in out and out.strip().endswith("calc.py"), out
    out = env.bash("git checkout -- calc.py && git status --porcelain && echo n > new.txt && "
                   "git add new.txt && git commit -qm agent && git log --format=%s")
    assert out.splitlines() == ["agent", base_message], out


def _agent_env(tasks: dict, tmp_path, runtime):
    from ecredit_trl.agent.env import AgentContext

    return AgentContext(tasks=tasks, runtime=runtime, workroot=str(tmp_path / "wr"),
                        bash_timeout_s=180, max_output_chars=200_000)


def _image_task(image: str, iid: str, base: str = "HEAD"):
    from eval.tasks.schema import task_from_row

    return task_from_row({
        "instance_id": iid, "repo": "local/calc", "base_commit": base,
        "problem_statement": "add subtracts", "patch": GOLD, "test_patch": "", "version": "0",
        "environment_setup_commit": base, "FAIL_TO_PASS": ["test_calc.py::test_add"],
        "PASS_TO_PASS": ["test_meta.py::test_git_metadata"], "image": image,
        "eval_script": EVAL, "log_parser": "parse_log_pytest"}, 1)


def _smith_task(image: str, tmp_path):
    from eval.tasks.splits import load_tasks

    path = tmp_path / "smith.jsonl"
    path.write_text(json.dumps({
        "instance_id": SMITH_IID, "repo": "swesmith/me__calc.0123abcd", "patch": GOLD,
        "FAIL_TO_PASS": ["test_calc.py::test_add"], "PASS_TO_PASS": [],
        "image_name": image, "problem_statement": "add subtracts"}) + "\n")
    (task,) = load_tasks(f"swesmith:{path}")
    assert task.checkout_base and task.base_commit == SMITH_IID
    return task


CASES = {"future": FUTURE_MARKS, "revert": ("PARENT",), "smith": ("ORIGINAL",)}


@pytest.mark.podman
@pytest.mark.parametrize("kind", sorted(CASES))
def test_no_agent_command_prints_the_fix(kind, leak_images, tmp_path, podman_runtime):
    from ecredit_trl.agent.env import SWEAgentEnv, release
    from sandbox.snapshots.snapshot import changed_paths

    image = leak_images[kind]
    ids, control = _image_objects_and_control(image)
    # the control: a plain container of the image shows every marker
    assert _found(control) >= set(CASES[kind]), control[-3000:]
    task = (_smith_task(image, tmp_path) if kind == "smith"
            else _image_task(image, f"leak__calc-{kind}"))
    ctx = _agent_env({task.instance_id: task}, tmp_path, podman_runtime)
    env = SWEAgentEnv(ctx)
    try:
        env.reset(instance_id=task.instance_id)
        assert env.failure is None, env.failure
        assert env.bash("ls -A .git").split() == [
            "HEAD", "config", "index", "info", "objects", "refs"]
        out = env.bash(_hunt_script(ids))
        assert MARK not in out, out[-3000:]
        # only S_0: one commit, the image's branch (SWE-smith: the instance branch), no refs
        (base,) = [v for k, v in ctx._image_bases.items() if k[0] != "lock"]
        assert env.bash("git rev-list --all --reflog").split() == [base.commit]
        branch = SMITH_IID if kind == "smith" else "main"
        assert env.bash("git for-each-ref --format='%(refname)'").split() == [
            f"refs/heads/{branch}"]
        assert env.bash("git describe --tags 2>&1; true").startswith("fatal")
        _git_still_works(env)
        assert {c.path for c in changed_paths(env.snapshot_repo, env.base_tree,
                                              env.final_tree)} == {"new.txt"}
        # deleting the agent's .git uncovers nothing: overlayfs puts a whiteout there
        out = env.bash("rm -rf .git && ls -A | grep -cx .git; git log --all 2>&1 | head -1")
        assert out.split("\n")[0] == "0" and "not a git repository" in out, out
    finally:
        release(env)
        ctx.close()


@pytest.mark.podman
def test_unchanged_verifier_still_reads_git_metadata(leak_images, tmp_path, podman_runtime):
    """The verifier's fresh container of the image keeps the image's .git: a test reading
    ``git describe`` / ``git rev-parse HEAD`` passes there, for the gold patch and for an
    agent's artifact made in a session whose repository had no tags at all."""
    from ecredit_trl.agent.env import SWEAgentEnv, release
    from eval.evaluation.verification import grade_trial
    from eval.tasks.trialspec import task_trial_spec
    from sandbox.snapshots.snapshot import artifact

    task = _image_task(leak_images["future"], "leak__calc-verifier")

    def grade(patch: str, tid: str) -> dict:
        r = podman_runtime.run_trial(task_trial_spec(task, patch, tid, timeout_s=120))
        assert r.exit_class == "ok", r.log
        return grade_trial(task, r, None)

    gold = grade(GOLD, "leak-gold")
    assert (gold["resolved"], gold["f2p"], gold["p2p"]) == (
        True, {"test_calc.py::test_add": "PASSED"}, {"test_meta.py::test_git_metadata": "PASSED"})
    ctx = _agent_env({task.instance_id: task}, tmp_path, podman_runtime)
    env = SWEAgentEnv(ctx)
    try:
        env.reset(instance_id=task.instance_id)
        env.str_replace("calc.py", "a - b", "a + b")
        # in the agent's repository the metadata test fails (no tags): the cost of S_0 only
        assert "1 failed, 1 passed" in env.bash("python3 -m pytest -q -p no:cacheprovider "
                                                "test_calc.py test_meta.py")
        patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
    finally:
        release(env)
        ctx.close()
    assert "-    return a - b\n+    return a + b\n" in patch
    mine = grade(patch, "leak-agent")
    assert (mine["resolved"], mine["p2p"]) == (True, {"test_meta.py::test_git_metadata": "PASSED"})


@pytest.mark.podman
def test_repo_dir_task_shows_only_its_base(tmp_path, podman_runtime):
    """A repo_dir task whose repository holds the fix as HEAD~1, on a branch, a tag, in the
    reflog and a stash: the agent's repository has one commit, no remote, no packed refs,
    no reflog, and none of the repository's objects beyond the base tree."""
    from ecredit_trl.agent.env import SWEAgentEnv, release
    from sandbox.images import default_image
    from tests.conftest import AgentTask

    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # ECREDIT-LEAK-PARENT\n")
    (repo / "test_calc.py").write_text(TEST_CALC)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "pristine")
    git(repo, "tag", "-a", "v2", "-m", "fixed")
    (repo / "calc.py").write_text(CALC_BUG)
    git(repo, "commit", "-qam", "base")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "fix")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # ECREDIT-LEAK-BRANCH\n")
    git(repo, "commit", "-qam", "fix")
    git(repo, "checkout", "-q", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # ECREDIT-LEAK-STASH\n")
    git(repo, "stash", "-q")
    ids = git(repo, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)").split()
    control = git(repo, "log", "--all", "-p", "-m")
    assert _found(control) == {"PARENT", "BRANCH", "STASH"}  # the repository holds them all
    task = AgentTask("leak__repo-1", str(repo), base, default_image())
    ctx = _agent_env({task.instance_id: task}, tmp_path, podman_runtime)
    env = SWEAgentEnv(ctx)
    try:
        env.reset(instance_id=task.instance_id)
        assert env.failure is None, env.failure
        assert env.bash("ls -A .git; git remote").split() == [
            "HEAD", "config", "index", "info", "objects", "refs"]
        out = env.bash(_hunt_script(ids))
        assert MARK not in out, out[-3000:]
        assert env.bash("git rev-list --all --reflog | wc -l").strip() == "1"
        assert env.bash("git log --format=%s").strip() == "base"
        _git_still_works(env, "base")
    finally:
        release(env)
        ctx.close()


def test_survey_finds_git_data_inside_and_outside_the_workdir(tmp_path):
    """Unit level: where an image keeps git data, read from its files (no git runs)."""
    from sandbox.workspace.imagegit import survey

    root = tmp_path / "root"
    (root / "srv" / "calc.git" / "objects" / "info").mkdir(parents=True)
    (root / "srv" / "calc.git" / "HEAD").write_text("ref: refs/heads/feature/x\n")
    (root / "srv" / "calc.git" / "objects" / "info" / "alternates").write_text(
        "# a comment\n/opt/store/objects\n../../shared/objects\n/gone/objects\n")
    (root / "opt" / "store" / "objects" / "info").mkdir(parents=True)
    (root / "opt" / "store" / "objects" / "info" / "alternates").write_text("/opt/deep/objects\n")
    (root / "opt" / "deep" / "objects").mkdir(parents=True)
    (root / "srv" / "shared" / "objects").mkdir(parents=True)
    wt = root / "srv" / "calc.git" / "worktrees" / "fixed"
    wt.mkdir(parents=True)
    (wt / "gitdir").write_text("/opt/fixed-tree/.git\n")
    (root / "opt" / "fixed-tree").mkdir()
    (root / "testbed" / "vendor" / "m" / ".git").mkdir(parents=True)
    (root / "testbed" / "sub").mkdir()
    (root / "testbed" / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n")
    (root / "testbed" / ".git").write_text("gitdir: ../srv/calc.git\n")
    got = survey(root, "/testbed")
    assert got.branch == "feature/x"
    assert got.nested == ("sub/.git", "vendor/m/.git")
    # /gone/objects is absent from the image: nothing to mask there
    assert got.outside == ("/opt/deep/objects", "/opt/fixed-tree", "/opt/store/objects",
                           "/srv/calc.git", "/srv/shared/objects")
    (root / "testbed" / ".git").write_text("gitdir: /\n")
    with pytest.raises(ValueError, match="workdir: git data of the repository at /testbed "
                                         "lies in /, an ancestor"):
        survey(root, "/testbed")


# -- a stand-in image task (eval.tasks.bundled.imagetasks) with its own gold fix in its history --

DERIVED_SH = r"""set -euo pipefail
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@e
export GIT_CONFIG_NOSYSTEM=1 HOME=/tmp
cd /testbed && B=$(git rev-parse HEAD)
git apply /ctx/gold.patch && git commit -qam 'upstream fix'
git tag -a v9.9 -m future && git branch future
git remote add origin https://example.invalid/x.git && git update-ref refs/remotes/origin/main HEAD
git revert --no-edit HEAD >/dev/null
test -z "$(git diff "$B" HEAD)" && test -z "$(git status --porcelain --untracked-files=no)"
"""


@pytest.mark.podman
def test_stand_in_image_task_with_its_fix_in_history(tmp_path_factory, tmp_path,
                                                     podman_runtime):
    """The issue's attack on a stand-in image task: its gold fix committed then reverted
    (``HEAD~1``, the SWE-smith layout), and on a branch, a tag and ``origin/main``. The
    line the fix adds is printed by a plain container, never in the agent's session; the
    verifier, unchanged, grades the gold patch and the agent's artifact on that image."""
    from ecredit_trl.agent.env import SWEAgentEnv, release
    from eval.evaluation.verification import grade_trial
    from eval.tasks.bundled.imagetasks import ensure_image_tasks
    from eval.tasks.trialspec import task_trial_spec
    from sandbox.snapshots.snapshot import artifact

    base_task = ensure_image_tasks()[0]
    minus, plus = ([ln[1:] for ln in base_task.patch.splitlines() if ln.startswith(c)
                    and not ln.startswith(c * 3)] for c in "-+")
    assert len(plus) == 1 and len(minus) == 1
    fix_line = plus[0].strip()
    ctx_dir = tmp_path_factory.mktemp("derived")
    (ctx_dir / "gold.patch").write_text(base_task.patch)
    (ctx_dir / "setup.sh").write_text(DERIVED_SH)
    (ctx_dir / "Containerfile").write_text(
        f"FROM {base_task.image}\nCOPY . /ctx\nRUN bash /ctx/setup.sh && rm -rf /ctx\n")
    tag = hashlib.sha256((base_task.image + DERIVED_SH + base_task.patch).encode()).hexdigest()
    image = f"localhost/ecredit-test-leak-derived:{tag[:12]}"
    if _podman("image", "exists", image, check=False).returncode != 0:
        _podman("build", "-q", "--pull=never", "--network=none", "--ulimit",
                "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "-t", image, str(ctx_dir))
    task = dataclasses.replace(base_task, image=image)
    ids, control = _image_objects_and_control(image, fix_line)
    assert fix_line in control, control[-2000:]  # a plain container shows the fix
    ctx = _agent_env({task.instance_id: task}, tmp_path, podman_runtime)
    env = SWEAgentEnv(ctx)
    try:
        env.reset(instance_id=task.instance_id)
        assert env.failure is None, env.failure
        out = env.bash(_hunt_script(ids, fix_line))
        assert fix_line not in out, out[-3000:]
        assert env.bash("git log --all --format=%s").strip() == "S_0: the tree at reset"
        assert env.bash("git status --porcelain").strip() == ""
        env.str_replace(task.patch.split("+++ b/")[1].split("\n")[0], minus[0], plus[0])
        patch = artifact(env.snapshot_repo, env.base_tree, env.final_tree)
    finally:
        release(env)
        ctx.close()
    for artifact_text, tid in ((task.patch, "derived-gold"), (patch, "derived-agent")):
        r = podman_runtime.run_trial(task_trial_spec(task, artifact_text, tid, timeout_s=300))
        assert r.exit_class == "ok", r.log[-2000:]
        assert grade_trial(task, r, None)["resolved"] is True, tid
