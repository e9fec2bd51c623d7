"""eval.grading.grader / eval.grade: real pytest runs on tiny projects, swebench-format snippets.

Every "real" log here is produced by running ``python -m pytest -rA`` (what SWE-bench eval
scripts run) on a project written to tmp_path, then wrapped like a swebench harness log
(``set -x`` trace lines, START/END markers, recorded test exit code).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import swebench_resolved
from hypothesis import given, settings
from hypothesis import strategies as st

from eval.grading.grader import (
    MAP_REPO_TO_PARSER,
    MISSING,
    GradeReport,
    Observation,
    ParserDisagreement,
    grade,
    parse_log,
    parser_for_repo,
    resolve_parser,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- helpers


def run_pytest(project: Path, *targets: str) -> tuple[str, int]:
    """Real pytest in ``project``: (stdout+stderr, exit status)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONHASHSEED"] = "0"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *targets],
        cwd=project, capture_output=True, text=True, env=env, timeout=120,
    )
    return proc.stdout + proc.stderr, proc.returncode


def harness_log(body: str, exit_code: int | None) -> str:
    """Wrap test output like a swebench eval log (set -x trace, markers, exit code)."""
    head = (
        "+ git apply -v /tmp/patch.diff\n"
        "Checking patch calc.py...\n"
        "Applied patch calc.py cleanly.\n"
        "+ : '>>>>> Start Test Output'\n"
        "+ pytest -rA test_calc.py\n"
    )
    tail = f"+ SWEBENCH_TEST_EXIT_CODE={exit_code or 0}\n+ : '>>>>> End Test Output'\n"
    if exit_code is not None:
        tail += (
            f"+ echo '>>>>> Test Exit Code: {exit_code}'\n"
            f">>>>> Test Exit Code: {exit_code}\n"
        )
    tail += "+ git checkout abc123 test_calc.py\n"
    return head + body + ("" if body.endswith("\n") else "\n") + tail


def line_of(log_text: str, obs: Observation) -> str:
    return log_text.split("\n")[obs.line_no - 1]


# --------------------------------------------------------------------------- calc project

CALC_TESTS = '''\
import pytest
from calc import add, mul, neg


@pytest.mark.parametrize("a,b,want", [(1, 2, 3), (2, 5, 7)])
def test_add(a, b, want):
    assert add(a, b) == want


def test_neg():
    assert neg(3) == -3


def test_neg_one():
    assert neg(1) == -1


class TestMul:
    def test_same(self):
        assert mul(2, 3) == 6


class TestZero:
    def test_same(self):
        assert mul(0, 5) == 0


@pytest.mark.parametrize("k", [2], ids=["\u03c0"])
def test_mul(k):
    assert mul(k, 1) == k
'''

CALC_VARIANTS = {
    # empty-patch control: F2P fail, P2P pass
    "empty": "def add(a, b):\n    return a - b\n\ndef neg(x):\n    return x\n\n"
             "def mul(a, b):\n    return a * b\n",
    "gold": "def add(a, b):\n    return a + b\n\ndef neg(x):\n    return -x\n\n"
            "def mul(a, b):\n    return a * b\n",
    "half": "def add(a, b):\n    return a + b\n\ndef neg(x):\n    return x\n\n"
            "def mul(a, b):\n    return a * b\n",
    "half_break": "def add(a, b):\n    return a + b\n\ndef neg(x):\n    return x\n\n"
                  "def mul(a, b):\n    return a * b if a else 1\n",
    "syntax": "def add(a, b)\n    return a + b\n",
}

F2P = [
    "test_calc.py::test_add[1-2-3]",
    "test_calc.py::test_add[2-5-7]",
    "test_calc.py::test_neg",
    "test_calc.py::test_neg_one",
]
P2P = [
    "test_calc.py::TestMul::test_same",
    "test_calc.py::TestZero::test_same",
    "test_calc.py::test_mul[\\u03c0]",  # pytest escapes non-ASCII ids
]


@pytest.fixture(scope="module")
def calc_logs(tmp_path_factory) -> dict[str, tuple[str, str, int]]:
    """variant -> (harness log, raw pytest output, exit status), one real pytest run each."""
    out = {}
    for name, source in CALC_VARIANTS.items():
        proj = tmp_path_factory.mktemp(f"calc_{name}")
        (proj / "calc.py").write_text(source)
        (proj / "test_calc.py").write_text(CALC_TESTS)
        body, rc = run_pytest(proj, "test_calc.py")
        out[name] = (harness_log(body, rc), body, rc)
    return out


def test_calc_exit_statuses(calc_logs):
    assert {k: v[2] for k, v in calc_logs.items()} == {
        "empty": 1, "gold": 0, "half": 1, "half_break": 1, "syntax": 2,
    }


