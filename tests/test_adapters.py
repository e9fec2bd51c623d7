"""SWE-Gym and SWE-smith rows through eval.tasks.adapters. Rows are made here in
each project's own field names; the SWE-smith eval script runs for real (git + pytest on a
repository laid out like a SWE-smith instance: a branch with the bug commit and the
test-removal commit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git, write_jsonl

from eval.holdout import seal_list
from eval.tasks.adapters.swegym import swegym_image
from eval.tasks.adapters.swesmith import reverse_patch, swesmith_eval_script
from eval.tasks.schema import task_from_row
from eval.tasks.sealed import SealedTaskError
from eval.tasks.splits import load_tasks

# ---------------------------------------------------------------------------
# SWE-Gym
# ---------------------------------------------------------------------------

def gym_row(iid="getmoto__moto-5752", repo="getmoto/moto", **over) -> dict:
    """A SWE-Gym row: SWE-bench's field names, no image / eval_script / log_parser."""
    row = {
        "instance_id": iid, "repo": repo, "base_commit": "b" * 40, "version": "4.0",
        "patch": "diff --git a/moto/x.py b/moto/x.py\n", "test_patch": "diff --git a/t b/t\n",
        "problem_statement": "SSM get_parameters fails", "hints_text": "",
        "created_at": "2022-12-08T21:41:24Z", "environment_setup_commit": "e" * 40,
        "FAIL_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_get_parameters_errors"],
        "PASS_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_delete_parameter"],
    }
    row.update(over)
    return row


def test_swegym_image_name_follows_openhands():
    assert swegym_image("getmoto__moto-5752") == \
        "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    # lower-cased like OpenHands (Docker repository names are lower case)
    assert swegym_image("Project-MONAI__MONAI-3715") == \
        "docker.io/xingyaoww/sweb.eval.x86_64.project-monai_s_monai-3715:latest"
    with pytest.raises(ValueError, match="instance_id"):
        swegym_image("a/b")


def test_swegym_rows_load_with_image_parser_fallback_and_missing_script(tmp_path):
    rows = [gym_row(), gym_row("Project-MONAI__MONAI-3715", "Project-MONAI/MONAI"),
            gym_row("pytest-dev__pytest-7000", "pytest-dev/pytest"),
            gym_row("iterative__dvc-1", "iterative/dvc", image_name="myreg.io/dvc:1",
                    eval_script="#!/bin/bash\nset -uxo pipefail\ncd /testbed\n"
                                ": '>>>>> Start Test Output'\npytest -rA tests\n"
                                ": '>>>>> End Test Output'\n")]
    tasks = load_tasks(f"swegym:{write_jsonl(tmp_path / 'gym.jsonl', rows)}")
    moto, monai, pyt, dvc = tasks
    assert moto.image == "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    assert monai.image.endswith("project-monai_s_monai-3715:latest")
    assert dvc.image == "myreg.io/dvc:1"  # the row's own image wins
    # swebench has no parser for moto: generic pytest parser, recorded
    assert (moto.log_parser, moto.log_parser_fallback) == ("parse_log_pytest", True)
    assert (pyt.log_parser, pyt.log_parser_fallback) == ("parse_log_pytest", False)
    assert moto.to_dict()["log_parser_fallback"] is True
    assert "log_parser_fallback" not in pyt.to_dict()
    assert moto.eval_script == "" and moto.eval_script_source == "missing"
    assert dvc.eval_script_source == "row" and "SWEBENCH_TEST_EXIT_CODE=$?" in dvc.eval_script
    assert moto.workdir == "/testbed" and moto.repo_dir is None and not moto.checkout_base
    assert moto.extra["dataset"] == "SWE-Gym/SWE-Gym" and moto.extra["hints_text"] == ""
    # a saved task loads back unchanged through the plain loader
    assert task_from_row(moto.to_dict(), 1) == moto


def test_swegym_parquet_and_training_guard(tmp_path, monkeypatch):
    from datasets import Dataset

    monkeypatch.setenv("ECREDIT_DATASETS_DIR", str(tmp_path / "ds"))
    rows = [gym_row(f"getmoto__moto-{5000 + i}") for i in range(4)]
    path = tmp_path / "gym.parquet"
    Dataset.from_list(rows).to_parquet(str(path))
    assert len(load_tasks(f"swegym:{path}", purpose="train")) == 4
    ids = tmp_path / "held.txt"
    ids.write_text("getmoto__moto-5001\n")
    seal_list("mine", ids, rows=f"swegym:{path}")
    with pytest.raises(SealedTaskError, match=r"getmoto__moto-5001 \(mine.json\)"):
        load_tasks(f"swegym:{path}", purpose="train")


@pytest.mark.parametrize("field", ["instance_id", "repo", "base_commit", "patch", "test_patch",
                                   "version", "environment_setup_commit", "FAIL_TO_PASS",
                                   "PASS_TO_PASS", "problem_statement"])
