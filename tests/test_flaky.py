"""eval.grading.flaky: flaky listed tests are named per task, and the admission rule for them."""

from eval.grading.flaky import FLAKY_RULE, find_flaky, flaky_rule, varying_statuses

F2P = ["t.py::test_f1", "t.py::test_f2"]
P2P = ["t.py::test_p1", "t.py::test_p2", "t.py::test_p3"]


def _rep(**kw) -> dict[str, str]:
    base = {"t.py::test_f1": "PASSED", "t.py::test_f2": "PASSED", "t.py::test_p1": "PASSED",
            "t.py::test_p2": "PASSED", "t.py::test_p3": "PASSED"}
    return {**base, **{f"t.py::{k}": v for k, v in kw.items()}}


def test_varying_statuses():
    assert varying_statuses([_rep()]) == {}  # one repeat says nothing
    assert varying_statuses([_rep(), _rep()]) == {}
    assert varying_statuses([_rep(), _rep(test_p2="FAILED"), _rep()]) == {
        "t.py::test_p2": ["PASSED", "FAILED", "PASSED"]}
    # absent in one repeat = MISSING there
    assert varying_statuses([{"a": "PASSED"}, {}]) == {"a": ["PASSED", "MISSING"]}


def test_find_flaky_names_tests_per_role():
    gold = [_rep(), _rep(test_f2="FAILED")]
    empty = [_rep(test_f1="FAILED", test_f2="FAILED"),
             _rep(test_f1="FAILED", test_f2="FAILED", test_p3="ERROR"),
             _rep(test_f1="FAILED", test_f2="FAILED")]
    fl = find_flaky({"gold": gold, "empty": empty}, F2P, P2P)
    assert fl.f2p == ["t.py::test_f2"] and fl.p2p == ["t.py::test_p3"] and fl.any
    assert fl.statuses == {"gold": {"t.py::test_f2": ["PASSED", "FAILED"]},
                           "empty": {"t.py::test_p3": ["PASSED", "ERROR", "PASSED"]}}
    assert fl.repeats == {"gold": 2, "empty": 3}
    assert fl.to_json()["f2p"] == ["t.py::test_f2"]
    # not listed: ignored
    assert not find_flaky({"gold": [{"x": "PASSED"}, {"x": "FAILED"}]}, F2P, P2P).any


def test_flaky_rule():
    fl = find_flaky({"gold": [_rep(), _rep(test_f2="FAILED", test_p1="FAILED")]}, F2P, P2P)
    reasons, p2p, dropped = flaky_rule(fl, P2P)
    assert reasons == ["flaky FAIL_TO_PASS: t.py::test_f2"]
    assert p2p == ["t.py::test_p2", "t.py::test_p3"] and dropped == ["t.py::test_p1"]
    assert flaky_rule(fl, P2P, keep_flaky=True) == ([], P2P, [])
    none = find_flaky({"gold": [_rep(), _rep()]}, F2P, P2P)
    assert flaky_rule(none, P2P) == ([], P2P, [])
    assert "not admitted" in FLAKY_RULE and "--keep-flaky" in FLAKY_RULE


def test_drop_flaky_p2p_and_slot_counts():
    from dataclasses import dataclass

    from eval.grading.flaky import drop_flaky_p2p, flaky_slot_counts

    @dataclass
    class T:
        instance_id: str
        PASS_TO_PASS: list

    tasks = [T("a", ["p1", "p2"]), T("b", ["p3"])]
    out = drop_flaky_p2p(tasks, {"a": ["p2"]})
    assert out == [T("a", ["p1"]), T("b", ["p3"])] and out[1] is tasks[1]
    assert tasks[0].PASS_TO_PASS == ["p1", "p2"]  # inputs untouched
    adm = {"repeats": 3, "flaky": {"a": {"f2p": [], "p2p": ["p2"]}, "b": {"f2p": ["f"], "p2p": []}},
           "p2p_dropped": {"a": ["p2"]}}
    slots = ["a", "a", "b", "b", "c"]
    assert flaky_slot_counts(slots, adm) == {
        "repeats": 3, "tasks_with_flaky": 2, "slots_of_flaky_tasks": 4,
        "slots_depending_on_flaky": 2, "p2p_tests_dropped": 1}  # b's flaky F2P (kept)
    assert flaky_slot_counts(slots, None)["repeats"] is None
