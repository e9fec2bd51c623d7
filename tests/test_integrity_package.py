"""The integrity package (:mod:`eval.integrity`): every rule that decides whether an observation
is scored, charged to the policy or excluded lives there, one module per rule, as pure
functions; the sandbox only reports facts (the exit-class vocabulary, defined once in
:mod:`sandbox.trials.trial`) and the pool executes the retry policy it is handed."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import itertools
from pathlib import Path

import pytest

from eval.integrity.attribution import FAILURE_CLASSES, attribute_failure
from eval.integrity.controls import ControlFacts, control_facts
from eval.integrity.exits import (
    ATTRIBUTABLE,
    ATTRIBUTABLE_CLASSES,
    DECISIONS,
    EXIT_RULE,
    GRADED,
    INFRA_CLASSES,
    INFRASTRUCTURE,
    exit_rule,
)
from eval.integrity.missing import ATTRIBUTED, COMPLETE, UNAVAILABLE, missing_observations
from eval.integrity.retry import NOT_TRANSIENT, RetryPolicy, decide_retry
from sandbox.trials.pool import RETRY_FAILURE, RETRY_INFRA, VerifierPool, no_retry
from sandbox.trials.trial import EXIT_CLASSES, Limits, TrialResult, TrialSpec

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sandbox", "eval", "ecredit_trl", "benchmarks")
LIM = {"timeout_s": 5.0, "memory": "2g", "pids": 1024, "cpus": 1.0, "output_bytes": 1000}

RULES = {  # module -> the names that make its rule
    "exits": ("EXIT_RULE", "ATTRIBUTABLE_CLASSES", "INFRA_CLASSES", "exit_rule"),
    "attribution": ("attribute_failure", "Attribution", "FAILURE_CLASSES",
                    "UNATTRIBUTED_REASONS", "LIMIT_KEYS"),
    "agent": ("classify_exec_failure", "pids_exhausted", "memory_exhausted",
              "agent_failure_verdict", "agent_failure_slot", "AgentFailureVerdict",
              "AGENT_EXEC_CLASSES", "AGENT_FAILURE_CLASSES"),
    "failure_value": ("failure_utility",),
    "missing": ("missing_observations", "has_utility", "READINGS"),
    "retry": ("RetryPolicy", "decide_retry", "NOT_TRANSIENT"),
    "controls": ("ControlFacts", "control_facts"),
    "nodes": ("NODE_UNHELD", "on_unheld_node", "exec_on_unheld_node"),
}


def _modules(*packages: str):
    for pkg in packages:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            yield p.relative_to(ROOT).as_posix(), ast.parse(p.read_text(), str(p))


def _imported(tree) -> set[str]:
    """Every module a file imports (function-level imports included)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
    return out


@pytest.mark.parametrize("module", sorted(RULES))
def test_each_rule_is_importable_from_its_module(module):
    mod = importlib.import_module(f"eval.integrity.{module}")
    for name in RULES[module]:
        assert hasattr(mod, name), f"eval.integrity.{module}.{name}"
        assert name in mod.__all__
    assert mod.__doc__ and "design page" in mod.__doc__ or module == "controls"


def test_package_face_lists_every_rule_module_and_imports_nothing():
    init = ROOT / "eval" / "integrity" / "__init__.py"
    tree = ast.parse(init.read_text())
    assert not _imported(tree) - {"__future__"}
    doc = ast.get_docstring(tree)
    for module in RULES:
        assert f":mod:`eval.integrity.{module}`" in doc, module
    on_disk = {p.stem for p in init.parent.glob("*.py")} - {"__init__"}
    assert on_disk == set(RULES)


def test_every_exit_class_has_exactly_one_decision():
    assert set(EXIT_RULE) == set(EXIT_CLASSES) and len(EXIT_CLASSES) == len(set(EXIT_CLASSES))
    assert set(EXIT_RULE.values()) == set(DECISIONS)
    assert set(ATTRIBUTABLE_CLASSES) | set(INFRA_CLASSES) | {"ok"} == set(EXIT_CLASSES)
    assert not set(ATTRIBUTABLE_CLASSES) & set(INFRA_CLASSES)
    for c in EXIT_CLASSES:
        assert exit_rule(c) in DECISIONS
    with pytest.raises(ValueError, match="exit_class"):
        exit_rule("no_such_class")
    assert FAILURE_CLASSES == tuple(f"artifact_{c}" for c in ATTRIBUTABLE_CLASSES)


