"""Verifier integrity: all-or-nothing apply, the agent's own
base tree, OOM kills of any process, and the protected set against forged passes.

Trials run in real Podman containers (marker ``podman``) unless a test says otherwise; the
artifacts are the hostile inputs of the issues, and each verdict is graded with the
trainer's own rule (:func:`ecredit_trl.runs.outcomes.trial_outcome`).
"""

from __future__ import annotations

import difflib
import hashlib
import io
import tarfile
from pathlib import Path

import pytest
from conftest import git, make_tar

from sandbox.images import default_image
from sandbox.trials.protect import (
    DEFAULT_PROTECTED,
    TEST_PATH_PATTERNS,
    artifact_paths,
    exact_pattern,
    matches,
    touched_protected,
)
from sandbox.trials.trial import Limits, TrialSpec

# ---------------------------------------------------------------------------
# a tiny project: the F2P test fails at base (add subtracts), the P2P test passes
# ---------------------------------------------------------------------------

CALC = "def add(a, b):\n    return a - b\n"
SUITE = ("from calc import add\n\n\n"
         "def test_add():\n    assert add(2, 3) == 5\n\n\n"
         "def test_zero():\n    assert add(0, 0) == 0\n")
EVAL = ("export PYTHONDONTWRITEBYTECODE=1\n"
        "echo '>>>>> Start Test Output'\n"
        "python3 -m pytest -rA -p no:cacheprovider suite/test_calc.py\n"
        "echo '>>>>> End Test Output'\n")
BASE = {"calc.py": CALC, "suite/test_calc.py": SUITE, "suite/__init__.py": ""}
F2P = ["suite/test_calc.py::test_add"]
P2P = ["suite/test_calc.py::test_zero"]

FORGE_HOOK = ("import pytest\n\n\n"
              "@pytest.hookimpl(hookwrapper=True)\n"
              "def pytest_runtest_makereport(item, call):\n"
              "    outcome = yield\n"
              "    rep = outcome.get_result()\n"
              "    rep.outcome = 'passed'\n"
              "    rep.longrepr = None\n")


class _Task:
    instance_id = "forge-1"
    FAIL_TO_PASS = F2P
    PASS_TO_PASS = P2P
    log_parser = "parse_log_pytest"


def outcome(result):
    from ecredit_trl.runs.outcomes import trial_outcome

    return trial_outcome(_Task, result, None)


def new_file(path: str, text: str) -> str:
    lines = text.splitlines(keepends=True)
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n"
            f"+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join("+" + x for x in lines))


def edit_file(path: str, old: str | bytes, new: str | bytes) -> str:
    """A ``git diff`` of one file's bytes (latin-1 round trip keeps every byte)."""
    o = old.decode("latin-1") if isinstance(old, bytes) else old
    n = new.decode("latin-1") if isinstance(new, bytes) else new
    body = "".join(difflib.unified_diff(o.splitlines(keepends=True), n.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))
    return f"diff --git a/{path} b/{path}\n{body}"


def spec(trial_id: str, artifact: str = "", **kw) -> TrialSpec:
    kw.setdefault("image", default_image())
    kw.setdefault("eval_script", EVAL)
    kw.setdefault("repo_archive", make_tar(BASE))
    kw.setdefault("timeout_s", 60)
    kw.setdefault("protected", DEFAULT_PROTECTED + tuple(exact_pattern(p) for p in
                                                        ["suite/test_calc.py"]))
    return TrialSpec(trial_id=trial_id, artifact=artifact, **kw)


# ---------------------------------------------------------------------------
# pure parts (no container)
# ---------------------------------------------------------------------------