def test_gold_resolves(calc_logs, tmp_path):
    log = calc_logs["gold"][0]
    r = grade(log, f2p=F2P, p2p=P2P, parser="pytest")
    assert isinstance(r, GradeReport)
    assert r.f2p == dict.fromkeys(F2P, "PASSED")
    assert r.p2p == dict.fromkeys(P2P, "PASSED")
    assert (r.resolved, r.complete, r.truncated, r.attributed) == (True, True, False, False)
    assert r.utility == 1.0
    assert r.missing == [] and r.duplicates == {}
    assert r.region == "markers" and r.log_rejected is None
    assert r.test_exit_code == 0 and r.harness_exit == "ok"
    assert r.classification == {
        "raw": True, "report_binary": True, "strict": True, "unknown": False,
    }
    assert r.resolved == swebench_resolved(tmp_path, log, F2P, P2P, "parse_log_pytest")
    # gold control: expected to resolve
    ctl = grade(log, f2p=F2P, p2p=P2P, parser="pytest", expected_resolved=True)
    assert ctl.classification == r.classification


def test_empty_control(calc_logs, tmp_path):
    log = calc_logs["empty"][0]
    r = grade(log, f2p=F2P, p2p=P2P, parser="parse_log_pytest", expected_resolved=False)
    assert r.f2p == dict.fromkeys(F2P, "FAILED")
    assert r.p2p == dict.fromkeys(P2P, "PASSED")
    assert (r.resolved, r.complete, r.utility) == (False, True, 0.0)
    assert r.harness_exit == "exit_1"
    assert r.classification == {
        "raw": True, "report_binary": True, "strict": True, "unknown": False,
    }
    # the same log seen as a rollout slot (expected to resolve): every view says failure
    slot = grade(log, f2p=F2P, p2p=P2P, parser="pytest")
    assert slot.classification == {
        "raw": False, "report_binary": False, "strict": False, "unknown": False,
    }
    assert not swebench_resolved(tmp_path, log, F2P, P2P, "parse_log_pytest")


def test_half_utility(calc_logs, tmp_path):
    log = calc_logs["half"][0]
    r = grade(log, f2p=F2P, p2p=P2P, parser="pytest")
    assert r.f2p == {
        "test_calc.py::test_add[1-2-3]": "PASSED",
        "test_calc.py::test_add[2-5-7]": "PASSED",
        "test_calc.py::test_neg": "FAILED",
        "test_calc.py::test_neg_one": "FAILED",
    }
    assert r.utility == 0.5 and r.f2p_passed == 2 and r.p2p_all_passing
    assert r.resolved is False and r.resolution_status == "RESOLVED_PARTIAL"
    assert r.complete and not r.classification["strict"]
    assert not swebench_resolved(tmp_path, log, F2P, P2P, "parse_log_pytest")


def test_half_with_p2p_regression(calc_logs):
    """Same test name in two classes, different outcomes: distinct ids, one P2P failing."""
    r = grade(calc_logs["half_break"][0], f2p=F2P, p2p=P2P, parser="pytest")
    assert r.p2p == {
        "test_calc.py::TestMul::test_same": "PASSED",
        "test_calc.py::TestZero::test_same": "FAILED",
        "test_calc.py::test_mul[\\u03c0]": "PASSED",
    }
    assert r.utility == -0.5
    assert r.resolved is False and r.resolution_status == "RESOLVED_NO"
    assert r.complete and r.duplicates == {}


def test_unicode_id_as_listed_unescaped_is_missing(calc_logs):
    r = grade(calc_logs["gold"][0], f2p=F2P, p2p=["test_calc.py::test_mul[\u03c0]"],
              parser="pytest")
    assert r.p2p == {"test_calc.py::test_mul[\u03c0]": MISSING}
    assert r.missing == ["test_calc.py::test_mul[\u03c0]"]
    assert r.utility is None and not r.resolved and r.classification["unknown"]


def test_collection_error_attribution(calc_logs, tmp_path):
    log = calc_logs["syntax"][0]
    assert "ERROR test_calc.py" in log and "Interrupted: 1 error during collection" in log
    r = grade(log, f2p=F2P, p2p=P2P, parser="pytest")
    assert r.status_map == {"test_calc.py": "ERROR"}
    assert r.f2p == dict.fromkeys(F2P, MISSING) and r.p2p == dict.fromkeys(P2P, MISSING)
    assert r.missing == F2P + P2P
    assert (r.complete, r.utility, r.attributed, r.resolved) == (False, None, False, False)
    assert r.classification == {
        "raw": False, "report_binary": False, "strict": False, "unknown": True,
    }
    # the empty-patch control observed every listed test -> the artifact caused the loss
    a = grade(log, f2p=F2P, p2p=P2P, parser="pytest", control_log=calc_logs["empty"][0])
    assert (a.complete, a.attributed, a.control_complete) == (False, True, True)
    assert a.utility == -1.0  # 0/4 F2P - 1[P2P not passing]
    assert a.classification["unknown"] is False and a.classification["strict"] is False
    # a control that did not observe everything cannot attribute
    bad_ctl = grade(log, f2p=F2P, p2p=P2P, parser="pytest", control_log=log)
    assert (bad_ctl.utility, bad_ctl.attributed, bad_ctl.control_complete) == (None, False, False)
    assert not swebench_resolved(tmp_path, log, F2P, P2P, "parse_log_pytest")