# -- the table: every class × control healthy/unhealthy × what its retry did ----------------

RETRY_OUTCOMES = ("same", "other_attributable", "ok", "infra_error", "not_retried")


def _expected(cls: str, healthy: bool, retry: str) -> tuple[str | None, str | None, str | None]:
    """(what the policy asks of the pool after the first attempt, failure_class,
    unattributed reason), written out from the rule's text."""
    if cls == "ok":
        return None, None, None
    if cls == "infra_error":
        return RETRY_INFRA, None, None
    ask = RETRY_FAILURE
    if retry == "ok":  # the failure did not recur: graded from the retry's own log
        return ask, None, None
    if not healthy:
        return ask, None, "control_failed"
    return ask, {"same": f"artifact_{cls}", "other_attributable": f"artifact_{cls}",
                 "ok": None, "infra_error": None, "not_retried": None}[retry], {
        "same": None, "other_attributable": None, "ok": None,
        "infra_error": "retry_infra_error", "not_retried": "not_retried"}[retry]


@pytest.mark.parametrize("cls,healthy,retry", list(itertools.product(
    EXIT_CLASSES, (True, False), RETRY_OUTCOMES)))
def test_decision_table(cls, healthy, retry):
    ask, want_class, want_reason = _expected(cls, healthy, retry)
    first = TrialResult(trial_id="t", exit_class=cls, test_s=1.0)
    assert RetryPolicy()(first, 0, 0) == ask
    assert RetryPolicy(failure_retries=0)(first, 0, 0) == (None if ask == RETRY_FAILURE else ask)
    control = ControlFacts("ok" if healthy else "timeout", 0.5, dict(LIM))
    if ask == RETRY_FAILURE and retry != "not_retried":
        other = next(c for c in ATTRIBUTABLE_CLASSES if c != cls)
        final = {"same": cls, "other_attributable": other, "ok": "ok",
                 "infra_error": "infra_error"}[retry]
        failed = [first.attempt_summary()]
    else:
        final, failed = cls, []
    raised = {**LIM, "timeout_s": 2 * LIM["timeout_s"]} if cls == "timeout" and failed else None
    att = attribute_failure(final, failed_attempts=failed, limits=dict(LIM), test_s=2.0,
                            controls=[control], retry_limits=raised)
    assert (att.failure_class, att.unattributed) == (want_class, want_reason)
    if EXIT_RULE[cls] != ATTRIBUTABLE:  # graded or infrastructure: never charged, no reason
        assert att == type(att)(None)
        assert EXIT_RULE[cls] in (GRADED, INFRASTRUCTURE)


def test_the_controls_must_share_the_trials_limits_and_exist():
    failed = [{"exit_class": "oom", "test_s": 1.0}]
    args = {"failed_attempts": failed, "limits": dict(LIM), "test_s": 1.0}
    assert attribute_failure("oom", controls=[], **args).unattributed == "no_control"
    other = ControlFacts("ok", 0.5, {**LIM, "memory": "4g"})
    assert attribute_failure("oom", controls=[other], **args).unattributed == "limits_differ"
    ok = ControlFacts("ok", 0.5, {**LIM, "source": "another label"})
    assert attribute_failure("oom", controls=[ok], **args).failure_class == "artifact_oom"


# -- the retry policy, executed by the pool ----------------------------------------------------

class _Scripted:
    """A runtime whose trials end in the given exit classes, one per attempt."""

    def __init__(self, *classes: str, error: str | None = None) -> None:
        self.classes, self.error, self.calls = list(classes), error, 0
        self.timeouts: list[float] = []

    def run_trial(self, spec):
        cls = self.classes[min(self.calls, len(self.classes) - 1)]
        self.calls += 1
        self.timeouts.append(spec.timeout_s)
        return TrialResult(trial_id=spec.trial_id, exit_class=cls,
                           error=self.error if cls == "infra_error" else None)


