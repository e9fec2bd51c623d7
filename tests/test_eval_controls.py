"""eval.controls in Podman: gold + empty controls on the bundled holdout, admission manifest."""

from __future__ import annotations

import json

import pytest

from eval.controls import AdmissionError, check_admission, control_counts, run_controls
from sandbox.backend import SandboxOptions


def _c(exit_class="ok", resolved=False, complete=True, f2p_passed=0, p2p=True, cl=True):
    return {"exit_class": exit_class, "resolved": resolved, "complete": complete,
            "f2p_passed": f2p_passed, "p2p_all_passing": p2p,
            "classification": {"raw": cl, "strict": cl, "report_binary": cl, "unknown": False}}


def test_counts_and_reasons_pure():
    per = {"ok": {"gold": _c(resolved=True), "empty": _c()},
           "bad_gold": {"gold": _c(resolved=False, cl=False), "empty": _c()},
           "leaky": {"gold": _c(resolved=True), "empty": _c(f2p_passed=1, cl=False)},
           "partial": {"gold": _c(resolved=True), "empty": _c(complete=False)},
           "infra": {"gold": _c(exit_class="infra_error"), "empty": _c()}}
    c = control_counts(per)
    assert c["controls"]["count"] == 10
    assert c["admitted"]["ids"] == ["ok"]
    assert c["unresolved"]["ids"] == ["bad_gold"]
    assert c["expectation_mismatches"]["ids"] == ["bad_gold", "leaky"]
    assert c["partially_observed"]["ids"] == ["partial:empty"]
    assert c["infra_errors"]["ids"] == ["infra:gold"]
    assert "ok:gold" in c["report_binary_as_expected"]["ids"]
    assert "bad_gold:gold" not in c["report_binary_as_expected"]["ids"]
    assert c["not_admitted"]["leaky"] == ["empty passes FAIL_TO_PASS"]


@pytest.mark.podman
def test_every_bundled_holdout_task_admitted(tmp_path, podman_runtime):
    from eval.tasks.splits import load_tasks

    tasks = load_tasks("bundled:holdout")
    res = run_controls("bundled:holdout", tmp_path, runtime=podman_runtime, concurrency=2,
                       log=lambda *_: None)
    c = res["counts"]
    n = len(tasks)
    assert c["controls"]["count"] == 2 * n
    assert c["admitted"]["count"] == n, c["not_admitted"]
    for k in ("raw_as_expected", "strict_as_expected", "report_binary_as_expected"):
        assert c[k]["count"] == 2 * n, k
    for k in ("unresolved", "partially_observed", "expectation_mismatches", "infra_errors"):
        assert c[k]["count"] == 0 and c[k]["ids"] == [], k
    man = json.loads((tmp_path / "admission.json").read_text())
    assert sorted(man["admitted"]) == sorted(t.instance_id for t in tasks)
    assert set(man["images"]) == {t.image for t in tasks}
    assert all(d and d.startswith("sha256:") for d in man["images"].values())
    assert set(man["parsers"].values()) == {"parse_log_pytest"}
    assert man["unknown_rule"] and man["tasks"]["count"] == n
    assert (tmp_path / "controls.md").is_file()

    # the manifest binds the task list and the image digests
    rec = check_admission(tmp_path, tasks, runtime=SandboxOptions())
    assert rec["admitted"] == n and rec["digests_checked"]
    with pytest.raises(AdmissionError, match="task list changed"):
        check_admission(tmp_path, tasks[:-1], runtime=SandboxOptions())
    image = next(iter(man["images"]))
    man["images"][image] = "sha256:" + "0" * 64
    (tmp_path / "admission.json").write_text(json.dumps(man))
    with pytest.raises(AdmissionError, match="image digest changed"):
        check_admission(tmp_path, tasks, runtime=SandboxOptions())

    # a rerun reuses every cached task result
    again = run_controls("bundled:holdout", tmp_path, runtime=podman_runtime,
                         log=lambda *_: None)
    assert again["counts"]["admitted"]["count"] == n and again["wall_s"] < res["wall_s"]


# --------------------------------------------------------------------------- flaky tests

FLAKY_TESTS = '''\
import os
from pathlib import Path

from calc import add


def _run_number(name):
    """How many times this test ran under this patch (a counter file per test and patch)."""
    patch = "gold" if add(1, 2) == 3 else "empty"
    p = Path(os.environ["FLAKY_DIR"]) / f"{name}-{patch}"
    n = int(p.read_text()) + 1 if p.exists() else 1
    p.write_text(str(n))
    return n


def test_add():
    assert add(1, 2) == 3


def test_keep():
    assert add(0, 0) == 0


def test_flaky():  # passes the first time under each patch, then fails
    assert _run_number("flaky") == 1


def test_flaky_f2p():  # fixed by the gold patch, but only the first time
    assert add(1, 2) == 3 and _run_number("flaky_f2p") == 1
'''


