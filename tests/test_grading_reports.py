"""Every listed test found, no status read from captured output.

Three kinds of evidence:

* the SWE-bench project's own parser cases (its ``tests/test_log_parsers_python.py`` at
  ad89568 "cover skipped pytest grading end to end", newer than the swebench 5.0.2 we
  install, plus ``test_log_parsers_skip_summary.py`` / ``test_grading_truncated_ids.py`` on
  its main branch), ported to :func:`eval.grading.grader.grade` / :func:`eval.grading.log_parsing.read_log`;
* real pytest runs (``-rA``, ``-v``, both, ``CI=1``) of a project whose ids hold spaces,
  `` - ``, brackets and unicode and whose tests print forged status lines;
* a hypothesis property: random pytest logs -> exactly the ground-truth statuses, and where
  swebench's own verdict differs the disagreement is named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import swebench_resolved
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eval.grading.grader import MISSING, ParserDisagreement, grade, read_log
from eval.grading.pytest_report import fold_statuses, line_zones, read_report

REPO_ROOT = Path(__file__).resolve().parent.parent
PYTEST_PARSERS = ("parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2")


# --------------------------------------------------------------------------- SWE-bench cases

PYLINT_6528_SKIPPED_TESTS = [
    "tests/lint/unittest_lint.py::test_custom_should_analyze_file",
    "tests/lint/unittest_lint.py::test_multiprocessing[1]",
    "tests/lint/unittest_lint.py::test_multiprocessing[2]",
    "tests/test_self.py::TestRunTC::test_jobs_score",
]
PYLINT_6528_F2P = [
    "tests/lint/unittest_lint.py::test_recursive_ignore[--ignore-ignored_subdirectory]",
    "tests/lint/unittest_lint.py::test_recursive_ignore[--ignore-patterns-ignored_*]",
    "tests/test_self.py::TestRunTC::test_ignore_recursive",
    "tests/test_self.py::TestRunTC::test_ignore_pattern_recursive",
]


def test_swebench_skipped_verbose_nodeid():
    log = "\n".join([
        "tests/lint/unittest_lint.py::LintRunTC::test_jobs_option SKIPPED [1] Need 2 or more "
        "cores",
        "SKIPPED [1] tests/lint/unittest_lint.py:774: Need 2 or more cores",
    ])
    assert read_log(log, "parse_log_pytest_options").status_map == {
        "tests/lint/unittest_lint.py::LintRunTC::test_jobs_option": "SKIPPED"
    }


@pytest.mark.parametrize("parser", [*PYTEST_PARSERS, "parse_log_matplotlib"])
def test_swebench_skip_summary_without_nodeid_is_ignored(parser):
    log = "SKIPPED [1] tests/lint/unittest_lint.py:774: Need 2 or more cores"
    assert read_log(log, parser).status_map == {}
    log = ("SKIPPED [1] tests/test_a.py:12: needs network\nPASSED tests/test_a.py::test_real\n"
           "SKIPPED [23] tests/test_b.py:4: unsupported platform\n")
    assert read_log(log, parser).status_map == {"tests/test_a.py::test_real": "PASSED"}


@pytest.mark.parametrize("parser", [*PYTEST_PARSERS, "parse_log_seaborn"])
def test_swebench_status_before_and_after_nodeid(parser):
    log = "PASSED tests/test_widget.py::test_create\n" \
          "tests/test_widget.py::test_delete FAILED [100%]"
    assert read_log(log, parser).status_map == {
        "tests/test_widget.py::test_create": "PASSED",
        "tests/test_widget.py::test_delete": "FAILED",
    }


def test_swebench_pylint_6528_single_core_skips_resolve_full(tmp_path):
    log = "\n".join([
        *(f"{t} PASSED" for t in PYLINT_6528_F2P),
        *(f"{t} SKIPPED [1] Need 2 or more cores" for t in PYLINT_6528_SKIPPED_TESTS),
        "SKIPPED [1] tests/lint/unittest_lint.py:774: Need 2 or more cores",
        "SKIPPED [2] tests/lint/unittest_lint.py:803: Need 2 or more cores",
        "SKIPPED [1] tests/test_self.py:1050: Need 2 or more cores",
        "2 failed, 171 passed, 4 skipped, 1 xfailed",
    ])
    r = grade(log, f2p=PYLINT_6528_F2P, p2p=PYLINT_6528_SKIPPED_TESTS, parser="pylint-dev/pylint")
    assert r.p2p == dict.fromkeys(PYLINT_6528_SKIPPED_TESTS, "SKIPPED")
    assert r.f2p == dict.fromkeys(PYLINT_6528_F2P, "PASSED")
    assert "[1]" not in r.status_map and "[2]" not in r.status_map
    assert r.resolution_status == "RESOLVED_FULL" and r.resolved and r.utility == 1.0
    assert not r.classification["strict"]  # SKIPPED is never strict
    # swebench 5.0.2 reads no status-after-id line: the log holds no result for it
    assert r.resolved_swebench_parser is False
    assert not swebench_resolved(tmp_path, log, PYLINT_6528_F2P, PYLINT_6528_SKIPPED_TESTS,
                                 "parse_log_pylint")
    assert {d.reason for d in r.parser_disagreements} == {"swebench_rejects_log:no_test_results"}
    assert len(r.parser_disagreements) == 8


def test_swebench_seaborn_bare_status_lines():
    log = ("test_a.py::test_one PASSED [ 50%]\nPASSED\nFAILED\n PASSED\n"
           "test_b.py::test_two PASSED [100%]\n")
    assert read_log(log, "mwaskom/seaborn").status_map == {
        "test_a.py::test_one": "PASSED", "test_b.py::test_two": "PASSED"}


def test_swebench_genuine_skip_and_wrapped_progress_artifact():
    assert read_log("SKIPPED tests/test_a.py::test_flaky", "pytest").status_map == {
        "tests/test_a.py::test_flaky": "SKIPPED"}
    # pytest-dev__pytest-5262 / -7521 list "[100%]" as a P2P test: keep reading it
    r = grade("PASSED [100%]\n", f2p=[], p2p=["[100%]"], parser="pytest-dev/pytest")
    assert r.p2p == {"[100%]": "PASSED"} and r.parser_disagreements == []


TRUNC = "astropy/units/tests/test_format.py::test_ogip_grammar_fail[log(photon"


@pytest.mark.parametrize(
    ("lines", "want"),
    [
        ([f"PASSED {TRUNC} / m**2 s)]"], "PASSED"),  # unique prefix match
        ([f"FAILED {TRUNC} / m**2 s)] - x"], "FAILED"),
        ([f"PASSED {TRUNC} / m)]", f"XFAIL {TRUNC} / s)]"], "PASSED"),  # agree on outcome
        ([f"PASSED {TRUNC} / m)]", f"FAILED {TRUNC} / s)] - x"], MISSING),  # ambiguous
        (["PASSED astropy/units/tests/test_format.py::test_other[a]"], MISSING),
    ],
)
def test_swebench_truncated_ids(lines, want):
    """SWE-bench_Verified lists ids cut mid-parameter; swebench prefix-matches them when the
    candidates agree on pass-vs-fail (its test_grading_truncated_ids.py)."""
    r = grade("\n".join(lines) + "\n", f2p=[TRUNC], p2p=[], parser="astropy/astropy")
    assert r.f2p == {TRUNC: want}
    r = grade("PASSED a.py::test_x[case-1-extended]\n", f2p=["a.py::test_x[case-1]"], p2p=[],
              parser="astropy/astropy")
    assert r.missing == ["a.py::test_x[case-1]"]  # a balanced id never prefix-matches


# --------------------------------------------------------------------------- report structure


def test_zones_and_fold_rule():
    lines = ["+ pytest -rA", "=== test session starts ===", "a.py::t PASSED [ 50%]",
             "=== FAILURES ===", "PASSED a.py::u", "=== short test summary info ===",
             "FAILED a.py::u - x", "=== 1 failed, 1 passed in 0.01s ===", "PASSED a.py::u"]
    assert [z for z, _ in line_zones(lines)] == [
        "skip", "skip", "progress", "skip", "skip", "skip", "summary", "skip", "skip"]
    assert [(r.test_id, r.status, r.style) for r in read_report("\n".join(lines))] == [
        ("a.py::t", "PASSED", "verbose"), ("a.py::u", "FAILED", "summary")]
    # failing wins inside a session, the last session decides
    assert fold_statuses([("t", "FAILED", 0), ("t", "PASSED", 0)]) == {"t": "FAILED"}
    assert fold_statuses([("t", "PASSED", 0), ("t", "ERROR", 0)]) == {"t": "ERROR"}
    assert fold_statuses([("t", "FAILED", 0), ("t", "PASSED", 1)]) == {"t": "PASSED"}
    assert fold_statuses([("t", "SKIPPED", 0), ("t", "PASSED", 0)]) == {"t": "PASSED"}


def test_longest_listed_id_and_verbose_tail():
    log = ("=== test session starts ===\n"
           "t.py::test_p[x PASSED (y)] FAILED                        [ 50%]\n"
           "t.py::test_p[x] SKIPPED (needs a - b)                     [100%]\n")
    listed = ["t.py::test_p[x", "t.py::test_p[x PASSED (y)]", "t.py::test_p[x]"]
    r = grade(log, f2p=listed, p2p=[], parser="pytest")
    # the cut id "t.py::test_p[x" is never read off a line; swebench's truncated-id rule
    # prefix-matches it to both tests, which agree on not passing
    assert r.f2p == {"t.py::test_p[x": "FAILED", "t.py::test_p[x PASSED (y)]": "FAILED",
                     "t.py::test_p[x]": "SKIPPED"}
    assert [o.test_id for o in r.observations] == listed[1:]


def test_a_line_naming_a_listed_id_is_not_reused_for_a_cut_id():
    """Found by the property test: "t.py::test_p[:] ]" cut at its space is "t.py::test_p[:]",
    another listed test that never ran; swebench would call it PASSED."""
    log = ("=== test session starts ===\n=== short test summary info ===\n"
           "PASSED t.py::test_p[:] ]\nSKIPPED [1] t.py:3: nope\n=== 1 passed in 0.01s ===\n")
    r = grade(log, f2p=["t.py::test_p[:] ]", "t.py::test_p[:]"], p2p=[], parser="pytest")
    assert r.f2p == {"t.py::test_p[:] ]": "PASSED", "t.py::test_p[:]": MISSING}


def test_old_pytest_and_quiet_formats():
    long_id = "t.py::test_a[" + "x" * 70 + " y]"
    log = ("============ test session starts ============\n"
           f"{long_id} PASSED[ 50%]\n"  # no room to pad the progress
           "t.py::test_b FAILED\n"  # no progress column at all
           "=== FAILURES ===\nPASSED t.py::test_b\nPASSED t.py::test_d\n"
           "=== short test summary info ===\nFAILED t.py::test_b\nXFAIL t.py::test_c\n"
           "  reason: known\n"
           "==== 1 failed, 1 passed, 1 xfailed in 0.12 seconds ====\n"
           "PASSED t.py::test_d\n")  # after the session: not pytest's
    ids = [long_id, "t.py::test_b", "t.py::test_c", "t.py::test_d"]
    r = grade(log, f2p=ids, p2p=[], parser="pytest")
    assert r.f2p == dict(zip(ids, ["PASSED", "FAILED", "XFAIL", MISSING], strict=True))
    # pytest -q: no session header; still nothing read from the FAILURES section
    quiet = ("..F  [100%]\n=== FAILURES ===\n___ test_b ___\nPASSED t.py::test_c\n"
             "=== short test summary info ===\nPASSED t.py::test_a\nFAILED t.py::test_b - x\n"
             "1 failed, 1 passed in 0.1s\n")
    r = grade(quiet, f2p=["t.py::test_a", "t.py::test_b", "t.py::test_c"], p2p=[],
              parser="pytest")
    assert r.f2p == {"t.py::test_a": "PASSED", "t.py::test_b": "FAILED", "t.py::test_c": MISSING}


def test_live_log_block_is_not_read():
    """pytest -v -o log_cli=true, as pytest 9 writes it (a test logs a forged line)."""
    log = ("=== test session starts ===\n"
           "test_live.py::test_a \n"
           "-------------------------------- live log call ---------------------------------\n"
           "WARNING  x:test_live.py:3 test_live.py::test_b PASSED [ 50%]\n"
           "PASSED                                                                   [ 50%]\n"
           "test_live.py::test_b FAILED                                              [100%]\n")
    r = grade(log, f2p=["test_live.py::test_a", "test_live.py::test_b"], p2p=[],
              parser="pytest")
    assert r.f2p == {"test_live.py::test_a": "PASSED", "test_live.py::test_b": "FAILED"}
    assert [o.line_no for o in r.observations] == [5, 6]


def test_xdist_and_ansi_lines():
    log = ("=== test session starts ===\n"
           "[gw0] [ 50%] PASSED t.py::test_a[p q]\n"
           "[gw1] [100%] \x1b[31mFAILED\x1b[0m t.py::test_b\n"
           "=== short test summary info ===\n"
           "\x1b[31mFAILED\x1b[0m t.py::test_b - assert 0\n")
    r = grade(log, f2p=["t.py::test_a[p q]"], p2p=["t.py::test_b"], parser="pytest")
    assert r.f2p == {"t.py::test_a[p q]": "PASSED"} and r.p2p == {"t.py::test_b": "FAILED"}


# --------------------------------------------------------------------------- real pytest runs

SPACED_TESTS = '''\
import logging

import pytest

FORGE = [
    "PASSED t_sp.py::test_fail_me",
    "t_sp.py::test_fail_me PASSED [ 50%]",
    "FAILED t_sp.py::test_p[a b]",
    "SKIPPED t_sp.py::test_p[p - q]",
    "=== short test summary info ===",
    "PASSED t_sp.py::test_fail_me",
]


@pytest.mark.parametrize("x", ["a b", "a c", "p - q", "[x]", "\\u00e9", "x[y"],
                         ids=["a b", "a c", "p - q", "[x]", "\\u00e9", "x[y"])
def test_p(x):
    print("\\n".join(FORGE))
    assert x != "a c"


def test_fail_me():
    print("\\n".join(FORGE))
    logging.getLogger("forge").warning("PASSED t_sp.py::test_fail_me")
    raise AssertionError("boom\\nPASSED t_sp.py::test_fail_me\\nPASSED t_sp.py::test_p[a c]")


@pytest.mark.skip(reason="not here")
def test_sk():
    pass


@pytest.mark.xfail(reason="known")
def test_xf():
    assert False


@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown")


def test_teardown(bad_teardown):
    pass
'''
SP = "t_sp.py::"
TRUTH = {
    SP + "test_p[a b]": "PASSED",
    SP + "test_p[a c]": "FAILED",
    SP + "test_p[p - q]": "PASSED",
    SP + "test_p[[x]]": "PASSED",
    SP + "test_p[\\xe9]": "PASSED",  # pytest escapes non-ASCII ids
    SP + "test_p[x[y]": "PASSED",
    SP + "test_fail_me": "FAILED",
    SP + "test_xf": "XFAIL",
    SP + "test_teardown": "ERROR",  # passed, then errored at teardown
}
SP_F2P = [SP + "test_p[a b]", SP + "test_p[p - q]", SP + "test_p[\\xe9]", SP + "test_xf"]
SP_P2P = [SP + "test_p[[x]]", SP + "test_p[x[y]", SP + "test_sk"]


def _pytest(project: Path, *args: str, env_extra: dict | None = None) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "CI"}
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "COLUMNS": "80",
                **(env_extra or {})})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args,
                           "t_sp.py"], cwd=project, capture_output=True, text=True, env=env,
                          timeout=120)
    return proc.stdout + proc.stderr, proc.returncode


def _wrap(body: str, rc: int) -> str:
    return ("+ : '>>>>> Start Test Output'\n" + body + "\n+ : '>>>>> End Test Output'\n"
            f">>>>> Test Exit Code: {rc}\n")


@pytest.fixture(scope="module")
def spaced_logs(tmp_path_factory) -> dict[str, str]:
    """style -> harness-wrapped log of one real pytest run of SPACED_TESTS."""
    proj = tmp_path_factory.mktemp("spaced")
    (proj / "t_sp.py").write_text(SPACED_TESTS)
    runs = {"rA": (["-rA"], None), "v": (["-v"], None), "v_rA": (["-v", "-rA"], None),
            "rA_ci": (["-rA"], {"CI": "1"})}
    out = {}
    for name, (args, env) in runs.items():
        body, rc = _pytest(proj, *args, env_extra=env)
        assert rc == 1, body
        out[name] = _wrap(body, rc)
    return out


@pytest.mark.parametrize("style", ["rA", "v", "v_rA", "rA_ci"])
def test_real_pytest_logs_give_true_statuses(spaced_logs, style):
    log = spaced_logs[style]
    r = grade(log, f2p=list(TRUTH), p2p=[SP + "test_sk"], parser="pytest")
    assert r.f2p == TRUTH
    # pytest -rA names a skipped test only in "SKIPPED [1] t_sp.py:NN: reason"; -v names it
    assert r.p2p == {SP + "test_sk": "SKIPPED" if "v" in style.split("_") else MISSING}
    assert "PASSED t_sp.py::test_fail_me" in log  # the forged lines are in the log
    lines = log.split("\n")
    for o in r.observations:  # every status comes from a report line
        text = lines[o.line_no - 1]
        assert "Captured" not in text and not text.startswith("E ")
        assert text.startswith(o.status) if o.style == "summary" else o.status in text
    r = grade(log, f2p=SP_F2P, p2p=SP_P2P, parser="pytest")
    assert r.resolved is ("v" in style.split("_"))  # test_sk must be observed as SKIPPED
    assert r.f2p_passed == 4


def test_real_verbose_log_observations(spaced_logs):
    r = grade(spaced_logs["v"], f2p=SP_F2P, p2p=SP_P2P, parser="pytest")
    assert r.resolved and r.complete and r.utility == 1.0
    verbose = [o for o in r.observations if o.style == "verbose"]
    assert {o.test_id for o in verbose} >= set(SP_F2P + SP_P2P)
    # -v alone: swebench 5.0.2 reads only the default "-r fE" summary lines, and cuts ids
    assert r.resolved_swebench_parser is False
    assert {d.test_id: d.reason for d in r.parser_disagreements} == {
        SP + "test_p[a b]": "id_with_whitespace", SP + "test_p[p - q]": "id_with_whitespace",
        **dict.fromkeys([SP + "test_p[\\xe9]", SP + "test_xf", SP + "test_p[[x]]",
                         SP + "test_p[x[y]", SP + "test_sk"], "status_after_id")}
    # the teardown error: PASSED then ERROR on the verbose lines, not strict
    r = grade(spaced_logs["v"], f2p=[], p2p=[SP + "test_teardown"], parser="pytest")
    assert r.p2p == {SP + "test_teardown": "ERROR"} and r.utility == -1.0
    assert [o.status for o in r.observations if o.test_id == SP + "test_teardown"] == [
        "PASSED", "ERROR", "ERROR"]  # two verbose lines and the -r fE summary line


def test_real_rA_log_agrees_with_swebench_except_spaces(spaced_logs, tmp_path):
    log = spaced_logs["rA"]
    f2p, p2p = [SP + "test_p[[x]]", SP + "test_p[x[y]", SP + "test_xf"], [SP + "test_fail_me"]
    r = grade(log, f2p=f2p, p2p=p2p, parser="pytest")
    assert r.parser_disagreements == []
    assert r.resolved == r.resolved_swebench_parser == swebench_resolved(
        tmp_path, log, f2p, p2p, "parse_log_pytest") is False
    r = grade(log, f2p=f2p, p2p=[SP + "test_p[x[y]"], parser="pytest")
    assert r.resolved == swebench_resolved(tmp_path, log, f2p, [SP + "test_p[x[y]"],
                                           "parse_log_pytest") is True
    r = grade(log, f2p=[SP + "test_p[a b]", SP + "test_p[p - q]"], p2p=[], parser="pytest")
    assert r.resolved and not r.resolved_swebench_parser
    assert r.parser_disagreements == [
        ParserDisagreement(SP + "test_p[a b]", "PASSED", MISSING, "id_with_whitespace"),
        ParserDisagreement(SP + "test_p[p - q]", "PASSED", MISSING, "id_with_whitespace"),
    ]


def test_real_ci_multiline_message_cannot_forge_a_pass(spaced_logs):
    """CI=1 prints whole failure messages in the summary: the message's "PASSED <id>" line
    lands after the test's own FAILED line, in the same session; the failure stands."""
    log = spaced_logs["rA_ci"]
    assert "FAILED t_sp.py::test_fail_me - AssertionError: boom\nPASSED t_sp.py::test_fail_me" \
        in log
    r = grade(log, f2p=[SP + "test_fail_me", SP + "test_p[a c]"], p2p=[], parser="pytest")
    assert r.f2p == {SP + "test_fail_me": "FAILED", SP + "test_p[a c]": "FAILED"}
    assert r.duplicates == {SP + "test_fail_me": ["FAILED", "PASSED"],
                            SP + "test_p[a c]": ["FAILED", "PASSED"],
                            SP + "test_teardown": ["PASSED", "ERROR"]}
    assert not r.classification["strict"]  # conflicting observations are never strict
    # swebench keeps the last line: the forged pass
    assert r.parser_disagreements == [
        ParserDisagreement(SP + "test_fail_me", "FAILED", "PASSED", "fold_rule"),
        ParserDisagreement(SP + "test_p[a c]", "FAILED", MISSING, "id_with_whitespace")]