def _spec():
    return TrialSpec(trial_id="t", image="localhost/x", eval_script="", timeout_s=5.0,
                     limits=Limits(memory="2g", pids=1024, cpus=1.0), max_output_bytes=1000)


def _run(runtime, **kw):
    with VerifierPool(runtime, max_concurrency=1, retry_backoff_s=0.0, **kw) as pool:
        return pool.submit(_spec()).result(), dict(pool.stats)


def test_the_pool_retries_nothing_by_default():
    rt = _Scripted("timeout", "ok")
    res, stats = _run(rt)
    assert (res.exit_class, res.attempts, res.failed_attempts, rt.calls) == ("timeout", 1, [], 1)
    assert stats["failure_retries"] == stats["retries"] == 0
    assert no_retry(res, 0, 0) is None
    with pytest.raises(TypeError, match="retry"):
        VerifierPool(rt, retry=1)


def test_the_pool_executes_the_policy_it_is_handed():
    # an attributable failure runs once more; the first attempt stays on record
    rt = _Scripted("oom", "oom", "ok")
    res, stats = _run(rt, retry=RetryPolicy())
    assert (res.exit_class, res.attempts, rt.calls) == ("oom", 1, 2)
    assert [a["exit_class"] for a in res.failed_attempts] == ["oom"]
    assert (stats["failure_retries"], stats["retries"]) == (1, 0)
    # infra errors run again up to max_retries, counted in attempts
    rt = _Scripted("infra_error")
    res, stats = _run(rt, retry=RetryPolicy(max_retries=2))
    assert (res.exit_class, res.attempts, len(res.retried_errors), rt.calls) == (
        "infra_error", 3, 2, 3)
    assert stats == {"submitted": 1, "completed": 1, "retries": 2, "infra_errors": 1,
                     "failure_retries": 0}
    # a failure retry that ends in infra_error may still use the infra retries
    rt = _Scripted("timeout", "infra_error", "timeout")
    res, stats = _run(rt, retry=RetryPolicy(max_retries=1))
    assert (res.exit_class, res.attempts, rt.calls) == ("timeout", 2, 3)
    assert [a["exit_class"] for a in res.failed_attempts] == ["timeout"]
    # a timeout's retry (and the infra retries after it) ran under twice the timeout
    assert rt.timeouts == [5.0, 10.0, 10.0] and res.limits["timeout_s"] == 5.0
    assert res.retry_limits == {**res.limits, "timeout_s": 10.0}
    rt = _Scripted("oom", "oom")  # other limits are not raised: the same spec again
    res, _ = _run(rt, retry=RetryPolicy())
    assert rt.timeouts == [5.0, 5.0] and res.retry_limits is None
    # an error a retry cannot fix is not retried
    rt = _Scripted("infra_error", error=f"{NOT_TRANSIENT[0]} no branch x")
    res, _ = _run(rt, retry=RetryPolicy(max_retries=3))
    assert (res.attempts, rt.calls) == (1, 1)


def test_retry_policy_checks_its_counts():
    with pytest.raises(ValueError, match="max_retries"):
        RetryPolicy(max_retries=-1)
    with pytest.raises(ValueError, match="failure_retries"):
        RetryPolicy(failure_retries=2)
    assert decide_retry("ok", None, 0, 0, max_retries=5, failure_retries=1) is None
    assert decide_retry("pids", None, 1, 0, max_retries=5, failure_retries=1) is None
    assert decide_retry("infra_error", None, 0, 5, max_retries=5, failure_retries=1) is None


# -- the missing-observation rule and the control facts ---------------------------------------

@pytest.mark.parametrize("complete,control,reading", [
    (True, None, COMPLETE), (True, False, COMPLETE), (True, True, COMPLETE),
    (False, True, ATTRIBUTED), (False, False, UNAVAILABLE), (False, None, UNAVAILABLE)])
def test_missing_observation_rule(complete, control, reading):
    assert missing_observations(complete, control) == reading