def test_protect_patterns_match_the_trainers_test_path_rule():
    from ecredit_trl.credit.blocks import DEFAULT_TEST_PATTERNS, is_test_path

    assert set(TEST_PATH_PATTERNS) == set(DEFAULT_TEST_PATTERNS)
    paths = ["tests/a.py", "pkg/tests/unit/a.py", "pkg/tests.py", "tests", "test_x.py",
             "a/b/test_x.py", "x_test.py", "testing/conftest.py", "conftest.py", "src/m.py",
             "a/conftest.py.bak", "docs/test_x.txt"]
    for pats in (TEST_PATH_PATTERNS, ("docs/*.txt",), ("src/*/fixtures/",), ("a/b/",)):
        for p in paths + ["src/x/fixtures/f.json", "a/b/c.py"]:
            assert matches(p, pats) == is_test_path(p, pats), (p, pats)
    assert matches("pytest.ini", DEFAULT_PROTECTED) and matches("a/b/x.pth", DEFAULT_PROTECTED)
    assert matches("forge-1.0.dist-info/entry_points.txt", DEFAULT_PROTECTED)
    assert matches("pkg/sitecustomize.py", DEFAULT_PROTECTED)
    assert not matches("setup.cfg", DEFAULT_PROTECTED)
    assert not matches("pyproject.toml", DEFAULT_PROTECTED)
    # an exact (listed) file, fnmatch specials taken literally
    assert matches("t/ch[1].py", [exact_pattern("t/ch[1].py")])
    assert not matches("t/ch1.py", [exact_pattern("t/ch[1].py")])
    assert not matches("x/t/ch[1].py", [exact_pattern("t/ch[1].py")])


def test_artifact_paths_is_a_superset_of_what_either_tool_touches():
    art = ('diff --git a/old.py b/new.py\nsimilarity index 90%\nrename from old.py\n'
           'rename to new.py\n'
           'diff --git "a/sp ace/\\303\\251.py" "b/sp ace/\\303\\251.py"\n'
           '--- "a/sp ace/\\303\\251.py"\n+++ "b/sp ace/\\303\\251.py"\n@@ -1 +1 @@\n-a\n+b\n'
           '--- /dev/null\n+++ b/conftest.py\t2020-01-01\n@@ -0,0 +1 @@\n+x\n'
           'Index: pkg/tox.ini\n--- ../etc/passwd\n+++ /etc/shadow\n')
    paths = artifact_paths(art)
    for p in ("old.py", "new.py", "sp ace/é.py", "conftest.py", "pkg/tox.ini", "tox.ini"):
        assert p in paths, (p, paths)
    assert not any(p.startswith("/") or ".." in p.split("/") for p in paths)
    assert "/dev/null" not in paths
    assert touched_protected(art, DEFAULT_PROTECTED) == ["b/conftest.py", "conftest.py",
                                                        "pkg/tox.ini", "tox.ini"]


def test_spec_always_protects_dot_git_and_refuses_bad_patterns():
    s = TrialSpec(trial_id="x", image="i", eval_script="", protected=("conftest.py",))
    assert s.protected == ("conftest.py", ".git/")
    for bad in ("", "/", "../x", 3):
        with pytest.raises(ValueError, match=r"protected\[0\]"):
            TrialSpec(trial_id="x", image="i", eval_script="", protected=(bad,))


# ---------------------------------------------------------------------------
# all or nothing
# ---------------------------------------------------------------------------

TWO = {"a.py": "".join(f"a{i} = {i}\n" for i in range(12)),
       "b.py": "".join(f"b{i} = {i}\n" for i in range(12))}
SHOW = ("for f in a.py b.py; do echo \"== $f\"; cat $f; done\n"
        "echo '== leftovers'; find . -name '*.rej' -o -name '*.orig'\n")


def _hunk(path: str, ctx_before: str, old: str, new: str, ctx_after: str, line: int) -> str:
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -{line},3 +{line},3 @@\n {ctx_before}\n-{old}\n+{new}\n {ctx_after}\n")