def _cli(tmp_path: Path, log: str, f2p: list[str], p2p: list[str]) -> dict:
    inst = tmp_path / "task.json"
    inst.write_text(json.dumps({"instance_id": "sp-1", "repo": "local/sp", "log_parser": "pytest",
                                "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}))
    (tmp_path / "log.txt").write_text(log)
    proc = subprocess.run([sys.executable, "-m", "eval.grade", "--instance", str(inst),
                           "--log", str(tmp_path / "log.txt")], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_cli_verbose_and_spaced_logs(spaced_logs, tmp_path):
    out = _cli(tmp_path, spaced_logs["v"], SP_F2P, SP_P2P)
    assert out["f2p"] == dict.fromkeys(SP_F2P[:3], "PASSED") | {SP + "test_xf": "XFAIL"}
    assert out["p2p"] == {SP + "test_p[[x]]": "PASSED", SP + "test_p[x[y]": "PASSED",
                          SP + "test_sk": "SKIPPED"}
    assert out["resolved"] is True and out["resolved_swebench_parser"] is False
    assert {d["reason"] for d in out["parser_disagreements"]} == {"status_after_id",
                                                                  "id_with_whitespace"}
    f2p = [SP + "test_p[a b]", SP + "test_p[p - q]"]
    out = _cli(tmp_path, spaced_logs["rA"], f2p, [SP + "test_p[a c]"])
    assert out["f2p"] == dict.fromkeys(f2p, "PASSED") and out["p2p"] == {
        SP + "test_p[a c]": "FAILED"}
    assert out["utility"] == 0.0 and out["complete"] is True
    assert [d["test_id"] for d in out["parser_disagreements"]] == [*f2p, SP + "test_p[a c]"]


# --------------------------------------------------------------------------- property


_PARAM = st.text(alphabet="ab -:é()[]", min_size=1, max_size=7) | st.sampled_from(
    ["x FAILED y", "q PASSED (r)", "s - t", "[100%]"])
_OUTCOMES = ["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS", "not_run"]


@st.composite
def pytest_logs(draw):
    """(log, ids, truth, facts): a random pytest run in one of three report styles."""
    params = draw(st.lists(_PARAM, min_size=1, max_size=6, unique=True))
    ids = [f"t.py::test_p[{p}]" for p in params] + ["t.py::test_plain"]
    outcomes = [draw(st.sampled_from(_OUTCOMES)) for _ in ids]
    style = draw(st.sampled_from(["rA", "v", "v_rA"]))
    verbose, summary = style != "rA", style != "v"
    ran = [(i, o) for i, o in zip(ids, outcomes, strict=True) if o != "not_run"]
    forged = draw(st.lists(st.tuples(st.sampled_from(ids), st.sampled_from(_OUTCOMES[:5]),
                                     st.booleans()), max_size=4))
    out = ["+ pytest -rA t.py", "=" * 10 + " test session starts " + "=" * 10,
           f"collected {len(ran)} items", ""]
    for k, (i, o) in enumerate(ran):
        if verbose:
            tail = {"SKIPPED": " (nope)", "XFAIL": " (known)", "XPASS": " (known)"}.get(o, "")
            out.append(f"{i} {o}{tail}    [{100 * (k + 1) // len(ran):3d}%]")
    if not verbose:
        out.append("t.py " + "".join("." for _ in ran) + "  [100%]")
    out += ["", "=" * 10 + " FAILURES " + "=" * 10, "_" * 5 + " test_p " + "_" * 5,
            "E   assert 0", "-" * 5 + " Captured stdout call " + "-" * 5]
    for i, o, first in forged:  # what a test printed: never a report line
        out.append(f"{o} {i}" if first else f"{i} {o} [ 50%]")
    if summary:
        out.append("=" * 10 + " short test summary info " + "=" * 10)
        for i, o in ran:
            if o == "SKIPPED":
                out.append("SKIPPED [1] t.py:3: nope")
            elif o in ("PASSED",):
                out.append(f"PASSED {i}")
            else:
                out.append(f"{o} {i}" + ("" if o == "PASSED" else " - AssertionError: a - b"))
    out.append("=" * 10 + " 1 failed in 0.01s " + "=" * 10)
    truth = {}
    for i, o in zip(ids, outcomes, strict=True):
        seen = o in ("PASSED", "FAILED", "ERROR", "XFAIL") or (o == "SKIPPED" and verbose)
        truth[i] = o if seen else MISSING
    facts = {"style": style, "forged": {i for i, _, _ in forged},
             "spaced": {i for i in ids if any(c.isspace() for c in i)}}
    rc = int(any(o in ("FAILED", "ERROR") for _, o in ran))
    return _wrap("\n".join(out), rc), ids, truth, facts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=pytest_logs(), data=st.data())
def test_random_pytest_logs_give_ground_truth(case, data, tmp_path_factory):
    log, ids, truth, facts = case
    cut = data.draw(st.integers(0, len(ids)))
    f2p, p2p = ids[:cut], ids[cut:]
    r = grade(log, f2p=f2p, p2p=p2p, parser="pytest")
    assert {**r.f2p, **r.p2p} == truth
    # every disagreement with swebench's own reading is named, with a reason we can explain
    for d in r.parser_disagreements:
        assert d.status == truth[d.test_id]
        allowed = {"fold_rule", "swebench_key_differs"}
        if d.test_id in facts["spaced"]:
            allowed.add("id_with_whitespace")
        if d.test_id in facts["forged"]:
            allowed |= {"captured_output", "log_rejected:no_test_results"}
        if facts["style"] != "rA":
            allowed.add("status_after_id")
        if facts["style"] != "rA" or facts["forged"]:  # swebench reads no / forged lines
            allowed |= {"swebench_rejects_log:no_test_results",
                        "swebench_rejects_log:exit_code_contradicts_log"}
        assert d.reason in allowed, (d, facts)
    if not r.parser_disagreements:
        tmp = tmp_path_factory.mktemp("prop")
        assert r.resolved == swebench_resolved(tmp, log, f2p, p2p, "parse_log_pytest")
    # honest -rA logs with plain ids: swebench's verdict is ours
    if facts["style"] == "rA" and not facts["forged"] and not facts["spaced"]:
        assert r.parser_disagreements == []