def test_swegym_missing_field_names_field_and_row(tmp_path, field):
    rows = [gym_row("getmoto__moto-1"), gym_row("getmoto__moto-2")]
    del rows[1][field]
    path = write_jsonl(tmp_path / "gym.jsonl", rows)
    with pytest.raises(ValueError, match=rf"swegym:{path} row 2: field '{field}' missing"):
        load_tasks(f"swegym:{path}")


def test_adapter_sources_need_a_path():
    with pytest.raises(ValueError, match="swegym needs a local file"):
        load_tasks("swegym")
    with pytest.raises(ValueError, match="swesmith needs a local file"):
        load_tasks("swesmith:")


# ---------------------------------------------------------------------------
# SWE-smith
# ---------------------------------------------------------------------------

SMITH_REPO = "swesmith/oauthlib__oauthlib.1fd52536"
SMITH_ID = "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc"


def smith_row(iid=SMITH_ID, **over) -> dict:
    """A SWE-smith row in SWE-smith's own field names (HF dataset card)."""
    row = {
        "instance_id": iid, "repo": SMITH_REPO,
        "patch": ("diff --git a/oauthlib/common.py b/oauthlib/common.py\n"
                  "--- a/oauthlib/common.py\n+++ b/oauthlib/common.py\n"
                  "@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"),
        "FAIL_TO_PASS": ["tests/test_common.py::CommonTests::test_f",
                         "tests/test_common.py::test_g[a b]"],
        "PASS_TO_PASS": ["tests/oauth1/test_client.py::test_ok"],
        "image_name": "swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
        "problem_statement": "f() returns the wrong value",
    }
    row.update(over)
    return row


def test_swesmith_row_becomes_a_branch_based_task(tmp_path):
    t = load_tasks(f"swesmith:{write_jsonl(tmp_path / 's.jsonl', [smith_row()])}")[0]
    assert t.base_commit == SMITH_ID and t.checkout_base is True  # the instance branch
    assert t.image == "docker.io/swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536"
    assert t.repo == SMITH_REPO and t.version == "1fd52536" and t.test_patch == ""
    assert (t.log_parser, t.log_parser_fallback) == ("parse_log_pytest", True)
    assert t.eval_script_source == "swesmith.harness"
    assert t.extra["bug_patch"] == smith_row()["patch"]
    assert t.extra["upstream_repo"] == "oauthlib/oauthlib"
    assert " def f():\n+    return 1\n-    return 2\n" in t.patch  # the fix undoes the bug
    lines = t.eval_script.splitlines()
    assert (f"git checkout '{SMITH_ID}~1' -- tests/oauth1/test_client.py tests/test_common.py"
            in lines)
    run = [ln for ln in lines if "pytest " in ln]
    assert run == ["source /opt/miniconda3/bin/activate; conda activate testbed; pytest "
                   "--disable-warnings --color=no --tb=no --verbose -rA "
                   "tests/oauth1/test_client.py tests/test_common.py"]
    end = lines.index(": '>>>>> End Test Output'")
    assert lines[end - 1] == "SWEBENCH_TEST_EXIT_CODE=$?"
    assert task_from_row(t.to_dict(), 1) == t
    # the verifier checks the instance branch out before applying the artifact
    from eval.tasks.trialspec import task_trial_spec

    spec = task_trial_spec(t, "", "t1")
    assert spec.checkout == SMITH_ID and spec.repo_archive is None


@pytest.mark.parametrize("field", ["instance_id", "repo", "patch", "FAIL_TO_PASS",
                                   "PASS_TO_PASS", "image_name", "problem_statement"])
def test_swesmith_missing_field_names_field_and_row(tmp_path, field):
    rows = [smith_row(), smith_row(SMITH_ID + "x")]
    del rows[1][field]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    with pytest.raises(ValueError, match=rf"swesmith:{path} row 2: field '{field}' missing"):
        load_tasks(f"swesmith:{path}")


@pytest.mark.parametrize("over, needle", [
    ({"repo": "oauthlib/oauthlib"}, "field 'repo' must look like 'swesmith/<owner>__<repo>"),
    ({"instance_id": "other__repo.1fd52536.x"}, "field 'instance_id' 'other__repo.1fd52536.x' "
                                                "is not an instance of"),
    ({"FAIL_TO_PASS": ["TestFoo/bar"]}, "field 'FAIL_TO_PASS'/'PASS_TO_PASS': only Python \\(pytest\\)"),
    ({"FAIL_TO_PASS": "[oops"}, "field 'FAIL_TO_PASS' is a string but not JSON"),
    ({"patch": "diff --git a/x b/x\nGIT binary patch\n"}, "field 'patch': binary diffs"),
    ({"image_name": ""}, "field 'image_name' must be a non-empty string"),
])
def test_swesmith_malformed_rows(tmp_path, over, needle):
    path = write_jsonl(tmp_path / "s.jsonl", [smith_row(), smith_row(SMITH_ID + "y", **over)])
    with pytest.raises(ValueError, match=rf"row 2: {needle}"):
        load_tasks(f"swesmith:{path}")