@pytest.mark.podman
def test_two_files_one_applies_is_all_or_nothing(podman_runtime):
    clean_a = _hunk("a.py", "a4 = 4", "a5 = 5", "a5 = 50", "a6 = 6", 5)
    broken_b = _hunk("b.py", "zz = 0", "nothere = 1", "b5 = 50", "zz = 2", 5)
    fuzzy_b = _hunk("b.py", "b4 = 4  # context differs", "b5 = 5", "b5 = 50",
                    "b6 = 6  # here too", 5)
    base = make_tar(TWO)
    # b.py cannot apply by any method: nothing is applied, the trial is apply_failed
    # (before: --reject applied a.py, patch "reversed" it and the trial ran as `ok`)
    r = podman_runtime.run_trial(spec("aon-fail", clean_a + broken_b, eval_script=SHOW,
                                      repo_archive=base))
    assert r.exit_class == "apply_failed", r.log
    assert r.applied_with is None and r.test_exit_code is None
    assert outcome(r) == (None, None, "apply_failed")
    # b.py applies only by fuzz: the whole patch goes in by `patch`, from the pristine base,
    # with no .rej / .orig left for the tests to see, and applied_with says so
    r = podman_runtime.run_trial(spec("aon-fuzz", clean_a + fuzzy_b, eval_script=SHOW,
                                      repo_archive=base))
    assert r.exit_class == "ok", r.log
    assert r.applied_with == "patch --batch --forward --fuzz=5 -p1"
    out = r.log.split(">>>>> ecredit test-start", 1)[1]
    assert "a5 = 50\n" in out and "b5 = 50\n" in out and "a5 = 5\n" not in out
    assert out.split("== leftovers\n", 1)[1].split(">>>>>")[0].strip() == ""
    # a hunk whose change is already in the base is never "reversed" by patch
    already = make_tar({"a.py": TWO["a.py"].replace("a5 = 5\n", "a5 = 50\n"), "b.py": TWO["b.py"]})
    r = podman_runtime.run_trial(spec("aon-rev", clean_a, eval_script=SHOW,
                                      repo_archive=already))
    assert r.exit_class == "apply_failed", r.log
    assert "Reversed (or previously applied) patch detected" in r.log


# ---------------------------------------------------------------------------
# the verifier's base is the agent's starting tree, byte for byte
# ---------------------------------------------------------------------------

ATTR_FILES = {
    ".gitattributes": ("ignored.txt export-ignore\nsubst.py export-subst\nid.py ident\n"
                       "crlf.txt eol=crlf\n"),
    "ignored.txt": "kept by a checkout, dropped by git archive\n",
    "subst.py": "VERSION = '$Format:%H$'\nX = 1\n",
    "id.py": "ID = '$Id$'\nY = 1\n",
    "crlf.txt": "one\ntwo\nthree\n",
}


def _attr_repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q")
    for name, text in ATTR_FILES.items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo, git(repo, "rev-parse", "HEAD")


def _agent_tree(repo: Path, base: str, dest: Path) -> Path:
    """The agent's starting tree, made the way the agent environment makes it: through
    ``sandbox.workspace.agent_repo.agent_clone`` where that exists, else the
    ``git clone --shared`` + checkout of ``ecredit_trl.agent.env._clone_at``."""
    try:
        from sandbox.workspace.agent_repo import agent_clone
    except ImportError:
        from ecredit_trl.agent.env import _clone_at

        _clone_at(str(repo), base, dest)
        return dest
    agent_clone(repo, base, dest, dest.parent / "stores", alternates=None)
    return dest


def _tar_files(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _tree_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and ".git" not in p.relative_to(root).parts}


def test_base_tree_is_the_agents_checkout_with_export_attributes(tmp_path):
    from eval.tasks.trialspec import repo_archive

    repo, base = _attr_repo(tmp_path)
    agent = _agent_tree(repo, base, tmp_path / "agent")  # how a rollout's tree is made
    agent_files = _tree_files(agent)
    assert agent_files == _tar_files(repo_archive(repo, base))
    # the attributes really change things: git archive is not the agent's tree
    assert agent_files["crlf.txt"] == b"one\r\ntwo\r\nthree\r\n"
    assert agent_files["id.py"].startswith(b"ID = '$Id: ")
    import subprocess
    archived = _tar_files(subprocess.run(["git", "-C", str(repo), "archive", base],
                                         capture_output=True, check=True).stdout)
    assert "ignored.txt" not in archived and b"$Format" not in archived["subst.py"]