def _flaky_tasks(tmp_path, git):
    """Two user tasks on one repo (LocalRuntime): A has a flaky P2P test, B a flaky F2P test."""
    import sys

    from eval.tasks.schema import Task, save_tasks

    r = tmp_path / "repo"
    r.mkdir()
    (r / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (r / "test_calc.py").write_text(FLAKY_TESTS)
    git(r, "init", "-q")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "base")
    base = git(r, "rev-parse", "HEAD")
    gold = ("--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
            "-    return a - b\n+    return a + b\n")
    tasks = []
    for name, f2p, p2p in (("a", ["test_add"], ["test_flaky", "test_keep"]),
                           ("b", ["test_flaky_f2p"], ["test_keep"])):
        counters = tmp_path / f"counters-{name}"
        counters.mkdir()
        script = (f"export FLAKY_DIR={counters}\necho '>>>>> Start Test Output'\n"
                  f"{sys.executable} -m pytest -rA -p no:cacheprovider test_calc.py\n"
                  "echo '>>>>> End Test Output'\n")
        tasks.append(Task(
            instance_id=f"local__flaky-{name}", repo="local/flaky", base_commit=base,
            problem_statement="add", patch=gold, test_patch="",
            FAIL_TO_PASS=[f"test_calc.py::{t}" for t in f2p],
            PASS_TO_PASS=[f"test_calc.py::{t}" for t in p2p], version="0",
            environment_setup_commit=base, image="local", eval_script=script,
            log_parser="parse_log_pytest", repo_dir=str(r)))
    save_tasks(tasks, tmp_path / "tasks.jsonl")
    return str(tmp_path / "tasks.jsonl"), tasks


def _git(cwd, *args):
    import subprocess

    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _reset_counters(tmp_path):
    for d in tmp_path.glob("counters-*"):
        for f in d.iterdir():
            f.unlink()


@pytest.mark.filterwarnings("ignore:LocalRuntime is not isolated")
def test_repeated_controls_name_flaky_tests(tmp_path):
    from eval.grading.flaky import FLAKY_RULE

    split, tasks = _flaky_tasks(tmp_path, _git)
    a, b = (t.instance_id for t in tasks)
    res = run_controls(split, tmp_path / "ctl", runtime=SandboxOptions(kind="local"), concurrency=1, repeats=2,
                       log=lambda *_: None)
    man = json.loads((tmp_path / "ctl" / "admission.json").read_text())
    assert man["repeats"] == 2 and man["keep_flaky"] is False and man["flaky_rule"] == FLAKY_RULE
    assert man["flaky"][a]["p2p"] == ["test_calc.py::test_flaky"] and man["flaky"][a]["f2p"] == []
    assert man["flaky"][a]["statuses"] == {"gold": {"test_calc.py::test_flaky": ["PASSED",
                                                                                 "FAILED"]},
                                           "empty": {"test_calc.py::test_flaky": ["PASSED",
                                                                                  "FAILED"]}}
    assert man["flaky"][b]["f2p"] == ["test_calc.py::test_flaky_f2p"]
    assert man["p2p_dropped"] == {a: ["test_calc.py::test_flaky"]}
    assert man["admitted"] == [a]  # the flaky P2P test is dropped, the flaky F2P task is not
    assert man["not_admitted"][b] == ["flaky FAIL_TO_PASS: test_calc.py::test_flaky_f2p"]
    c = res["counts"]
    assert c["flaky"]["ids"] == [a, b] and c["controls"]["count"] == 4
    assert res["per_task"][a]["gold"]["resolved"] is True
    assert "test_calc.py::test_flaky" not in res["per_task"][a]["gold"]["p2p"]
    assert len(list((tmp_path / "ctl" / "logs").iterdir())) == 8  # 2 tasks x 2 patches x 2
    assert "## Flaky tests" in (tmp_path / "ctl" / "controls.md").read_text()
    rec = check_admission(tmp_path / "ctl", tasks, runtime=SandboxOptions(kind="local"))
    assert rec["p2p_dropped"] == man["p2p_dropped"] and rec["repeats"] == 2

    # --keep-flaky: both admitted, nothing dropped, the flaky tests still named
    _reset_counters(tmp_path)
    res = run_controls(split, tmp_path / "keep", runtime=SandboxOptions(kind="local"), concurrency=1, repeats=2,
                       keep_flaky=True, log=lambda *_: None)
    man = json.loads((tmp_path / "keep" / "admission.json").read_text())
    assert man["admitted"] == [a, b] and man["p2p_dropped"] == {}
    assert sorted(man["flaky"]) == [a, b]

    # one run per patch measures nothing
    _reset_counters(tmp_path)
    res = run_controls(split, tmp_path / "once", runtime=SandboxOptions(kind="local"), concurrency=1,
                       log=lambda *_: None)
    man = json.loads((tmp_path / "once" / "admission.json").read_text())
    assert man["repeats"] == 1 and man["flaky"] == {} and man["admitted"] == [a, b]
    with pytest.raises(ValueError, match="--repeats"):
        run_controls(split, tmp_path / "bad", runtime=SandboxOptions(kind="local"), repeats=0)