def _smith_repo(tmp: Path) -> tuple[Path, str]:
    """A repository laid out like a SWE-smith image + instance branch: main (clean), and a
    branch ``<id>`` with the bug commit and the commit removing the FAIL_TO_PASS test file."""
    repo = tmp / "testbed"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "conftest.py").write_text("")  # puts the repository on sys.path (no install here)
    (repo / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "tests" / "test_add.py").write_text(
        "from pkg.calc import add\n\ndef test_add():\n    assert add(2, 2) == 4\n")
    (repo / "tests" / "test_keep.py").write_text("def test_keep():\n    assert True\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "clean")
    iid = "me__calc.0123abcd.func_pm_op_swap__x1"
    git(repo, "checkout", "-q", "-b", iid)
    (repo / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "commit", "-qam", "bug")
    bug = git(repo, "diff", "HEAD~1", "HEAD") + "\n"
    git(repo, "rm", "-q", "tests/test_add.py")
    git(repo, "commit", "-qm", "remove F2P tests")
    return repo, iid, bug


@pytest.mark.parametrize("fixed", [True, False])
def test_swesmith_eval_script_runs_and_grades_with_swebench_pytest_parser(tmp_path, fixed):
    """The agent's tree is the branch tip (F2P test removed); the artifact is applied there,
    the eval script brings the tests back from <id>~1 and runs pytest -rA on them."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    repo, iid, bug = _smith_repo(tmp_path)
    row = smith_row(iid, repo="swesmith/me__calc.0123abcd", patch=bug,
                    FAIL_TO_PASS=["tests/test_add.py::test_add"],
                    PASS_TO_PASS=["tests/test_keep.py::test_keep"], workdir=str(repo))
    t = load_tasks(f"swesmith:{write_jsonl(tmp_path / 's.jsonl', [row])}")[0]
    assert not (repo / "tests" / "test_add.py").exists()  # the agent never sees the test
    if fixed:
        subprocess.run(["git", "-C", str(repo), "apply", "-"], input=t.patch.encode(), check=True)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-c", t.eval_script], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path, timeout=120)
    log = proc.stdout
    body = log.split(">>>>> Start Test Output", 1)[1].split(">>>>> End Test Output", 1)[0]
    status = PARSER_REGISTRY[t.log_parser](body, None)
    assert status["tests/test_keep.py::test_keep"] == "PASSED"
    assert status["tests/test_add.py::test_add"] == ("PASSED" if fixed else "FAILED")
    assert f">>>>> Test Exit Code: {0 if fixed else 1}" in log


def test_reverse_patch_undoes_a_real_git_diff(tmp_path):
    """New, deleted, renamed files, a missing final newline and a removed line that starts
    with '--' (which looks like a header): applying the reverse restores every byte."""
    repo = tmp_path / "r"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1\ny = 2\n-- z\n")
    (repo / "gone.py").write_text("bye\n")
    (repo / "old.txt").write_text("rename me\n" * 5)
    (repo / "nonl.py").write_text("last")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    before = {p.name: p.read_bytes() for p in repo.iterdir() if p.is_file()}
    (repo / "a.py").write_text("x = 1\n--- y = 3\n-- z\n")
    (repo / "gone.py").unlink()
    (repo / "new.py").write_text("hi\n")
    git(repo, "mv", "old.txt", "renamed.txt")
    (repo / "nonl.py").write_text("last\n")
    git(repo, "add", "-A")
    bug = git(repo, "diff", "--cached", "-M") + "\n"
    git(repo, "commit", "-qm", "bug")
    rev = reverse_patch(bug)
    assert reverse_patch(rev) == bug
    subprocess.run(["git", "-C", str(repo), "apply", "-"], input=rev.encode(), check=True)
    after = {p.name: p.read_bytes() for p in repo.iterdir() if p.is_file()}
    assert after == before


@pytest.mark.parametrize("diff, needle", [
    ("diff --git a/x b/y\ncopy from x\ncopy to y\n", "a copy cannot be reversed"),
    ("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n", "ends inside a hunk"),
    ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n?bad\n", "malformed hunk line"),
])
def test_reverse_patch_refuses_what_it_cannot_reverse(diff, needle):
    with pytest.raises(ValueError, match=needle):
        reverse_patch(diff)


def test_eval_script_quotes_paths():
    s = swesmith_eval_script("o__r.01234567.x", ["tests/a b.py::t", "tests/c.py::u"])
    assert "git checkout 'o__r.01234567.x~1' -- 'tests/a b.py' tests/c.py" in s