@pytest.mark.podman
def test_patch_from_the_agents_tree_applies_exactly_with_each_attribute(tmp_path,
                                                                       podman_runtime):
    from eval.tasks.schema import task_from_row
    from eval.tasks.trialspec import task_trial_spec

    repo, base = _attr_repo(tmp_path)
    agent = _agent_tree(repo, base, tmp_path / "agent")
    before = _tree_files(agent)
    after = dict(before)
    after["ignored.txt"] = before["ignored.txt"].replace(b"kept", b"KEPT")
    after["subst.py"] = before["subst.py"].replace(b"X = 1", b"X = 2")
    after["id.py"] = before["id.py"].replace(b"Y = 1", b"Y = 2")
    after["crlf.txt"] = before["crlf.txt"].replace(b"two", b"TWO")
    artifact = "".join(edit_file(n, before[n], after[n])
                       for n in ("ignored.txt", "subst.py", "id.py", "crlf.txt"))
    names = sorted(after)
    show = "sha256sum " + " ".join(names) + "\n"
    row = {"instance_id": "attrs-1", "repo": "local/attrs", "base_commit": base,
           "problem_statement": "", "patch": "", "test_patch": "", "version": "0",
           "environment_setup_commit": base, "FAIL_TO_PASS": ["t.py::t"],
           "PASS_TO_PASS": [], "image": default_image(), "eval_script": show,
           "log_parser": "parse_log_pytest", "repo_dir": str(repo)}
    task = task_from_row(row, 1)
    r = podman_runtime.run_trial(task_trial_spec(task, artifact, "attrs", timeout_s=60))
    assert r.exit_class == "ok", r.log
    assert r.applied_with == "git apply --verbose"  # exact, never by fuzz
    got = {line.split()[1]: line.split()[0] for line in r.log.splitlines()
           if len(line.split()) == 2 and line.split()[1] in after}
    assert got == {n: hashlib.sha256(after[n]).hexdigest() for n in names}


# ---------------------------------------------------------------------------
# an OOM kill of any process in the trial
# ---------------------------------------------------------------------------

@pytest.mark.podman
def test_oom_kill_of_a_child_is_oom_even_when_the_tests_pass(podman_runtime):
    hog = ("python3 -c 'x = bytearray(400 * 1024 * 1024)' || true\n"
           "echo '>>>>> Start Test Output'\n"
           "echo 'PASSED suite/test_calc.py::test_add'\n"
           "echo 'PASSED suite/test_calc.py::test_zero'\n"
           "echo '>>>>> End Test Output'\n")
    r = podman_runtime.run_trial(spec("oom-child", eval_script=hog,
                                      limits=Limits(memory="96m")))
    assert r.exit_class == "oom", r.log
    assert r.oom_kills == 1 and r.test_exit_code == 0
    assert outcome(r) == (None, None, "oom")  # utility unavailable, never graded
    calm = podman_runtime.run_trial(spec("oom-none", eval_script="true\n",
                                         limits=Limits(memory="96m")))
    assert calm.exit_class == "ok" and calm.oom_kills == 0


# ---------------------------------------------------------------------------
# forged passes grade as the truth
# ---------------------------------------------------------------------------

PLUGIN = ("import pytest\n\n\n"
          "@pytest.hookimpl(hookwrapper=True)\n"
          "def pytest_runtest_makereport(item, call):\n"
          "    outcome = yield\n"
          "    outcome.get_result().outcome = 'passed'\n")
FORGERIES = {
    "root-conftest": (new_file("conftest.py", FORGE_HOOK), ["conftest.py"]),
    "subdir-conftest": (new_file("suite/conftest.py", FORGE_HOOK), ["suite/conftest.py"]),
    "ini-plugin": (new_file("pytest.ini", "[pytest]\naddopts = -p forge\n")
                   + new_file("forge.py", PLUGIN), ["pytest.ini"]),
    "tox-plugin": (new_file("tox.ini", "[pytest]\naddopts = -p forge\n")
                   + new_file("forge.py", PLUGIN), ["tox.ini"]),
    "entry-point": (new_file("forge-1.0.dist-info/METADATA",
                             "Metadata-Version: 2.1\nName: forge\nVersion: 1.0\n")
                    + new_file("forge-1.0.dist-info/entry_points.txt",
                               "[pytest11]\nforge = forge\n")
                    + new_file("forge.py", PLUGIN),
                    ["forge-1.0.dist-info/METADATA", "forge-1.0.dist-info/entry_points.txt"]),
    "weakened-test": (edit_file("suite/test_calc.py", SUITE,
                                SUITE.replace("assert add(2, 3) == 5", "assert True")),
                      ["suite/test_calc.py"]),
}


