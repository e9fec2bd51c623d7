"""The layout rules (design page, "Layers"): import direction, no cycles, layers inside
sandbox/ and eval/, imports at the module top, sizes."""

import ast
import re
import subprocess
import sys
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

from conftest import REPO_ROOT

PACKAGES = ("ecredit_trl", "sandbox", "eval")


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO_ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _from_module(node: ast.ImportFrom, pkg: str) -> str:
    """The absolute module of ``from X import ...`` written in package ``pkg``."""
    if not node.level:
        return node.module or ""
    base = pkg.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    out = set()
    mod = _module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            name = _from_module(node, pkg)
            out.add(name)
            # `from pkg import module` imports pkg.module when it is one
            out.update(f"{name}.{a.name}" for a in node.names)
    return out


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


def _edges(path: Path, modules: set[str]) -> set[str]:
    """First-party modules ``path`` names in its imports, at any depth, each resolved to the
    module it needs: ``from pkg import sub`` is an edge to ``pkg.sub`` when that is a module,
    ``from pkg import name`` an edge to ``pkg`` (the package face) otherwise."""
    out = set()
    mod = _module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = _from_module(node, pkg)
            names = [f"{name}.{a.name}" if f"{name}.{a.name}" in modules else name
                     for a in node.names]
        else:
            continue
        for name in names:
            while name not in modules and "." in name:
                name = name.rpartition(".")[0]
            if name in modules and name != mod:
                out.add(name)
    return out


