"""The user commands of ``[project.scripts]``: each is the ``main()`` its ``python -m`` module
runs (the same parser), and every runnable module meant for users is one of them."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys

import pytest
import tomllib
from conftest import REPO_ROOT

SCRIPTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# runnable modules that are no user command, each with its reason
NOT_COMMANDS = {
    "eval/doctor/cli.py": "what `ecredit-sandbox doctor` runs as a subprocess",
    "eval/doctor/__main__.py": "what `ecredit-sandbox doctor` runs as a subprocess",
    "ecredit_trl/policy/warmstart.py": "the warm start's child process (built on first use)",
    "ecredit_trl/policy/scaffold_warmstart.py": "the scaffold warm start's child process",
}


def _source(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _main_guard_call(path) -> str | None:
    """The function the module's ``if __name__ == "__main__":`` block (or a ``__main__.py``'s
    top level) calls inside ``sys.exit(...)``; None when it has no such block."""
    tree = ast.parse(path.read_text())
    bodies = [tree.body] if path.name == "__main__.py" else []
    for node in tree.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"):
            bodies.append(node.body)
    for body in bodies:
        for stmt in body:
            for call in ast.walk(stmt):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "exit" and call.args
                        and isinstance(call.args[0], ast.Call)
                        and isinstance(call.args[0].func, ast.Name)):
                    return call.args[0].func.id
    return None


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_command_is_the_function_its_module_runs(name):
    module, _, func = SCRIPTS[name].partition(":")
    assert name.startswith("ecredit-") and func, SCRIPTS[name]
    assert callable(getattr(importlib.import_module(module), func)), SCRIPTS[name]
    assert _main_guard_call(REPO_ROOT / _source(module)) == func, SCRIPTS[name]


def test_every_runnable_module_is_a_command_or_says_why_not():
    declared = {_source(t.partition(":")[0]) for t in SCRIPTS.values()}
    runnable = set()
    for top in ("ecredit_trl", "eval", "sandbox"):
        for path in (REPO_ROOT / top).rglob("*.py"):
            if _main_guard_call(path) is not None:
                runnable.add(path.relative_to(REPO_ROOT).as_posix())
    assert sorted(runnable - declared - set(NOT_COMMANDS)) == []
    assert sorted((declared | set(NOT_COMMANDS)) - runnable) == []


def test_a_command_prints_the_help_of_its_module(capsys, monkeypatch):
    """``ecredit-compare --help`` (its entry function, in-process) == ``python -m
    eval.compare --help``."""
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to it, here and in the child
    module, _, func = SCRIPTS["ecredit-compare"].partition(":")
    with pytest.raises(SystemExit) as exc:
        getattr(importlib.import_module(module), func)(["--help"])
    assert exc.value.code == 0
    entry = capsys.readouterr().out
    run = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    assert entry.startswith("usage: python -m eval.compare") and entry == run.stdout