@pytest.mark.podman
@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_forged_pass_grades_as_the_truth(podman_runtime, kind):
    artifact, touched = FORGERIES[kind]
    r = podman_runtime.run_trial(spec(f"forge-{kind}", artifact))
    assert r.exit_class == "ok", r.log
    assert r.protected_touched == touched
    assert "FAILED suite/test_calc.py::test_add" in r.log
    assert outcome(r) == (0.0, False, "graded")  # the truth: F2P fails, P2P passes
    # the same artifact without the protected set forges the pass (the attack is real)
    bare = podman_runtime.run_trial(spec(f"bare-{kind}", artifact, protected=()))
    assert bare.exit_class == "ok", bare.log
    assert bare.protected_touched == []
    assert outcome(bare) == (1.0, True, "graded")


@pytest.mark.podman
def test_printed_status_lines_do_not_forge_a_pass(podman_runtime):
    """A helper the tests import prints fake ``PASSED <id>`` lines (captured output)."""
    liar = ("import sys\n\n\ndef add(a, b):\n"
            "    print('PASSED suite/test_calc.py::test_add')\n"
            "    sys.stderr.write('PASSED suite/test_calc.py::test_add\\n')\n"
            "    return a - b\n")
    r = podman_runtime.run_trial(spec("liar", edit_file("calc.py", CALC, liar)))
    assert r.exit_class == "ok", r.log
    assert "PASSED suite/test_calc.py::test_add" in r.log  # the lie is in the log ...
    assert "FAILED suite/test_calc.py::test_add" in r.log
    utility, resolved, _ = outcome(r)
    assert resolved is False and utility != 1.0  # ... and is not believed


@pytest.mark.podman
def test_swebench_pass_reports_the_harness_verdict_apart(podman_runtime):
    from eval.grading.grader import grade

    artifact = FORGERIES["root-conftest"][0]
    r = podman_runtime.run_trial(spec("swe-forge", artifact, swebench_pass=True))
    assert r.exit_class == "ok", r.log
    assert outcome(r) == (0.0, False, "graded")
    assert r.log_swebench is not None and "Start Test Output" in r.log_swebench
    # the harness's own semantics (no protection) are fooled; that is what it reports
    assert grade(r.log_swebench, f2p=F2P, p2p=P2P, parser="parse_log_pytest").resolved is True
    # nothing protected touched: one run serves both verdicts
    plain = podman_runtime.run_trial(spec("swe-plain", edit_file("calc.py", CALC,
                                          CALC.replace("a - b", "a + b")), swebench_pass=True))
    assert plain.exit_class == "ok" and plain.log_swebench is None
    assert plain.protected_touched == [] and outcome(plain) == (1.0, True, "graded")
    # eval.run's slot fields: both verdicts side by side
    from eval.evaluation.verification import grade_trial

    g = grade_trial(_Task, r, None)
    assert (g["resolved"], g["resolved_swebench"], g["protected_touched"]) == (
        False, True, ["conftest.py"])
    g = grade_trial(_Task, plain, None)
    assert (g["resolved"], g["resolved_swebench"], g["protected_touched"]) == (True, True, [])
    # a repo_dir task (no second run): the harness verdict is unavailable, not guessed
    nopass = podman_runtime.run_trial(spec("swe-nopass", artifact))
    assert nopass.log_swebench is None
    assert grade_trial(_Task, nopass, None)["resolved_swebench"] is None


def test_local_runtime_applies_the_same_protection(tmp_path):
    from sandbox.runtimes.local_runtime import LocalRuntime

    with pytest.warns(RuntimeWarning):
        rt = LocalRuntime()
    r = rt.run_trial(spec("local-forge", FORGERIES["root-conftest"][0]))
    assert r.exit_class == "ok", r.log
    assert r.protected_touched == ["conftest.py"] and r.oom_kills is None
    assert outcome(r) == (0.0, False, "graded")


# ---------------------------------------------------------------------------
# task rows: protected_paths
# ---------------------------------------------------------------------------