def test_truncated_mid_run(calc_logs, tmp_path):
    full = calc_logs["gold"][0]
    lines = full.split("\n")
    cut = next(i for i, ln in enumerate(lines) if ln.startswith("PASSED test_calc.py::test_neg"))
    log = "\n".join(lines[:cut]) + "\n"  # no END marker, summary cut before test_neg
    r = grade(log, f2p=F2P, p2p=P2P, parser="pytest")
    assert r.truncated and r.region == "after_start_marker" and r.log_rejected == "truncated"
    assert r.f2p == {
        "test_calc.py::test_add[1-2-3]": "PASSED",
        "test_calc.py::test_add[2-5-7]": "PASSED",
        "test_calc.py::test_neg": MISSING,
        "test_calc.py::test_neg_one": MISSING,
    }
    assert (r.complete, r.utility, r.resolved) == (False, None, False)
    assert r.classification["unknown"]
    # even a truncated log that observed every listed test is not complete (swebench rejects it)
    whole = grade(full.split("+ SWEBENCH_TEST_EXIT_CODE")[0], f2p=F2P, p2p=P2P, parser="pytest")
    assert whole.truncated and not whole.missing and not whole.complete
    assert whole.utility is None and whole.resolved is False
    # attributed: swebench grades a rejected log as no observations, so all listed tests fail
    a = grade(log, f2p=F2P, p2p=P2P, parser="pytest", control_log=calc_logs["empty"][0])
    assert a.attributed and a.utility == -1.0 and a.f2p_passed == 0
    assert not swebench_resolved(tmp_path, log, F2P, P2P, "parse_log_pytest")


def test_same_tests_run_twice_duplicates(calc_logs, tmp_path):
    """Reused names: one log region holding two runs (control output then gold output)."""
    body = calc_logs["empty"][1] + calc_logs["gold"][1]
    log = harness_log(body, 0)
    r = grade(log, f2p=F2P, p2p=P2P, parser="pytest")
    assert r.duplicates == {
        **{t: ["FAILED", "PASSED"] for t in F2P},
        **{t: ["PASSED", "PASSED"] for t in P2P},
    }
    assert r.resolved and r.utility == 1.0  # last status wins, as in swebench's map
    assert r.classification["strict"] is False  # conflicting observations are not strict
    assert r.classification["report_binary"] is True
    assert len(r.observations) == 2 * len(F2P + P2P)
    assert r.resolved == swebench_resolved(tmp_path, log, F2P, P2P, "parse_log_pytest")


def test_observations_point_at_their_lines(calc_logs):
    for log, *_ in calc_logs.values():
        r = grade(log, f2p=F2P, p2p=P2P, parser="pytest")
        lines = [o.line_no for o in r.observations]
        assert lines == sorted(lines)
        for o in r.observations:
            text = line_of(log, o)
            assert text.startswith(o.status + " " + o.test_id)


# --------------------------------------------------------------------------- odd ids project

ODD_TESTS = '''\
import pytest


@pytest.mark.parametrize("x", ["a b", "a c", "[x]", "\u00e9", "x[y", "plain"])
def test_p(x):
    assert x != "a c"


class TestA:
    def test_same(self):
        assert True


class TestB:
    def test_same(self):
        assert False


@pytest.mark.parametrize("x", [1, 2], ids=["dup", "dup"])
def test_reused(x):
    assert x == 1


@pytest.mark.xfail(reason="known")
def test_xf():
    assert False


@pytest.mark.xfail(reason="known")
def test_xp():
    assert True


@pytest.mark.xfail(strict=True, reason="strict")
def test_xps():
    assert True


@pytest.mark.skip(reason="nope")
def test_sk():
    pass


@pytest.fixture
def boom():
    raise RuntimeError("fixture boom")


def test_err(boom):
    pass
'''

ODD = "test_odd.py::"


@pytest.fixture(scope="module")
def odd_log(tmp_path_factory) -> str:
    proj = tmp_path_factory.mktemp("odd")
    (proj / "test_odd.py").write_text(ODD_TESTS)
    body, rc = run_pytest(proj, "test_odd.py")
    assert rc == 1
    return harness_log(body, rc)


def test_odd_status_map_exact(odd_log):
    r = grade(odd_log, f2p=[], p2p=[], parser="pytest")
    assert r.reader == "pytest_report"
    assert r.status_map == {
        ODD + "test_p[a b]": "PASSED",  # ids keep their spaces (swebench cuts them at "[a")
        ODD + "test_p[a c]": "FAILED",
        ODD + "test_p[[x]]": "PASSED",
        ODD + "test_p[\\xe9]": "PASSED",
        ODD + "test_p[x[y]": "PASSED",
        ODD + "test_p[plain]": "PASSED",
        ODD + "TestA::test_same": "PASSED",
        ODD + "TestB::test_same": "FAILED",
        ODD + "test_reused[dup0]": "PASSED",  # pytest de-duplicates reused ids itself
        ODD + "test_reused[dup1]": "FAILED",
        ODD + "test_xf": "XFAIL",
        ODD + "test_xps": "FAILED",  # strict XPASS is reported as FAILED
        ODD + "test_err": "ERROR",
    }
    assert r.duplicates == {}
    # the skip summary "SKIPPED [1] test_odd.py:NN: nope" and "XPASS ..." carry no test id
    assert "SKIPPED [1] test_odd.py:" in odd_log and f"XPASS {ODD}test_xp - known" in odd_log
    for o in r.observations:
        assert o.style == "summary"
        assert line_of(odd_log, o).startswith(o.status + " " + o.test_id)


