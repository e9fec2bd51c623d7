"""Concepts defined once: each has one defining module, every other module imports it."""

import ast
from pathlib import Path

from conftest import REPO_ROOT

from ecredit_trl.credit.arms import ARMS, COUNTERFACTUAL_ARMS, CREDIT_ARMS
from eval.stats.pairs import STANDARD_PAIRS

PACKAGES = ("ecredit_trl", "eval", "sandbox", "benchmarks")
ARMS_MODULE = Path("ecredit_trl/credit/arms.py")


def _sources():
    for pkg in PACKAGES:
        for path in sorted((REPO_ROOT / pkg).rglob("*.py")):
            yield path.relative_to(REPO_ROOT), ast.parse(path.read_text())


def _arm_letter_literals(tree: ast.AST):
    """Tuple/list/set literals whose items are all arm letters (a written-out arm set)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 \
                and all(isinstance(e, ast.Constant) and e.value in ARMS for e in node.elts):
            yield node


def _assigned_values(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            yield node


def test_the_arms_are_defined_once():
    found = []
    for rel, tree in _sources():
        if rel == ARMS_MODULE:
            continue
        for assign in _assigned_values(tree):
            # the assigned value itself (not the pairs' inner tuples) spelling out arm letters
            if assign.value in set(_arm_letter_literals(assign)):
                found.append(f"{rel}:{assign.lineno}")
    assert found == [], f"arm sets written outside {ARMS_MODULE} (import them from there): {found}"


def test_the_checker_sees_a_written_out_arm_set():
    tree = ast.parse('X = ("O", "B")\nPAIRS = (("M", "B"),)\nY: tuple = ["M", "E"]\nZ = ("O", "x")\n')
    hits = [a.lineno for a in _assigned_values(tree) if a.value in set(_arm_letter_literals(a))]
    assert hits == [1, 3]


def test_derived_arm_sets_are_subsets_in_report_order():
    for sub in (COUNTERFACTUAL_ARMS, CREDIT_ARMS):
        assert set(sub) <= set(ARMS) and list(sub) == [a for a in ARMS if a in sub]
    assert "O" not in CREDIT_ARMS and set(COUNTERFACTUAL_ARMS) <= set(CREDIT_ARMS)
    assert all(a in ARMS and b in ARMS for a, b in STANDARD_PAIRS)


def test_standard_pairs_are_defined_once():
    found = [f"{rel}:{a.lineno}" for rel, tree in _sources() for a in _assigned_values(tree)
             for t in (a.targets if isinstance(a, ast.Assign) else [a.target])
             if isinstance(t, ast.Name) and t.id == "STANDARD_PAIRS"]
    assert found == [f"eval/stats/pairs.py:{_lineno('eval/stats/pairs.py', 'STANDARD_PAIRS')}"]


def _lineno(rel: str, name: str) -> int:
    for a in _assigned_values(ast.parse((REPO_ROOT / rel).read_text())):
        for t in (a.targets if isinstance(a, ast.Assign) else [a.target]):
            if isinstance(t, ast.Name) and t.id == name:
                return a.lineno
    raise AssertionError(f"{name} not assigned in {rel}")