def _row(**kw):
    row = {"instance_id": "p-1", "repo": "local/p", "base_commit": "0" * 40,
           "problem_statement": "", "patch": "", "test_patch": "", "version": "0",
           "environment_setup_commit": "0" * 40,
           "FAIL_TO_PASS": ["pkg/checks/ch_one.py::test_a", "test x (mod.Case)"],
           "PASS_TO_PASS": [], "image": "localhost/x:1", "eval_script": "true\n",
           "log_parser": "parse_log_pytest"}
    row.update(kw)
    return row


def test_task_protected_paths_widen_narrow_and_reach_the_trial_spec():
    from eval.tasks.protection import protected_set
    from eval.tasks.schema import task_from_row
    from eval.tasks.trialspec import task_trial_spec

    t = task_from_row(_row(), 1)
    assert "protected_paths" not in t.to_dict()  # task files without it keep their bytes
    pats = protected_set(t)
    assert set(DEFAULT_PROTECTED) <= set(pats)
    assert matches("pkg/checks/ch_one.py", pats)  # a listed test file outside the patterns
    assert not matches("pkg/checks/ch_two.py", pats)
    assert not matches("setup.cfg", pats)
    t2 = task_from_row(_row(protected_paths={"add": ["setup.cfg"], "remove": ["tests/"]}), 1)
    pats2 = protected_set(t2)
    assert matches("setup.cfg", pats2) and not matches("tests/helpers.py", pats2)
    assert t2.to_dict()["protected_paths"] == {"add": ["setup.cfg"], "remove": ["tests/"]}
    s = task_trial_spec(t2, new_file("setup.cfg", "[tool:pytest]\n"), "pp")
    assert s.protected == (*pats2, ".git/") and "setup.cfg" in s.protected_named()
    assert s.swebench_pass is True  # the image holds the repository: a SWE-bench row


@pytest.mark.parametrize("value, message", [
    ([], "must be an object"),
    ({"extra": []}, "unknown key"),
    ({"add": "conftest.py"}, r"\.add' must be a list"),
    ({"add": [""]}, r"\.add\[0\]': expected a non-empty"),
    ({"add": ["../x"]}, r"'\.\.' is not allowed"),
    ({"remove": ["src/"]}, r"\.remove\[0\]': 'src/' is not in the default"),
])
def test_bad_protected_paths_name_the_field(value, message):
    from eval.tasks.schema import task_from_row

    with pytest.raises(ValueError, match=r"row 3: field 'protected_paths.*" + message):
        task_from_row(_row(protected_paths=value), 3, source="rows.jsonl")


# ---------------------------------------------------------------------------
# a bundled task (real project, real tests): forged conftest vs gold + forged conftest
# ---------------------------------------------------------------------------

@pytest.mark.podman
def test_bundled_task_forged_conftest_grades_as_the_truth(podman_runtime):
    from ecredit_trl.runs.outcomes import trial_outcome
    from eval.tasks.splits import load_tasks
    from eval.tasks.trialspec import task_trial_spec

    task = next(t for t in load_tasks("bundled", log=lambda *_: None)
                if t.repo.endswith("inflection"))
    forge = new_file("conftest.py", FORGE_HOOK)
    r = podman_runtime.run_trial(task_trial_spec(task, forge, "bundled-forge", timeout_s=120))
    assert r.exit_class == "ok", r.log
    assert r.protected_touched == ["conftest.py"] and "conftest.py" in r.protected
    u, resolved, how = trial_outcome(task, r, None)
    assert (u, resolved, how) == (0.0, False, "graded")  # every F2P test still fails
    # the artifact is applied whole: the gold fix next to the forged hook still resolves
    g = podman_runtime.run_trial(task_trial_spec(task, task.patch + forge, "bundled-gold-forge",
                                                 timeout_s=120))
    assert g.protected_touched == ["conftest.py"]
    assert trial_outcome(task, g, None) == (1.0, True, "graded")