def test_id_with_space_is_found_exactly(odd_log, tmp_path):
    """parse_log_pytest splits on whitespace: "PASSED test_odd.py::test_p[a b]" yields the id
    "test_odd.py::test_p[a" (which also collects "[a c]"'s FAILED). The grader recognises the
    listed id exactly, and counts the case where swebench's verdict differs."""
    assert f"PASSED {ODD}test_p[a b]" in odd_log
    listed = [ODD + "test_p[a b]"]
    r = grade(odd_log, f2p=listed, p2p=[ODD + "TestA::test_same"], parser="pytest")
    assert r.f2p == {ODD + "test_p[a b]": "PASSED"}
    assert r.missing == []
    assert (r.complete, r.utility, r.resolved) == (True, 1.0, True)
    assert r.classification["strict"] is True
    assert r.resolved_swebench_parser is False
    assert r.parser_disagreements == [
        ParserDisagreement(ODD + "test_p[a b]", "PASSED", MISSING, "id_with_whitespace")]
    assert not swebench_resolved(tmp_path, odd_log, listed, [ODD + "TestA::test_same"],
                                 "parse_log_pytest")
    r = grade(odd_log, f2p=[ODD + "test_p[a c]"], p2p=[], parser="pytest")
    assert r.f2p == {ODD + "test_p[a c]": "FAILED"} and r.utility == 0.0
    # the id as SWE-bench stores such tests (cut at the space) reads as swebench reads it
    cut = grade(odd_log, f2p=[ODD + "test_p[a"], p2p=[], parser="pytest")
    assert cut.f2p == {ODD + "test_p[a": "FAILED"} and cut.complete
    assert cut.utility == 0.0 and not cut.classification["strict"]
    assert cut.parser_disagreements == [] and cut.resolved_swebench_parser is False


def test_odd_swebench_semantics(odd_log, tmp_path):
    # XFAIL passes F2P; non-strict XPASS and skipped tests are never observed -> MISSING
    r = grade(odd_log, f2p=[ODD + "test_xf"], p2p=[ODD + "TestA::test_same"], parser="pytest")
    assert r.resolved and r.utility == 1.0 and r.complete
    assert r.classification == {
        "raw": False,  # pytest exited 1
        "report_binary": True,
        "strict": False,  # XFAIL is not a strict PASSED
        "unknown": False,
    }
    assert r.resolved == swebench_resolved(
        tmp_path, odd_log, [ODD + "test_xf"], [ODD + "TestA::test_same"], "parse_log_pytest"
    )
    r = grade(odd_log, f2p=[ODD + "test_xp", ODD + "test_xps"], p2p=[ODD + "test_sk"],
              parser="pytest")
    assert r.f2p == {ODD + "test_xp": MISSING, ODD + "test_xps": "FAILED"}
    assert r.p2p == {ODD + "test_sk": MISSING}
    assert r.missing == [ODD + "test_xp", ODD + "test_sk"]
    assert r.utility is None
    # brackets and unicode
    ids = [ODD + "test_p[[x]]", ODD + "test_p[x[y]", ODD + "test_p[\\xe9]", ODD + "test_p[plain]"]
    r = grade(odd_log, f2p=ids, p2p=[ODD + "test_reused[dup0]"], parser="pytest")
    assert r.f2p == dict.fromkeys(ids, "PASSED")
    assert r.resolved and r.utility == 1.0 and r.classification["strict"]
    r = grade(odd_log, f2p=[ODD + "test_p[\u00e9]"], p2p=[], parser="pytest")
    assert r.missing == [ODD + "test_p[\u00e9]"]
    # an error at setup fails F2P and breaks P2P
    r = grade(odd_log, f2p=[ODD + "test_err", ODD + "test_xf"],
              p2p=[ODD + "test_reused[dup1]"], parser="pytest")
    assert r.f2p == {ODD + "test_err": "ERROR", ODD + "test_xf": "XFAIL"}
    assert r.utility == 0.5 - 1.0
    assert r.complete and not r.classification["strict"] and not r.resolved


# --------------------------------------------------------------------------- snippets