@lru_cache(maxsize=1)
def _first_party_graph() -> dict[str, set[str]]:
    """Module -> the first-party modules it imports (function-level imports included)."""
    files = {}
    for pkg in PACKAGES:
        for path in (REPO_ROOT / pkg).rglob("*.py"):
            files[_module_name(path)] = path
    return {mod: _edges(path, set(files)) for mod, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per back edge found by a depth-first walk ([] when the graph is acyclic)."""
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_import_cycles_inside_a_package():
    """Function-level imports count too: a lazy import is still a dependency. No exemption for
    a package face importing its own submodules: a face is empty or re-exports without a
    cycle."""
    assert _cycles(_first_party_graph()) == []


def _subpackage(mod: str) -> str:
    """``ecredit_trl.credit.planning`` -> ``ecredit_trl.credit``; a top-level module is its own."""
    return ".".join(mod.split(".")[:2])


def test_no_import_cycles_between_subpackages():
    """e.g. ecredit_trl.credit <-> ecredit_trl.runs, sandbox.runtimes <-> sandbox.workspace."""
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, deps in _first_party_graph().items():
        graph[_subpackage(mod)].update(_subpackage(d) for d in deps if _subpackage(d) != _subpackage(mod))
    assert _cycles(graph) == []


#: sandbox/ bottom to top; a module imports only from its own subpackage or a lower rank
#: (images is used by runtimes' level and up and uses podman_runtime: the same rank;
#: doctor, the host's facts and a node's gate, is used by cluster; bounds imports only
#: file_formats, which imports nothing).
SANDBOX_RANKS = {"sandbox.bounds": 0, "sandbox.file_formats": 0, "sandbox.snapshots": 0,
                 "sandbox.trials": 1, "sandbox.runtimes": 2, "sandbox.images": 2, "sandbox.workspace": 3,
                 "sandbox.doctor": 3, "sandbox.cluster": 4, "sandbox.backend": 5,
                 "sandbox.__main__": 6}
#: eval/: the files helpers; tasks, grading, integrity, statistics, metrics; the evaluation
#: stages; the CLIs on top.
EVAL_RANKS = {"eval.files": 0, "eval.tasks": 1, "eval.grading": 1, "eval.integrity": 1,
              "eval.stats": 1, "eval.metrics": 1, "eval.evaluation": 2}
EVAL_CLI_RANK = 3


def _rank_violations(top: str, rank) -> list[str]:
    bad = []
    for mod, deps in _first_party_graph().items():
        if not mod.startswith(top + "."):
            continue
        for dep in deps:
            a, b = _subpackage(mod), _subpackage(dep)
            if dep.startswith(top + ".") and a != b and rank(b) > rank(a):
                bad.append(f"{mod} -> {dep}")
    return sorted(bad)


def test_sandbox_layers_go_down():
    """snapshots < trials < runtimes (images beside it) < workspace < cluster < backend."""
    for sub in SANDBOX_RANKS:
        assert (REPO_ROOT / Path(*sub.split("."))).exists() or \
            (REPO_ROOT / (Path(*sub.split(".")).as_posix() + ".py")).exists(), sub
    unranked = sorted({_subpackage(m) for m in _first_party_graph() if m.startswith("sandbox.")}
                      - set(SANDBOX_RANKS))
    assert unranked == [], "give each new sandbox subpackage a rank in SANDBOX_RANKS"
    assert _rank_violations("sandbox", SANDBOX_RANKS.__getitem__) == []


def test_eval_layers_go_down():
    """tasks, grading, integrity, stats below the evaluation stages; the CLIs on top."""
    assert _rank_violations("eval", lambda s: EVAL_RANKS.get(s, EVAL_CLI_RANK)) == []


#: The most first-party imports a function may hold in ecredit_trl/, eval/, sandbox/.
MAX_FUNCTION_LEVEL_IMPORTS = 40
#: One of these on an import's first line says why it is not at the module top.
IMPORT_REASONS = ("optional extra", "start-up")


def _function_level_first_party_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, imported module.name, source line) of each first-party name imported
    inside a function (one entry per imported name)."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((REPO_ROOT / pkg).rglob("*.py")):
            text = path.read_text()
            lines = text.splitlines()
            rel = path.relative_to(REPO_ROOT).as_posix()
            for fn in ast.walk(ast.parse(text)):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        base = "." * node.level + (node.module or "")
                        names = [f"{base}.{a.name}" for a in node.names]
                    else:
                        continue
                    for name in names:
                        if getattr(node, "level", 0) or name.split(".")[0] in PACKAGES:
                            out.append((rel, node.lineno, name, lines[node.lineno - 1]))
    # a nested function's import is walked from each enclosing function: count it once
    return sorted(set(out))


def test_first_party_imports_sit_at_the_module_top():
    """An import inside a function only for an optional extra (ray, podman, vllm, matplotlib,
    mkdocs) or a measured start-up cost, with the reason on its line; at most 40 in all."""
    found = _function_level_first_party_imports()
    unexplained = [f"{f}:{n}: {line.strip()}" for f, n, _, line in found
                   if not any(r in line for r in IMPORT_REASONS)]
    assert unexplained == []
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, [f"{f}:{n} {name}" for f, n, name, _ in found]


def test_folders_show_the_architecture():
    """eval/ keeps its CLIs and files at the top (<= 15 modules); sandbox/ is grouped into
    subpackages with no flat ray_* files; no package shadows a library it uses."""
    assert len(list((REPO_ROOT / "eval").glob("*.py"))) <= 15
    subs = [p for p in (REPO_ROOT / "sandbox").iterdir() if (p / "__init__.py").is_file()]
    assert len(subs) >= 3, subs
    assert sorted(p.name for p in (REPO_ROOT / "sandbox").rglob("ray_*.py")) == []
    shadowing = {"ray", "git", "torch", "trl", "transformers", "datasets", "podman", "swebench"}
    for pkg in PACKAGES:
        dirs = {p.name for p in (REPO_ROOT / pkg).rglob("*") if (p / "__init__.py").is_file()}
        assert dirs & shadowing == set(), pkg


def test_subpackages_hold_the_concepts_of_design():
    for sub in ("credit", "agent", "policy", "runs", "trainer"):
        assert (REPO_ROOT / "ecredit_trl" / sub / "__init__.py").exists(), sub
    for top in ("config.py", "train.py"):
        assert (REPO_ROOT / "ecredit_trl" / top).exists(), top
    flat = sorted(p.name for p in (REPO_ROOT / "ecredit_trl").glob("*.py"))
    assert set(flat) <= {"__init__.py", "config.py", "train.py", "study.py"}, flat


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


MAPPED_PACKAGES = ("ecredit_trl", "eval")


def _unmapped(pkg_dir: Path) -> list[str]:
    """Modules and subpackages of ``pkg_dir`` its ``__init__.py`` docstring does not name
    (as ``:mod:`.name```, ```name.py```, ```name/``` or another backticked form)."""
    doc = ast.get_docstring(ast.parse((pkg_dir / "__init__.py").read_text())) or ""
    names = {p.stem for p in pkg_dir.glob("*.py") if p.name != "__init__.py"}
    names |= {p.name for p in pkg_dir.iterdir() if (p / "__init__.py").is_file()}
    return sorted(n for n in names if not re.search(rf"[`.]{re.escape(n)}(\.py|/)?`", doc))


def test_every_module_is_named_in_its_package_map():
    """Each package's docstring is its map (design page, "Where to change what" for the
    whole): a new module is named there, so the maps cannot drift."""
    bad = {}
    for top in MAPPED_PACKAGES:
        for init in sorted((REPO_ROOT / top).rglob("__init__.py")):
            missing = _unmapped(init.parent)
            if missing:
                bad[init.parent.relative_to(REPO_ROOT).as_posix()] = missing
    assert bad == {}