def test_control_facts_one_constructor_for_every_source():
    res = TrialResult(trial_id="c", exit_class="ok", test_s=0.12345, limits=dict(LIM))
    facts = control_facts(res)
    assert facts == ControlFacts("ok", 0.123, dict(LIM), "empty")
    assert control_facts(res.to_json()) == facts  # a trial row
    assert control_facts(dataclasses.asdict(facts)) == facts  # a checkpoint's saved facts
    assert control_facts(dataclasses.asdict(ControlFacts("ok", 1.0, None, "gold"))).kind == "gold"
    assert control_facts({}) == ControlFacts("ok")  # a checkpoint older than the facts
    assert ControlFacts.of(res) == facts


# -- one definition: the vocabulary, and who reaches the rules --------------------------------

EXIT_STRINGS = set(EXIT_CLASSES)
AGENT_STRINGS = {"agent_pids", "agent_oom", "agent_disk_budget"}


def _literal_sets(tree, strings: set[str]):
    for n in ast.walk(tree):
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            elts = n.elts
        elif isinstance(n, ast.Dict):
            elts = [k for k in n.keys if k is not None]
        else:
            continue
        found = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in strings]
        if len(found) >= 2:
            yield n.lineno, found


def test_the_class_strings_are_defined_once():
    """No module but sandbox/trials/trial.py spells out a list, set or table of exit classes,
    and none but eval/integrity/agent.py one of the agent failure classes."""
    where = {}
    for path, tree in _modules(*PACKAGES):
        for line, found in _literal_sets(tree, EXIT_STRINGS):
            where.setdefault("exit", []).append((path, line, found))
        for line, found in _literal_sets(tree, AGENT_STRINGS):
            where.setdefault("agent", []).append((path, line, found))
    assert {p for p, _, _ in where["exit"]} == {"sandbox/trials/trial.py"}, where["exit"]
    assert {p for p, _, _ in where["agent"]} == {"eval/integrity/agent.py"}, where["agent"]


def test_the_rule_names_are_assigned_in_one_module_each():
    owner = {"EXIT_CLASSES": "sandbox/trials/trial.py", "RESOURCE_CLASSES": "sandbox/trials/trial.py",
             "ATTRIBUTABLE_CLASSES": "eval/integrity/exits.py",
             "FAILURE_CLASSES": "eval/integrity/attribution.py",
             "AGENT_FAILURE_CLASSES": "eval/integrity/agent.py",
             "AGENT_EXEC_CLASSES": "eval/integrity/agent.py",
             "NOT_TRANSIENT": "eval/integrity/retry.py"}
    for path, tree in _modules(*PACKAGES):
        for n in tree.body:  # module-level definitions (a method may share a rule's name)
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in {
                    "attribute_failure", "classify_exec_failure", "failure_utility",
                    "missing_observations", "decide_retry", "control_facts", "ControlFacts"}:
                assert path.startswith("eval/integrity/"), (path, n.name)
        for n in ast.walk(tree):
            targets = n.targets if isinstance(n, ast.Assign) else (
                [n.target] if isinstance(n, ast.AnnAssign) else [])
            for t in targets:
                if isinstance(t, ast.Name) and t.id in owner:
                    assert path == owner[t.id], (path, t.id)


def test_one_adapter_each_and_the_sandbox_decides_nothing():
    users = {path for path, tree in _modules("ecredit_trl")
             if any(m.startswith("eval.integrity") for m in _imported(tree))}
    assert users == {"ecredit_trl/runs/outcomes.py"}  # training's (and the pilot's) adapter
    for path, tree in _modules("sandbox"):
        assert not any(m == "eval" or m.startswith("eval.") for m in _imported(tree)), path
    eval_users = {path for path, tree in _modules("eval") if not path.startswith(
        "eval/integrity/") and any(m.startswith("eval.integrity") for m in _imported(tree))}
    # evaluation's adapter; the grader applies the missing-observation rule; the controls
    # and task-building CLIs hand their pools the retry policy; the doctor's adapter
    assert eval_users <= {"eval/evaluation/verification.py", "eval/grading/grader.py",
                          "eval/controls.py", "eval/tasks/bundled/build.py",
                          "eval/doctor/verdicts.py"}, eval_users