DJANGO_LOG = """\
+ : '>>>>> Start Test Output'
+ ./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 app.tests
Testing against Django installed in '/testbed/django'
Importing application app
System check identified no issues (0 silenced).
test_a (app.tests.ModelTests) ... ok
test_b (app.tests.ModelTests) ... FAIL
test_c (app.tests.ModelTests) ... skipped 'needs postgres'
test_d (app.tests.ModelTests) ... ERROR
test_e (app.tests.ModelTests) ... Internal Server Error: /admin/
ok
test_same (app.tests.FirstTests) ... ok
test_same (app.tests.SecondTests) ... FAIL

======================================================================
ERROR: test_d (app.tests.ModelTests)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tests/app/tests.py", line 20, in test_d
    raise ValueError
ValueError

======================================================================
FAIL: test_b (app.tests.ModelTests)
----------------------------------------------------------------------
AssertionError: 1 != 2

----------------------------------------------------------------------
Ran 7 tests in 0.012s

FAILED (failures=2, errors=1, skipped=1)
+ : '>>>>> End Test Output'
+ git checkout abc tests/app/tests.py
"""


def test_django_snippet(tmp_path):
    name, fn = parser_for_repo("django/django")
    assert name == "parse_log_django" and MAP_REPO_TO_PARSER["django/django"] is fn
    p = parse_log(DJANGO_LOG, "django/django")
    assert p.status_map == {
        "test_a (app.tests.ModelTests)": "PASSED",
        "test_b (app.tests.ModelTests)": "FAILED",
        "test_c (app.tests.ModelTests)": "SKIPPED",
        "test_d (app.tests.ModelTests)": "ERROR",
        "test_e (app.tests.ModelTests)": "PASSED",  # "ok" on the next line
        "test_same (app.tests.FirstTests)": "PASSED",
        "test_same (app.tests.SecondTests)": "FAILED",
        "test_d": "ERROR",  # from the "ERROR: test_d (...)" header: first word only
        "test_b": "FAILED",
    }
    e = [o for o in p.observations if o.test_id == "test_e (app.tests.ModelTests)"]
    assert len(e) == 1 and line_of(DJANGO_LOG, e[0]) == "ok"  # cross-line status located
    assert [o.test_id for o in p.observations][-2:] == ["test_d", "test_b"]
    f2p = ["test_a (app.tests.ModelTests)", "test_e (app.tests.ModelTests)"]
    p2p = ["test_c (app.tests.ModelTests)", "test_same (app.tests.FirstTests)"]
    # SKIPPED keeps P2P
    r = grade(DJANGO_LOG, f2p=f2p, p2p=p2p, parser="django/django")
    assert r.resolved and r.utility == 1.0 and r.complete
    assert r.classification == {
        "raw": False,  # no harness exit given and no exit code recorded in the log
        "report_binary": True,
        "strict": False,  # a SKIPPED listed test is not strict
        "unknown": False,
    }
    assert r.resolved == swebench_resolved(tmp_path, DJANGO_LOG, f2p, p2p, "parse_log_django")
    assert grade(DJANGO_LOG, f2p=f2p, p2p=p2p, parser="django", harness_exit="ok"
                 ).classification["raw"] is True
    # SKIPPED fails F2P
    r = grade(DJANGO_LOG, f2p=["test_a (app.tests.ModelTests)", "test_c (app.tests.ModelTests)"],
              p2p=[], parser="django/django")
    assert r.utility == 0.5 and r.resolution_status == "RESOLVED_PARTIAL" and not r.resolved
    # a failing P2P (same method name, other class) and an ERROR F2P
    r = grade(DJANGO_LOG, f2p=["test_d (app.tests.ModelTests)", "test_a (app.tests.ModelTests)"],
              p2p=["test_same (app.tests.SecondTests)"], parser="parse_log_django")
    assert r.utility == -0.5 and not r.resolved


SYMPY_LOG = """\
+ : '>>>>> Start Test Output'
+ bin/test -C --verbose sympy/core/tests/test_a.py sympy/core/tests/test_b.py
============================= test process starts ==============================
executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.19-final-0) [CPython]
architecture:       64-bit
ground types:       python
random seed:        4242
hash randomization: on (PYTHONHASHSEED=1)

sympy/core/tests/test_a.py[4]
test_x ok
test_y F
test_same ok
test_w ok
sympy/core/tests/test_b.py[2]
test_same F
test_z E

________________________________________________________________________________
_________________ sympy/core/tests/test_a.py:test_y _________________
Traceback (most recent call last):
  File "/testbed/sympy/core/tests/test_a.py", line 9, in test_y
    assert False
AssertionError

========== tests finished: 3 passed, 2 failed, 1 exceptions, in 0.10 seconds ===========
DO *NOT* COMMIT!
+ : '>>>>> End Test Output'
"""