@pytest.mark.podman
def test_artifact_cannot_plant_git_hooks_for_the_eval_script(tmp_path, podman_runtime):
    """SWE-bench eval scripts run ``git checkout`` in the trial: a hook the artifact writes
    under ``.git/`` would run there. ``.git/`` is always protected."""
    repo = tmp_path / "r"
    repo.mkdir()
    for name, text in BASE.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(repo, arcname=".")
    hook = ("diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout\n"
            "new file mode 100755\n--- /dev/null\n+++ b/.git/hooks/post-checkout\n"
            "@@ -0,0 +1,2 @@\n+#!/bin/sh\n+echo HOOK-RAN-IN-TRIAL\n")
    ev = "git checkout -- calc.py; ls .git/hooks | grep -c post-checkout || true\n" + EVAL
    r = podman_runtime.run_trial(spec("git-hook", hook, repo_archive=buf.getvalue(),
                                      eval_script=ev))
    assert r.exit_class == "ok", r.log
    assert r.protected_touched == [".git/hooks/post-checkout"]
    assert "HOOK-RAN-IN-TRIAL" not in r.log
    bare = podman_runtime.run_trial(spec("git-hook-bare", hook, repo_archive=buf.getvalue(),
                                         eval_script=ev, protected=()))
    assert bare.protected_touched == [".git/hooks/post-checkout"]  # .git/ is never dropped
    assert "HOOK-RAN-IN-TRIAL" not in bare.log
    # the attack is real: with the protected set emptied behind the spec's back, it runs
    forced = spec("git-hook-forced", hook, repo_archive=buf.getvalue(), eval_script=ev)
    forced.protected = ()
    r = podman_runtime.run_trial(forced)
    assert r.exit_class == "ok" and "HOOK-RAN-IN-TRIAL" in r.log, r.log


def test_eval_summary_reports_both_verdicts():
    from eval.evaluation.report import render_report, summarize
    from eval.evaluation.slots import unknown_slot

    def slot(tid, i, resolved, swe, touched=()):
        return {"task_id": tid, "rollout_index": i, "resolved": resolved,
                "resolved_swebench": swe, "protected_touched": list(touched),
                "classification": {"raw": True, "report_binary": resolved, "strict": resolved,
                                   "unknown": False}}

    slots = [slot("a", 0, True, True), slot("a", 1, False, True, ["conftest.py"]),
             slot("b", 0, False, None, ["tox.ini"]), unknown_slot("b", 1, "trial_infra_error")]
    s = summarize(slots, [("a", "r"), ("b", "r")], n=2, denominator=2)
    assert (s["resolved"], s["resolved_swebench"], s["verdicts_differ"]) == (1, 2, 1)
    assert s["success_swebench"] == 0.5 and s["swebench_unavailable"] == 1
    assert s["protected_paths_touched"] == 2
    md = render_report({"summary": s})
    assert "`resolved_swebench`: no protected set): **2 / 4 = " in md
    assert "changed a protected path: 2; verdicts differ: 1;" in md


def test_ledger_counts_rollouts_that_touched_the_protected_set():
    from ecredit_trl.runs.ledger import ledger_row, round_counts, round_metrics
    from ecredit_trl.runs.rollout_record import RolloutRecord
    from sandbox.trials.trial import TrialResult
    recs = [RolloutRecord(task_id="t", rollout_index=i, format_error=False, num_turns=1,
                          snapshots=[]) for i in range(3)]
    trials = [("factual", TrialResult("f0", "ok", protected_touched=["conftest.py"])),
              ("factual", TrialResult("f1", "ok")),
              ("factual", TrialResult("f2", "ok", protected_touched=["tox.ini", "t/x.pth"])),
              # a counterfactual is a subset of its factual artifact: not counted twice
              ("counterfactual", TrialResult("c0", "ok", protected_touched=["conftest.py"]))]
    stats = [{"L": 1, "applied": False, "cap_active": False, "sel_mean": 0.0,
              "other_mean": 0.0}] * 3
    tot = {k: float(v) for k, v in round_counts(recs, stats, trials).items()}
    assert tot["protected_paths_touched"] == 2
    assert round_metrics(tot)["ecredit/protected_paths_touched"] == 2
    assert ledger_row(tot, step=1, arm="M", wall_s=1.0, gpu_hours=0.0)[
        "protected_paths_touched"] == 2
