"""The layout rules (design page, "Layers"): import direction, no cycles, sizes."""

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from conftest import REPO_ROOT

PACKAGES = ("ecredit_trl", "sandbox", "eval")


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO_ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    out = set()
    mod = _module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            # `from pkg import module` imports pkg.module when it is one
            out.update(f"{name}.{a.name}" for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    files = {}
    for pkg in PACKAGES:
        for path in (REPO_ROOT / pkg).rglob("*.py"):
            files[_module_name(path)] = path
    graph = defaultdict(set)
    for mod, path in files.items():
        for name in _imports(path):
            if name in files and name != mod:
                graph[mod].add(name)
        graph[mod]
    return graph


def _top(name: str) -> str:
    return name.split(".")[0]


def test_datasets_folder_never_shadows_hf_datasets():
    assert not (REPO_ROOT / "datasets" / "__init__.py").exists()
    out = subprocess.run(
        [sys.executable, "-c", "import datasets, sys; print(datasets.__file__); "
         "print(hasattr(datasets, 'load_dataset'))"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert "site-packages" in out[0], out
    assert out[1] == "True"


def test_sandbox_knows_nothing_of_training_or_grading():
    bad = []
    for path in (REPO_ROOT / "sandbox").rglob("*.py"):
        for name in _imports(path):
            if _top(name) in ("ecredit_trl", "eval", "trl", "swebench", "peft"):
                bad.append(f"{path.name}: {name}")
    assert bad == []


def test_eval_does_not_import_trl_or_training():
    bad = []
    for path in (REPO_ROOT / "eval").rglob("*.py"):
        for name in _imports(path):
            if _top(name) in ("trl", "ecredit_trl", "peft"):
                bad.append(f"{path.name}: {name}")
    assert bad == []


def test_no_import_cycles_inside_a_package():
    """Function-level imports count too: a lazy import is still a dependency."""
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if _top(nxt) != _top(node):
                continue
            # a package's __init__ importing its own submodules is not a cycle of concepts
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []


def test_subpackages_hold_the_concepts_of_design():
    for sub in ("credit", "agent", "policy", "runs"):
        assert (REPO_ROOT / "ecredit_trl" / sub / "__init__.py").exists(), sub
    for top in ("config.py", "trainer.py", "train.py"):
        assert (REPO_ROOT / "ecredit_trl" / top).exists(), top
    flat = sorted(p.name for p in (REPO_ROOT / "ecredit_trl").glob("*.py"))
    assert set(flat) <= {"__init__.py", "config.py", "trainer.py", "train.py", "study.py"}, flat


def test_no_module_or_function_too_long_without_a_stated_reason():
    """~500 lines a module, ~80 a function; a longer one says why in its docstring
    (the words "long because")."""
    bad = []
    for pkg in PACKAGES:
        for path in (REPO_ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            tree = ast.parse(text)
            doc = ast.get_docstring(tree) or ""
            if len(text.splitlines()) > 520 and "long because" not in doc:
                bad.append(f"{path.relative_to(REPO_ROOT)}: {len(text.splitlines())} lines")
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > 85 and "long because" not in (ast.get_docstring(node) or ""):
                        bad.append(f"{path.relative_to(REPO_ROOT)}:{node.name}: {n} lines")
    assert bad == []