def test_sympy_snippet(tmp_path):
    assert parser_for_repo("sympy/sympy")[0] == "parse_log_sympy"
    r = grade(SYMPY_LOG, f2p=["test_x"], p2p=["test_w"], parser="sympy/sympy")
    assert r.status_map == {
        "sympy/core/tests/test_a.py:test_y": "FAILED",
        "test_x": "PASSED",
        "test_y": "FAILED",
        "test_same": "FAILED",  # same name in two files: last wins
        "test_w": "PASSED",
        "test_z": "ERROR",
    }
    assert r.duplicates == {"test_same": ["PASSED", "FAILED"]}
    assert [(o.test_id, o.status) for o in r.observations] == [
        ("test_x", "PASSED"), ("test_y", "FAILED"), ("test_same", "PASSED"),
        ("test_w", "PASSED"), ("test_same", "FAILED"), ("test_z", "ERROR"),
        ("sympy/core/tests/test_a.py:test_y", "FAILED"),
    ]
    assert r.resolved and r.utility == 1.0 and r.classification["strict"]
    r = grade(SYMPY_LOG, f2p=["test_x", "test_y", "test_z", "test_q"], p2p=["test_same"],
              parser="sympy")
    assert r.f2p == {"test_x": "PASSED", "test_y": "FAILED", "test_z": "ERROR",
                     "test_q": MISSING}
    assert r.p2p == {"test_same": "FAILED"}
    assert r.utility is None and not r.complete
    # the control observed everything -> the missing test_q counts as failed
    ctl = SYMPY_LOG.replace("test_w ok", "test_w ok\ntest_q F")
    a = grade(SYMPY_LOG, f2p=["test_x", "test_y", "test_z", "test_q"], p2p=["test_same"],
              parser="sympy", control_log=ctl)
    assert a.attributed and a.utility == 0.25 - 1.0
    assert not swebench_resolved(tmp_path, SYMPY_LOG, ["test_q"], [], "parse_log_sympy")


ASTROPY_LOG = (
    "+ : '>>>>> Start Test Output'\n"
    "+ pytest -rA astropy/units/tests/test_q.py\n"
    "PASSED astropy/units/tests/test_q.py::test_fmt[unit with space]\n"
    "FAILED astropy/units/tests/test_q.py::test_bad - AssertionError: a - b\n"
    "XFAIL astropy/units/tests/test_q.py::test_known - reason here\n"
    "\x1b[32mPASSED\x1b[0m astropy/units/tests/test_q.py::test_color\n"
    "astropy/units/tests/test_q.py::test_old PASSED\n"
    "SKIPPED [2] astropy/units/tests/test_q.py:40: needs scipy\n"
    "+ : '>>>>> End Test Output'\n"
    "+ echo '>>>>> Test Exit Code: 1'\n"
    ">>>>> Test Exit Code: 1\n"
)
Q = "astropy/units/tests/test_q.py::"


def test_astropy_snippet_pytest_v2(tmp_path):
    assert parser_for_repo("astropy/astropy")[0] == "parse_log_pytest_v2"
    r = grade(ASTROPY_LOG, f2p=[Q + "test_fmt[unit with space]", Q + "test_color"],
              p2p=[Q + "test_old"], parser="astropy/astropy")
    # report lines: spaces kept in ids, ANSI colour codes stripped, the old "<id> PASSED"
    # form read, an XFAIL line's " - reason" not part of its id
    assert r.status_map == {
        Q + "test_fmt[unit with space]": "PASSED",
        Q + "test_bad": "FAILED",
        Q + "test_known": "XFAIL",
        Q + "test_color": "PASSED",
        Q + "test_old": "PASSED",
    }
    assert r.resolved and r.utility == 1.0 and r.test_exit_code == 1
    assert r.classification == {
        "raw": False, "report_binary": True, "strict": True, "unknown": False,
    }
    assert r.resolved == swebench_resolved(
        tmp_path, ASTROPY_LOG, list(r.f2p), list(r.p2p), "parse_log_astropy")
    r = grade(ASTROPY_LOG, f2p=[Q + "test_known"], p2p=[Q + "test_bad"], parser="astropy/astropy")
    # the XFAIL line names test_known (pytest_v2 keys it with its reason appended)
    assert r.f2p == {Q + "test_known": "XFAIL"} and r.p2p == {Q + "test_bad": "FAILED"}
    assert r.parser_disagreements == [
        ParserDisagreement(Q + "test_known", "XFAIL", MISSING, "swebench_key_differs")]
    # listed as swebench's pytest_v2 keys it: read exactly, no disagreement
    r = grade(ASTROPY_LOG, f2p=[Q + "test_known - reason here"], p2p=[], parser="astropy")
    assert r.f2p == {Q + "test_known - reason here": "XFAIL"} and r.resolved
    assert r.parser_disagreements == [] and r.resolved_swebench_parser is True
    # the same log through parse_log_pytest (pytest-dev/pytest): the spaced id is found too
    r = grade(ASTROPY_LOG, f2p=[Q + "test_fmt[unit with space]"], p2p=[],
              parser="pytest-dev/pytest")
    assert r.f2p == {Q + "test_fmt[unit with space]": "PASSED"}
    assert [d.reason for d in r.parser_disagreements] == ["id_with_whitespace"]


# --------------------------------------------------------------------------- rules, errors


def test_empty_f2p_term_is_zero():
    log = harness_log("PASSED t.py::test_a\nPASSED t.py::test_b\n", 0)
    r = grade(log, f2p=[], p2p=["t.py::test_a"], parser="pytest")
    assert r.utility == 0.0
    assert r.resolved  # swebench: an empty F2P list counts as rate 1
    r = grade(log, f2p=[], p2p=["t.py::test_a", "t.py::test_c"], parser="pytest",
              control_log=log.replace("test_b", "test_c"))
    assert r.attributed and r.utility == -1.0


def test_exit_code_contradiction_is_rejected():
    """swebench: a non-zero test exit status with no FAILED/ERROR means the log lies."""
    log = harness_log("PASSED t.py::test_a\n", 1)
    r = grade(log, f2p=["t.py::test_a"], p2p=[], parser="pytest")
    assert r.f2p == {"t.py::test_a": "PASSED"}  # raw view keeps what the log said
    assert r.log_rejected == "exit_code_contradicts_log"
    assert (r.complete, r.resolved, r.utility) == (False, False, None)


def test_harness_failure_marker():
    log = ">>>>> Patch Apply Failed\nerror: patch failed: calc.py:1\n"
    r = grade(log, f2p=["t.py::test_a"], p2p=[], parser="pytest")
    assert r.log_rejected == "patch_apply_failed" and r.harness_exit == "patch_apply_failed"
    assert r.classification["unknown"] and not r.classification["raw"]
    neg = grade(log, f2p=["t.py::test_a"], p2p=[], parser="pytest", expected_resolved=False)
    assert neg.classification["raw"] is True


def test_no_markers_parses_whole_log():
    r = grade("PASSED t.py::test_a\nFAILED t.py::test_b - x\n", f2p=["t.py::test_a"],
              p2p=["t.py::test_b"], parser="pytest")
    assert r.region == "whole_log" and r.log_rejected is None
    assert r.complete and r.utility == 0.0 and not r.resolved
    assert [o.line_no for o in r.observations] == [1, 2]


def _combo_parser(log: str, test_spec) -> dict[str, str]:
    """A cross-line parser whose key never appears in the log ("ready" then "go")."""
    out: dict[str, str] = {}
    prev = None
    for line in log.split("\n"):
        if line == "go" and prev == "ready":
            out["combo"] = "PASSED"
        elif line.startswith("PASSED "):
            out[line.split()[1]] = "PASSED"
        prev = line
    return out


def test_cross_line_status_located_by_bisection():
    log = "noise\nPASSED t.py::a\nready\nnoise\nready\ngo\nPASSED t.py::b\n"
    r = grade(log, f2p=["combo"], p2p=["t.py::a", "t.py::b"], parser=_combo_parser)
    assert r.parser == "_combo_parser"
    assert [(o.test_id, o.line_no) for o in r.observations] == [
        ("t.py::a", 2), ("combo", 6), ("t.py::b", 7),
    ]
    assert r.resolved and r.utility == 1.0

def test_resolve_parser_names():
    assert resolve_parser("pytest")[0] == "parse_log_pytest"
    assert resolve_parser("parse_log_sympy")[0] == "parse_log_sympy"
    assert resolve_parser("django/django")[0] == "parse_log_django"
    fn = MAP_REPO_TO_PARSER["pydata/xarray"]
    assert resolve_parser(fn)[1] is fn


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"parser": "no_such_parser"}, "parser"),
        ({"parser": 3}, "parser"),
        ({"f2p": "t.py::test_a"}, "f2p"),
        ({"f2p": ["ok", 1]}, "f2p[1]"),
        ({"p2p": None}, "p2p"),
        ({"control_log": b"bytes"}, "control_log"),
        ({"harness_exit": 0}, "harness_exit"),
        ({"expected_resolved": "yes"}, "expected_resolved"),
    ],
)
def test_bad_input_names_field(kwargs, field):
    args = {"f2p": [], "p2p": [], "parser": "pytest", **kwargs}
    with pytest.raises(ValueError, match="^" + re.escape(field) + ": "):
        grade("PASSED t.py::test_a\n", **args)


def test_bad_log_text_and_repo():
    with pytest.raises(ValueError, match="^log_text: "):
        grade(b"PASSED x", f2p=[], p2p=[], parser="pytest")
    with pytest.raises(ValueError, match="^repo: "):
        parser_for_repo("nobody/nothing")


STATUSES = ["PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", None]  # None = not in the log


@settings(max_examples=200, deadline=None)
@given(
    f2p=st.lists(st.sampled_from(STATUSES), min_size=0, max_size=5),
    p2p=st.lists(st.sampled_from(STATUSES), min_size=0, max_size=5),
)
def test_utility_formula_property(f2p, p2p):
    """Independent oracle for swebench semantics and the utility U."""
    f_ids = [f"t.py::test_f{i}" for i in range(len(f2p))]
    p_ids = [f"t.py::test_p{i}" for i in range(len(p2p))]
    lines = [f"{s} {t}" for t, s in zip(f_ids + p_ids, f2p + p2p, strict=True) if s]
    log = harness_log("\n".join(lines + ["== 1 passed in 0.01s =="]), None)
    r = grade(log, f2p=f_ids, p2p=p_ids, parser="pytest")
    f_pass = sum(s in ("PASSED", "XFAIL") for s in f2p)
    p_ok = all(s in ("PASSED", "XFAIL", "SKIPPED") for s in p2p)
    # an empty map without swebench's SUITE_RAN evidence is a rejected log
    complete = bool(lines) and all(s is not None for s in f2p + p2p)
    assert r.complete == complete
    if complete:
        expect = (f_pass / len(f2p) if f2p else 0.0) - (0.0 if p_ok else 1.0)
        assert r.utility == pytest.approx(expect)
    else:
        assert r.utility is None and r.classification["unknown"]
    assert r.resolved == (bool(lines) and f_pass == len(f2p) and p_ok)
    assert (r.resolution_status == "RESOLVED_FULL") == r.resolved
    if r.resolved and f2p:
        assert r.utility == 1.0
    assert r.classification["strict"] == (complete and all(s == "PASSED" for s in f2p + p2p))


# --------------------------------------------------------------------------- CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eval.grade", *args], cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=120,
    )


CLI_KEYS = ["resolved", "complete", "utility", "attributed", "f2p", "p2p", "missing",
            "duplicates", "classification", "resolved_swebench_parser", "parser_disagreements"]


def test_cli_django(tmp_path):
    inst = tmp_path / "task.json"
    inst.write_text(json.dumps({
        "instance_id": "django__django-1", "repo": "django/django",
        "FAIL_TO_PASS": json.dumps(["test_a (app.tests.ModelTests)"]),
        "PASS_TO_PASS": json.dumps(["test_c (app.tests.ModelTests)"]),
    }))
    log = tmp_path / "test_output.txt"
    log.write_text(DJANGO_LOG)
    proc = run_cli("--instance", str(inst), "--log", str(log))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert list(out) == CLI_KEYS
    assert out["resolved"] is True and out["utility"] == 1.0 and out["complete"] is True
    assert out["p2p"] == {"test_c (app.tests.ModelTests)": "SKIPPED"}
    assert out["classification"]["strict"] is False


def test_cli_bundled_with_control(tmp_path, calc_logs):
    inst = tmp_path / "task.json"
    inst.write_text(json.dumps({
        "instance_id": "calc-1", "repo": "local/calc", "log_parser": "pytest",
        "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P,
    }))
    (tmp_path / "out.txt").write_text(calc_logs["syntax"][0])
    (tmp_path / "ctl.txt").write_text(calc_logs["empty"][0])
    proc = run_cli("--instance", str(inst), "--log", str(tmp_path / "out.txt"),
                   "--control-log", str(tmp_path / "ctl.txt"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert list(out) == CLI_KEYS
    assert out["utility"] == -1.0 and out["attributed"] is True and out["complete"] is False
    assert out["missing"] == F2P + P2P
    assert out["p2p"]["test_calc.py::test_mul[\\u03c0]"] == MISSING
    proc = run_cli("--instance", str(inst), "--log", str(tmp_path / "out.txt"))
    out = json.loads(proc.stdout)
    assert out["utility"] is None and out["classification"]["unknown"] is True


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"repo": "django/django", "PASS_TO_PASS": "[]"}, "FAIL_TO_PASS"),
        ({"repo": "django/django", "FAIL_TO_PASS": "[not json", "PASS_TO_PASS": "[]"},
         "FAIL_TO_PASS"),
        ({"repo": "django/django", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": {"a": 1}},
         "PASS_TO_PASS"),
        ({"FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]"}, "repo"),
        ({"repo": "nobody/nothing", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]"}, "repo"),
        ({"repo": "django/django", "log_parser": "nope", "FAIL_TO_PASS": "[]",
          "PASS_TO_PASS": "[]"}, "log_parser"),
    ],
)
def test_cli_malformed_instance(tmp_path, row, needle):
    inst = tmp_path / "task.json"
    inst.write_text(json.dumps(row))
    log = tmp_path / "log.txt"
    log.write_text(DJANGO_LOG)
    proc = run_cli("--instance", str(inst), "--log", str(log))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert f"field {needle}" in proc.stderr and str(inst) in proc.stderr


def test_cli_bad_paths(tmp_path):
    inst = tmp_path / "task.json"
    inst.write_text("{not json")
    log = tmp_path / "log.txt"
    log.write_text(DJANGO_LOG)
    proc = run_cli("--instance", str(inst), "--log", str(log))
    assert proc.returncode == 2 and str(inst) in proc.stderr and "JSON" in proc.stderr
    inst.write_text(json.dumps({"repo": "django/django", "FAIL_TO_PASS": [], "PASS_TO_PASS": []}))
    missing = tmp_path / "nope.txt"
    proc = run_cli("--instance", str(inst), "--log", str(missing))
    assert proc.returncode == 2 and str(missing) in proc.stderr
    proc = run_cli("--instance", str(inst), "--log", str(log), "--control-log", str(missing))
    assert proc.returncode == 2 and str(missing) in proc.stderr
    proc = run_cli("--log", str(log))
    assert proc.returncode == 2 and "--instance" in proc.stderr

