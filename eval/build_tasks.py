"""Build the bundled task set: real PyPI projects with one injected bug per task.

``python -m eval.build_tasks [--recipe datasets/bundled.yaml] [--out DIR] [--concurrency 2]
[--force]`` builds (or finds in the cache) the tasks of a recipe and prints a summary.

Pipeline (issue 3, "Bundled tasks from real code"):

1. **Sources.** Each project's sdist is fetched with ``pip download --no-deps --no-binary
   :all:`` (cached under ``$ECREDIT_CACHE/sdists``), its sha256 checked against the recipe,
   and unpacked (``__pycache__`` / ``*.pyc`` dropped) into a git repository whose single
   commit, the pristine tree, has fixed author/committer names and dates: its SHA depends
   only on the sdist.
2. **Candidates.** Every mutation site inside function bodies of the recipe's modules is
   listed (:func:`find_mutations`: comparison / arithmetic / augmented-assignment /
   boolean operator swap, negated condition, off-by-one integer, flipped bool constant,
   ``return None`` instead of the value, dropped statement). Each is a minimal textual edit
   of one source line (formatting kept; files are never re-unparsed). The list is shuffled
   with ``random.Random(f"{seed}:{project}")``, interleaved by kind, one per source line,
   and checked to parse and to change the AST. Each screened candidate becomes a commit
   whose parent is the pristine commit (again with fixed metadata).
3. **Screening** (Podman, :class:`sandbox.VerifierPool`): the pristine tree runs all the
   recipe's test files once; a candidate runs the test files of its module. FAIL_TO_PASS =
   listed tests PASSED on pristine and FAILED/ERROR on the mutant; PASS_TO_PASS = PASSED on
   both. A candidate is kept when FAIL_TO_PASS is non-empty (at most ``max_fail_to_pass``)
   and every other listed test still passes. Tests whose parsed id is ambiguous (seen twice
   in the pristine log, or truncated by the parser: unbalanced ``[``) run but are not listed.
4. **Controls**: gold (the reverse patch) must resolve and the empty patch must not (every
   F2P test failing, every P2P test passing), both graded by :func:`eval.grading.grade`.
5. The first ``target_per_project`` validated candidates of each project (in candidate
   order, so batch sizes never change the result) become tasks. The problem statement is
   made from the failing tests' ids and their ``E`` assertion lines in the mutant's log,
   never from the gold patch.

Output ``DIR`` (default ``$ECREDIT_CACHE/bundled/<recipe hash>``, ``$ECREDIT_CACHE``
defaulting to ``~/.cache/ecredit-trl``): ``tasks.jsonl`` (byte-identical across rebuilds
of the same recipe), ``build.json`` (timings, per-candidate outcomes), ``repos/<project>``
(git repositories holding every task's ``base_commit``). The directory is written under a
temporary name and renamed when complete. Only the recipe is committed to this project.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eval.files import datasets_dir
from eval.tasks import Task, read_rows, tasks_from_rows

#: Bump when the builder's output for the same recipe changes (it is part of the cache key).
BUILDER_VERSION = 2
PARSER = "parse_log_pytest"
PYTEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"
KINDS = ("compare", "arith", "augassign", "boolop", "negate", "constant", "bool", "return", "drop")

_GIT_DATE = "2000-01-01T00:00:00+0000"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "ecredit-trl builder", "GIT_AUTHOR_EMAIL": "builder@ecredit-trl.invalid",
    "GIT_COMMITTER_NAME": "ecredit-trl builder",
    "GIT_COMMITTER_EMAIL": "builder@ecredit-trl.invalid",
    "GIT_AUTHOR_DATE": _GIT_DATE, "GIT_COMMITTER_DATE": _GIT_DATE,
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C",
}


class BuildError(RuntimeError):
    """The bundled set could not be built; the message names the project and step."""


def cache_dir() -> Path:
    """``$ECREDIT_CACHE`` or ``~/.cache/ecredit-trl``."""
    env = os.environ.get("ECREDIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ecredit-trl"


def default_recipe_path() -> Path:
    return datasets_dir() / "bundled.yaml"


# ---------------------------------------------------------------------------
# recipe
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ModuleSpec:
    """A library file to mutate and the test files (repo-relative) that exercise it."""

    path: str
    tests: tuple[str, ...]
    coverage: str = "names"


@dataclass(frozen=True)
class ProjectRecipe:
    name: str
    version: str
    sdist: str
    sha256: str
    homepage: str
    env: dict
    test_support: tuple[str, ...]
    modules: tuple[ModuleSpec, ...]

    @property
    def all_tests(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for m in self.modules for t in m.tests))


@dataclass(frozen=True)
class Recipe:
    """A parsed ``bundled.yaml`` (see that file for the meaning of each field)."""

    schema: int
    seed: int
    trial_timeout_s: float
    target_per_project: int
    min_per_project: int
    min_total: int
    max_candidates_per_project: int
    max_fail_to_pass: int
    max_problem_tests: int
    kinds: tuple[str, ...]
    projects: tuple[ProjectRecipe, ...]

    def canonical(self) -> dict:
        return asdict(self)


def _need(d: dict, key: str, typ, where: str):
    if key not in d:
        raise ValueError(f"{where}: field {key!r} missing")
    value = d[key]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or isinstance(value, bool) and typ is not bool:
        raise ValueError(f"{where}: field {key!r} must be {typ.__name__}, got {value!r}")
    return value


def load_recipe(path: str | Path | None = None) -> Recipe:
    """Read and validate a recipe YAML (default ``datasets/bundled.yaml``).

    Raises:
        FileNotFoundError: no recipe file.
        ValueError: ``"<path>: <project>: field '<name>' ..."`` for a missing/mistyped field,
            an unknown mutation kind, a bad sha256, or a module listed twice.
    """
    import yaml

    path = Path(path) if path else default_recipe_path()
    if not path.is_file():
        raise FileNotFoundError(f"recipe not found: {path}")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    where = str(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping at top level")
    kinds = tuple(_need(raw, "kinds", list, where))
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"{where}: field 'kinds': unknown or empty {bad} (known: {KINDS})")
    projects = []
    for i, p in enumerate(_need(raw, "projects", list, where)):
        pw = f"{where}: projects[{i}]"
        if not isinstance(p, dict):
            raise ValueError(f"{pw}: expected a mapping")
        name = _need(p, "name", str, pw)
        pw = f"{where}: {name}"
        sha = _need(p, "sha256", str, pw)
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ValueError(f"{pw}: field 'sha256' must be 64 lowercase hex digits")
        mods = []
        for mpath, m in _need(p, "modules", dict, pw).items():
            mw = f"{pw}: modules[{mpath}]"
            if not isinstance(m, dict):
                raise ValueError(f"{mw}: expected a mapping with 'tests'")
            tests = _need(m, "tests", list, mw)
            if not tests or not all(isinstance(t, str) for t in tests):
                raise ValueError(f"{mw}: field 'tests' must be a non-empty list of paths")
            cov = m.get("coverage", "names")
            if cov not in ("names", "all"):
                raise ValueError(f"{mw}: field 'coverage' must be 'names' or 'all'")
            if mpath in tests:
                raise ValueError(f"{mw}: a module cannot be its own test file")
            mods.append(ModuleSpec(mpath, tuple(tests), cov))
        env = p.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ValueError(f"{pw}: field 'env' must map names to strings")
        projects.append(ProjectRecipe(
            name=name, version=str(_need(p, "version", str, pw)),
            sdist=_need(p, "sdist", str, pw), sha256=sha, homepage=str(p.get("homepage", "")),
            env=dict(sorted(env.items())), test_support=tuple(p.get("test_support") or ()),
            modules=tuple(mods)))
    names = [p.name for p in projects]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: field 'projects' lists a name twice: {names}")
    return Recipe(
        schema=_need(raw, "schema", int, where), seed=_need(raw, "seed", int, where),
        trial_timeout_s=_need(raw, "trial_timeout_s", float, where),
        target_per_project=_need(raw, "target_per_project", int, where),
        min_per_project=_need(raw, "min_per_project", int, where),
        min_total=_need(raw, "min_total", int, where),
        max_candidates_per_project=_need(raw, "max_candidates_per_project", int, where),
        max_fail_to_pass=_need(raw, "max_fail_to_pass", int, where),
        max_problem_tests=_need(raw, "max_problem_tests", int, where),
        kinds=kinds, projects=tuple(projects))


def recipe_hash(recipe: Recipe, image: str) -> str:
    """16 hex digits of sha256 over the recipe, :data:`BUILDER_VERSION` and the image name."""
    blob = json.dumps({"recipe": recipe.canonical(), "builder": BUILDER_VERSION,
                       "image": image}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# ---------------------------------------------------------------------------
# mutations
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Mutation:
    """One single-line textual edit: ``text[start:end]`` becomes ``replacement``.

    ``start``/``end`` are character offsets into the file's text; ``line`` is 1-based.
    ``description`` is build metadata (never shown to an agent).
    """

    path: str
    kind: str
    line: int
    start: int
    end: int
    original: str
    replacement: str
    description: str

    def apply(self, text: str) -> str:
        if text[self.start:self.end] != self.original:
            raise ValueError(f"mutation {self.path}:{self.line}: source text changed")
        return text[:self.start] + self.replacement + text[self.end:]


_CMP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
        ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"),
        ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}
_BIN = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"), ast.Div: ("/", "*"),
        ast.FloorDiv: ("//", "*"), ast.Mod: ("%", "//"), ast.BitAnd: ("&", "|"),
        ast.BitOr: ("|", "&"), ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<"),
        ast.Pow: ("**", "*")}
_BOOL = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
_DROPPABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Raise, ast.Delete)
_SIMPLE_EXPR = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)


def _op_regex(op: str) -> str:
    return r"\s+".join(re.escape(w) for w in op.split())


class _Finder(ast.NodeVisitor):
    """Collects mutation sites inside function bodies of one module."""

    def __init__(self, path: str, text: str, covered) -> None:
        self.path, self.text, self.covered = path, text, covered
        self.lines = text.split("\n")
        self.starts = [0]
        for line in self.lines[:-1]:
            self.starts.append(self.starts[-1] + len(line) + 1)
        self.stack: list[str] = []
        self.in_func = 0
        self.generator: list[bool] = []
        self.siblings: dict[int, int] = {}
        self.out: list[Mutation] = []

    # positions -------------------------------------------------------------
    def off(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "ignore"))

    def span(self, node) -> tuple[int, int] | None:
        if getattr(node, "end_lineno", None) is None or node.lineno != node.end_lineno:
            return None
        return self.off(node.lineno, node.col_offset), self.off(node.end_lineno, node.end_col_offset)

    def add(self, node, kind: str, start: int, end: int, repl: str, desc: str) -> None:
        original = self.text[start:end]
        if original == repl:
            return
        self.out.append(Mutation(self.path, kind, node.lineno, start, end, original, repl, desc))

    def gap_op(self, a, b, ops: tuple[str, ...], parens: bool = True):
        """(start, end, op) of the operator text between nodes ``a`` and ``b`` on one line."""
        sa, sb = self.span(a), self.span(b)
        if sa is None or sb is None or a.end_lineno != b.lineno:
            return None
        gap = self.text[sa[1]:sb[0]]
        edge = r"[\s)]*" if parens else r"\s*"
        tail = r"[\s(]*" if parens else r"\s*"
        for op in ops:
            m = re.fullmatch(f"({edge})({_op_regex(op)}){tail}", gap)
            if m:
                s = sa[1] + len(m.group(1))
                return s, s + len(m.group(2)), op
        return None

    # traversal ---------------------------------------------------------------
    def is_covered(self) -> bool:
        return self.covered is None or any(n in self.covered for n in self.stack)

    def visit_Module(self, node) -> None:
        for n in ast.walk(node):
            for fld in ("body", "orelse", "finalbody"):
                lst = getattr(n, fld, None)
                if isinstance(lst, list):
                    for s in lst:
                        self.siblings[id(s)] = len(lst)
        for stmt in node.body:
            self.visit(stmt)

    def visit_ClassDef(self, node) -> None:
        self.stack.append(node.name)
        for stmt in node.body:
            self.visit(stmt)
        self.stack.pop()

    def visit_FunctionDef(self, node) -> None:
        self.stack.append(node.name)
        self.in_func += 1
        self.generator.append(any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(node)))
        for stmt in node.body:
            if (stmt is node.body[0] and isinstance(stmt, ast.Expr)
                    and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
                continue  # docstring
            self.visit(stmt)
        self.generator.pop()
        self.in_func -= 1
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_JoinedStr(self, node) -> None:  # f-string internals: positions are unreliable
        return

    def visit_AnnAssign(self, node) -> None:
        self.check_drop(node)
        if node.value is not None:
            self.visit(node.value)

    def visit_arguments(self, node) -> None:  # lambda defaults/annotations
        return

    def generic_visit(self, node) -> None:
        if self.in_func and self.is_covered():
            self.check(node)
        super().generic_visit(node)

    # sites -------------------------------------------------------------------
    def check(self, node) -> None:
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            old, new = _CMP[type(node.ops[0])]
            hit = self.gap_op(node.left, node.comparators[0], (old,))
            if hit:
                self.add(node, "compare", hit[0], hit[1], new, f"{old!r} -> {new!r}")
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            old, new = _BIN[type(node.op)]
            hit = self.gap_op(node.left, node.right, (old,))
            if hit:
                self.add(node, "arith", hit[0], hit[1], new, f"{old!r} -> {new!r}")
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BIN:
            old, new = _BIN[type(node.op)]
            hit = self.gap_op(node.target, node.value, (old + "=",), parens=False)
            if hit:
                self.add(node, "augassign", hit[0], hit[1], new + "=", f"{old}= -> {new}=")
        elif isinstance(node, ast.BoolOp):
            old, new = _BOOL[type(node.op)]
            hit = self.gap_op(node.values[0], node.values[1], (old,))
            if hit:
                self.add(node, "boolop", hit[0], hit[1], new, f"{old!r} -> {new!r}")
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            self.check_negate(node)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sp = self.span(node)
            if sp and re.fullmatch(r"\d+", self.text[sp[0]:sp[1]]):
                for delta in (1, -1):
                    v = node.value + delta
                    if v >= 0:
                        self.add(node, "constant", sp[0], sp[1], str(v), f"{node.value} -> {v}")
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            sp = self.span(node)
            if sp and self.text[sp[0]:sp[1]] in ("True", "False"):
                self.add(node, "bool", sp[0], sp[1], str(not node.value),
                         f"{node.value} -> {not node.value}")
        elif isinstance(node, ast.Return) and node.value is not None and not self.generator[-1]:
            v = node.value
            if not (isinstance(v, ast.Constant) and (v.value is None or type(v.value) is bool)):
                sp = self.span(v)
                if sp:
                    self.add(node, "return", sp[0], sp[1], "None", "return value -> None")
        if isinstance(node, _DROPPABLE):
            self.check_drop(node)

    def check_negate(self, node) -> None:
        t = node.test
        sp = self.span(t)
        if sp is None:
            return
        seg = self.text[sp[0]:sp[1]]
        if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
            osp = self.span(t.operand)
            if osp is None:
                return
            inner = self.text[osp[0]:osp[1]]
            if isinstance(t.operand, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)):
                return
            self.add(node, "negate", sp[0], sp[1], inner, "drop 'not'")
        elif isinstance(t, _SIMPLE_EXPR):
            self.add(node, "negate", sp[0], sp[1], f"not {seg}", "negate condition")
        else:
            self.add(node, "negate", sp[0], sp[1], f"not ({seg})", "negate condition")

    def check_drop(self, node) -> None:
        if not self.in_func or not self.is_covered():
            return
        if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Call):
            return
        if isinstance(node, ast.AnnAssign) and node.value is None:
            return
        sp = self.span(node)
        if sp is None:
            return
        line = self.lines[node.lineno - 1]
        ls = self.starts[node.lineno - 1]
        before, after = self.text[ls:sp[0]], line[sp[1] - ls:]
        if before.strip() or (after.strip() and not after.strip().startswith("#")) or ";" in line:
            return
        if self.siblings.get(id(node), 0) <= 1:
            self.add(node, "drop", sp[0], sp[1], "pass", "statement -> pass")
        else:
            end = ls + len(line) + 1 if node.lineno < len(self.lines) else ls + len(line)
            self.add(node, "drop", ls, end, "", "drop statement")


def find_mutations(path: str, text: str, kinds=KINDS, covered_names: set[str] | None = None
                   ) -> list[Mutation]:
    """Every mutation site of ``kinds`` inside function bodies of ``text`` (Python source).

    Args:
        path: repo-relative file path (recorded on each mutation).
        covered_names: when given, only functions whose own name or an enclosing
            function/class name is in this set are mutated.

    Returns: mutations sorted by (start, kind, replacement); not yet checked to parse.

    Raises: SyntaxError when ``text`` does not parse.
    """
    tree = ast.parse(text)
    finder = _Finder(path, text, covered_names)
    finder.visit(tree)
    out = [m for m in finder.out if m.kind in kinds]
    out.sort(key=lambda m: (m.start, m.end, m.kind, m.replacement))
    return out


_DUMPS: dict[str, str] = {}


def mutation_is_valid(text: str, m: Mutation) -> bool:
    """The mutated text parses and its AST differs from the original's."""
    key = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if key not in _DUMPS:
        _DUMPS[key] = ast.dump(ast.parse(text))
    try:
        return ast.dump(ast.parse(m.apply(text))) != _DUMPS[key]
    except (SyntaxError, ValueError):
        return False


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def choose_candidates(project: ProjectRecipe, files: dict[str, str], recipe: Recipe
                      ) -> list[Mutation]:
    """The ordered candidate list of one project (deterministic for a recipe).

    All sites of all modules, shuffled with ``random.Random(f"{seed}:{name}")``, then taken
    round-robin over ``recipe.kinds`` (in shuffled order within a kind), at most one per
    source line, each checked by :func:`mutation_is_valid`, up to
    ``max_candidates_per_project``.
    """
    sites: list[Mutation] = []
    for mod in project.modules:
        covered = None
        if mod.coverage == "names":
            covered = set()
            for t in mod.tests:
                covered |= _words(files[t])
        sites += find_mutations(mod.path, files[mod.path], recipe.kinds, covered)
    rng = random.Random(f"{recipe.seed}:{project.name}")
    rng.shuffle(sites)
    buckets = {k: [m for m in sites if m.kind == k] for k in recipe.kinds}
    out: list[Mutation] = []
    used_lines: set[tuple[str, int]] = set()
    pos = dict.fromkeys(recipe.kinds, 0)
    while len(out) < recipe.max_candidates_per_project and any(
            pos[k] < len(buckets[k]) for k in recipe.kinds):
        for k in recipe.kinds:
            while pos[k] < len(buckets[k]):
                m = buckets[k][pos[k]]
                pos[k] += 1
                if (m.path, m.line) in used_lines or not mutation_is_valid(files[m.path], m):
                    continue
                used_lines.add((m.path, m.line))
                out.append(m)
                break
            if len(out) >= recipe.max_candidates_per_project:
                break
    return out


# ---------------------------------------------------------------------------
# git
# ---------------------------------------------------------------------------

class GitRepo:
    """A git repository written with fixed identities and dates (reproducible SHAs)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def git(self, *args: str, input: bytes | None = None, env: dict | None = None) -> str:
        proc = subprocess.run(["git", "-C", str(self.path), *args], input=input,
                              capture_output=True, env={**os.environ, **_GIT_ENV, **(env or {})})
        if proc.returncode != 0:
            raise BuildError(f"git {' '.join(args[:3])} in {self.path} failed: "
                             f"{proc.stderr.decode(errors='replace').strip()[:500]}")
        return proc.stdout.decode("utf-8", errors="surrogateescape")

    def init_pristine(self, message: str) -> str:
        """Commit the working tree as the root commit on ``main``; returns its SHA."""
        self.git("init", "-q")
        self.git("symbolic-ref", "HEAD", "refs/heads/main")
        self.git("add", "-A", "-f", ".")
        tree = self.git("write-tree").strip()
        sha = self.git("commit-tree", tree, "-m", message).strip()
        self.git("update-ref", "refs/heads/main", sha)
        return sha

    def commit_file(self, parent: str, path: str, content: bytes, message: str, ref: str) -> str:
        """A commit = ``parent`` with ``path`` replaced by ``content``; ref'd at ``ref``."""
        tag = hashlib.sha256(ref.encode()).hexdigest()[:12]
        index = self.path / ".git" / f"ecredit-index-{os.getpid()}-{tag}"
        env = {"GIT_INDEX_FILE": str(index)}
        try:
            mode = self.git("ls-tree", parent, "--", path).split()[0]
            self.git("read-tree", parent, env=env)
            blob = self.git("hash-object", "-w", "--no-filters", "--stdin", input=content).strip()
            self.git("update-index", "--cacheinfo", f"{mode},{blob},{path}", env=env)
            tree = self.git("write-tree", env=env).strip()
        finally:
            index.unlink(missing_ok=True)
        sha = self.git("commit-tree", tree, "-p", parent, "-m", message).strip()
        self.git("update-ref", ref, sha)
        return sha

    def diff(self, a: str, b: str) -> str:
        """``git diff --full-index a b`` (binary-safe text patch from tree a to tree b)."""
        return self.git("diff", "--no-color", "--no-ext-diff", "--full-index", "--binary", a, b)

    def archive(self, sha: str) -> bytes:
        proc = subprocess.run(["git", "-C", str(self.path), "archive", "--format=tar", sha],
                              capture_output=True, env={**os.environ, **_GIT_ENV})
        if proc.returncode != 0:
            raise BuildError(f"git archive {sha} failed: {proc.stderr.decode()[:300]}")
        return proc.stdout


# ---------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------

def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(project: ProjectRecipe, cache: Path, log=print) -> Path:
    """The project's sdist in ``cache/sdists`` (``pip download`` when absent), sha256-checked.

    Raises: BuildError when pip fails, the file name differs from the recipe, or the
    sha256 does not match (the bad download is deleted).
    """
    dest = cache / "sdists" / project.sdist
    if dest.is_file() and _sha256_file(dest) == project.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ecredit-sdist-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-q", "-d", tmp,
               f"{project.name}=={project.version}"]
        log(f"[{project.name}] pip download {project.name}=={project.version}")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / project.sdist
        if proc.returncode != 0 or not got.is_file():
            raise BuildError(f"{project.name}: pip download failed (exit {proc.returncode}; "
                             f"files {os.listdir(tmp)}): {(proc.stdout + proc.stderr)[-800:]}")
        digest = _sha256_file(got)
        if digest != project.sha256:
            raise BuildError(f"{project.name}: sha256 of {project.sdist} is {digest}, the recipe "
                             f"pins {project.sha256}")
        tmp_dest = dest.with_name(dest.name + f".tmp-{os.getpid()}")
        shutil.copyfile(got, tmp_dest)
        os.replace(tmp_dest, dest)
    return dest


def unpack_sdist(sdist: Path, dest: Path) -> None:
    """Unpack ``sdist`` (.tar.gz) into ``dest`` without its top folder, ``__pycache__`` and
    ``*.pyc``; regular files and folders only.

    Raises: BuildError for a member outside the top folder or an unsafe path.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist, "r:*") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) < 2:
                continue
            rel = Path(*parts[1:])
            if rel.is_absolute() or ".." in rel.parts:
                raise BuildError(f"{sdist.name}: unsafe member {member.name!r}")
            if "__pycache__" in rel.parts or rel.suffix == ".pyc":
                continue
            target = dest / rel
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                os.chmod(target, 0o755 if member.mode & 0o100 else 0o644)


# ---------------------------------------------------------------------------
# eval scripts and problem statements
# ---------------------------------------------------------------------------

def _restore_block(path: str, content: bytes) -> str:
    """Bash that rewrites ``path`` with ``content``: a quoted heredoc for plain text ending
    in a newline, base64 otherwise."""
    q = "'" + path.replace("'", "'\\''") + "'"
    d = os.path.dirname(path)
    mk = f"mkdir -p '{d}' && " if d else ""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    tag = "ECREDIT_EOF_" + hashlib.sha256(content).hexdigest()[:12]
    if text is not None and text.endswith("\n") and "\r" not in text and tag not in text:
        return f"{mk}cat > {q} <<'{tag}'\n{text}{tag}\n"
    import base64

    b64 = base64.encodebytes(content).decode()
    return f"{mk}base64 -d > {q} <<'{tag}'\n{b64}{tag}\n"


def make_eval_script(project: ProjectRecipe, tests: tuple[str, ...], files: dict[str, bytes]
                     ) -> str:
    """Eval script of a bundled task: restore the listed test files (and the project's
    ``test_support`` files) to their base content, run pytest on ``tests`` between the
    SWE-bench markers, and record the test command's exit status like swebench 5 does
    (``>>>>> Test Exit Code: N`` after the end marker)."""
    lines = ["#!/bin/bash", f"# ecredit-trl bundled task: {project.name} {project.version}",
             "set -uo pipefail", "cd /testbed", "export PYTHONDONTWRITEBYTECODE=1",
             "# fixed str hashing: set/dict orders in test output repeat from run to run",
             "export PYTHONHASHSEED=0"]
    for k, v in project.env.items():
        lines.append(f"export {k}={shlex.quote(v)}")
    lines.append("# test files are restored to their base content before the run")
    body = "\n".join(lines) + "\n"
    for path in dict.fromkeys((*project.test_support, *tests)):
        body += _restore_block(path, files[path])
    body += ("echo '>>>>> Start Test Output'\n"
             f"{PYTEST_CMD} {' '.join(shlex.quote(t) for t in tests)}\n"
             "SWEBENCH_TEST_EXIT_CODE=$?\n"
             "echo '>>>>> End Test Output'\n"
             "echo \">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE\"\n")
    return body


_HEADER = re.compile(r"^_{3,} (.+?) _{3,}$")
_ADDR = re.compile(r"0x[0-9a-fA-F]{6,}")
_NOISE = re.compile(r"^(Use -v to get more diff|Use -v to get the full diff|Omitting \d+ "
                    r"identical items, use -vv to show|Full diff:)$")


def failure_messages(log: str, ids: list[str], max_lines: int = 6) -> dict[str, list[str]]:
    """test id -> the ``E`` lines pytest printed in that test's failure section.

    Sections are matched by their header (``test_name``, ``Class.test_name`` or ``ERROR at
    setup of ...``). Memory addresses are scrubbed (``0x…``) so the text is reproducible.
    """
    want: dict[str, str] = {}
    for i in ids:
        tail = i.split("::", 1)[1] if "::" in i else i
        want.setdefault(tail.replace("::", "."), i)
    out: dict[str, list[str]] = {}
    current: str | None = None
    for line in log.splitlines():
        m = _HEADER.match(line)
        if m:
            name = re.sub(r"^ERROR at (setup|teardown) of ", "", m.group(1))
            current = want.get(name)
            continue
        if line.startswith("=") and line.endswith("="):
            current = None
            continue
        if current and line.startswith("E "):
            msgs = out.setdefault(current, [])
            msg = _ADDR.sub("0x…", line[1:].strip())[:200]
            if _NOISE.match(msg):
                continue
            if msg and len(msgs) < max_lines and (not msgs or msgs[-1] != msg):
                msgs.append(msg)
    return out


def make_problem_statement(project: ProjectRecipe, tests: tuple[str, ...], f2p: list[str],
                           messages: dict[str, list[str]], max_tests: int) -> str:
    """Issue-style text from the failing tests' ids and assertion lines (never the patch)."""
    env = " ".join(f"{k}={v}" for k, v in project.env.items())
    cmd = f"{env + ' ' if env else ''}python3 -m pytest {' '.join(tests)}"
    n = len(f2p)
    out = [f"{project.name} {project.version}: {n} test{'s' if n != 1 else ''} "
           f"fail{'s' if n == 1 else ''} after a recent change to the library code.", "",
           f"Reproduce from the repository root with `{cmd}`.", "", "Failing tests:"]
    for tid in f2p[:max_tests]:
        out.append(f"- {tid}")
        for msg in messages.get(tid, [])[:6]:
            out.append(f"    {msg}")
    if n > max_tests:
        out.append(f"- ... and {n - max_tests} more")
    out += ["", "Fix the library so that these tests pass again without breaking the other "
            "tests; the tests themselves are correct."]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------

@dataclass
class _Cand:
    project: ProjectRecipe
    index: int
    mutation: Mutation
    module: ModuleSpec
    instance_id: str
    commit: str = ""
    eval_script: str = ""
    outcome: str = "pending"
    f2p: list[str] = field(default_factory=list)
    p2p: list[str] = field(default_factory=list)
    screen_log: str = ""
    gold: str = ""


def _listable(parsed) -> set[str]:
    """Ids the parser reads unambiguously: seen once, brackets balanced."""
    counts: dict[str, int] = {}
    for o in parsed.observations:
        counts[o.test_id] = counts.get(o.test_id, 0) + 1
    return {i for i, c in counts.items() if c == 1 and i.count("[") == i.count("]")}


def _in_files(test_id: str, tests: tuple[str, ...]) -> bool:
    return test_id.split("::", 1)[0] in tests


def build(recipe: Recipe, out: Path, *, concurrency: int = 2, runtime=None, log=print,
          image: str | None = None) -> list[Task]:
    """Build the bundled tasks of ``recipe`` into ``out`` (see the module docstring).

    Args:
        out: output folder; written as ``out.tmp-<pid>`` and renamed when complete.
        concurrency: verifier trials at once (Podman containers).
        runtime: a sandbox runtime (default: a private Podman runtime, closed at the end).
        log: progress printer (one line per step).
        image: sandbox image (default :func:`sandbox.images.default_image`, built if absent).

    Returns: the tasks, in project then candidate order.

    Raises: BuildError (download, sha256, git, too few validated tasks, pristine tests
    failing, infra errors that persist after retries).
    """
    out = Path(out)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    try:
        return _build(recipe, out, tmp, concurrency=concurrency, runtime=runtime, log=log,
                      image=image)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; else a failed build


def _build(recipe: Recipe, out: Path, tmp: Path, *, concurrency: int, runtime, log,
           image: str | None) -> list[Task]:
    from eval.grading import grade, parse_log
    from sandbox import TrialSpec, VerifierPool, make_runtime
    from sandbox.images import build_offline, default_image

    t_start = time.monotonic()
    image = image or default_image()
    if runtime is None:
        build_offline(log=lambda *a: None)
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "repos").mkdir(parents=True)
    cache = cache_dir()
    stats: dict = {"recipe_hash": recipe_hash(recipe, image), "builder": BUILDER_VERSION,
                   "image": image, "projects": {}, "candidates": [], "timings_s": {}}

    # 1. sources + pristine repos ------------------------------------------------
    with ThreadPoolExecutor(max_workers=len(recipe.projects)) as ex:
        sdists = list(ex.map(lambda p: fetch_sdist(p, cache, log), recipe.projects))
    stats["timings_s"]["download"] = round(time.monotonic() - t_start, 2)
    repos: dict[str, GitRepo] = {}
    pristine: dict[str, str] = {}
    files: dict[str, dict[str, bytes]] = {}
    cands: dict[str, list[Mutation]] = {}
    for p, sd in zip(recipe.projects, sdists, strict=True):
        repo = GitRepo(tmp / "repos" / p.name)
        unpack_sdist(sd, repo.path)
        needed = [m.path for m in p.modules] + list(p.all_tests) + list(p.test_support)
        missing = [f for f in needed if not (repo.path / f).is_file()]
        if missing:
            raise BuildError(f"{p.name}: recipe names files the sdist lacks: {missing}")
        files[p.name] = {f: (repo.path / f).read_bytes() for f in needed}
        pristine[p.name] = repo.init_pristine(
            f"{p.name} {p.version}: pristine sdist {p.sdist} (sha256 {p.sha256[:16]})")
        repos[p.name] = repo
        text = {f: b.decode("utf-8") for f, b in files[p.name].items()}
        cands[p.name] = choose_candidates(p, text, recipe)
        log(f"[{p.name}] pristine {pristine[p.name][:12]}, {len(cands[p.name])} candidates")
    stats["timings_s"]["prepare"] = round(time.monotonic() - t_start, 2)

    def make_cand(p: ProjectRecipe, k: int) -> _Cand:
        m = cands[p.name][k]
        mod = next(x for x in p.modules if x.path == m.path)
        c = _Cand(p, k, m, mod, f"bundled__{p.name}-{p.version}-{k:04d}")
        text = files[p.name][m.path].decode("utf-8")
        c.commit = repos[p.name].commit_file(pristine[p.name], m.path,
                                             m.apply(text).encode("utf-8"), c.instance_id,
                                             f"refs/ecredit/{c.instance_id}")
        c.eval_script = make_eval_script(p, mod.tests, files[p.name])
        return c

    own_runtime = runtime is None
    rt = make_runtime("podman") if own_runtime else runtime
    kept: dict[str, list[_Cand]] = {p.name: [] for p in recipe.projects}
    all_cands: list[_Cand] = []
    n_trials = [0]
    try:
        with VerifierPool(rt, max_concurrency=concurrency, max_retries=2) as pool:
            def run(specs):
                n_trials[0] += len(specs)
                res = pool.map(specs)
                bad = [r for r in res if r.exit_class == "infra_error"]
                if bad:
                    raise BuildError(f"{len(bad)} verifier trial(s) hit infra errors, e.g. "
                                     f"{bad[0].trial_id}: {bad[0].error}")
                return res

            def spec(tid, p, commit, script, artifact=""):
                return TrialSpec(trial_id=tid, image=image, eval_script=script,
                                 artifact=artifact, repo_archive=repos[p.name].archive(commit),
                                 timeout_s=recipe.trial_timeout_s)

            # 2. pristine runs ---------------------------------------------------
            pre_specs = [spec(f"pristine-{p.name}", p, pristine[p.name],
                              make_eval_script(p, p.all_tests, files[p.name]))
                         for p in recipe.projects]
            base_status: dict[str, dict[str, str]] = {}
            for p, r in zip(recipe.projects, run(pre_specs), strict=True):
                parsed = parse_log(r.log, PARSER)
                ok = _listable(parsed)
                base_status[p.name] = {i: s for i, s in parsed.status_map.items()
                                       if i in ok and s == "PASSED"}
                n_fail = sum(1 for s in parsed.status_map.values() if s in ("FAILED", "ERROR"))
                if r.exit_class != "ok" or not base_status[p.name]:
                    raise BuildError(f"{p.name}: pristine test run {r.exit_class}, "
                                     f"{len(base_status[p.name])} passing: {r.log[-1500:]}")
                stats["projects"][p.name] = {
                    "pristine_commit": pristine[p.name], "pristine_passed": len(base_status[p.name]),
                    "pristine_failed": n_fail, "pristine_test_s": round(r.test_s, 2),
                    "candidates": len(cands[p.name])}
                log(f"[{p.name}] pristine: {len(base_status[p.name])} listable tests pass, "
                    f"{n_fail} fail ({r.test_s:.2f} s)")

            # 3. rounds: controls for the first waiting survivors, screening of more
            #    candidates when the waiting list cannot cover what is still needed.
            cursor = {p.name: 0 for p in recipe.projects}
            rnd = 0
            while True:
                rnd += 1
                to_screen: list[_Cand] = []
                to_control: list[_Cand] = []
                for p in recipe.projects:
                    mine = [c for c in all_cands if c.project is p]
                    need = recipe.target_per_project - sum(c.outcome == "kept" for c in mine)
                    if need <= 0:
                        continue
                    waiting = [c for c in mine if c.outcome == "screened"]
                    to_control += waiting[:need]
                    short = need - len(waiting)
                    if short <= 0:
                        continue
                    done = [c for c in mine if c.outcome not in ("pending", "screened")]
                    passed = sum(c.outcome == "kept" for c in done) + len(waiting)
                    rate = max(0.25, (passed + 1) / (len(mine) + 2)) if mine else 0.7
                    size = min(max(3, int(short / rate + 0.999) + 1),
                               len(cands[p.name]) - cursor[p.name])
                    for k in range(cursor[p.name], cursor[p.name] + size):
                        to_screen.append(make_cand(p, k))
                    cursor[p.name] += size
                if not to_screen and not to_control:
                    break
                all_cands += to_screen
                t0 = time.monotonic()
                specs = [spec(f"screen-{c.project.name}-{c.index:04d}", c.project, c.commit,
                              c.eval_script) for c in to_screen]
                for c in to_control:
                    specs.append(spec(f"gold-{c.project.name}-{c.index:04d}", c.project,
                                      c.commit, c.eval_script, c.gold))
                    specs.append(spec(f"empty-{c.project.name}-{c.index:04d}", c.project,
                                      c.commit, c.eval_script, ""))
                results = run(specs)
                for c, r in zip(to_screen, results, strict=False):
                    _screen(c, r, base_status[c.project.name], recipe, parse_log)
                    if c.outcome == "screened":
                        c.gold = repos[c.project.name].diff(c.commit, pristine[c.project.name])
                ctrl = results[len(to_screen):]
                for j, c in enumerate(to_control):
                    _control(c, ctrl[2 * j], ctrl[2 * j + 1], grade)
                for p in recipe.projects:
                    ok = sorted((c for c in all_cands if c.project is p and c.outcome == "kept"),
                                key=lambda c: c.index)
                    kept[p.name] = ok[:recipe.target_per_project]
                log(f"round {rnd}: {len(to_screen)} screened, {len(to_control)} controlled in "
                    f"{time.monotonic() - t0:.1f} s; kept "
                    + ", ".join(f"{k} {len(v)}" for k, v in kept.items()))
    finally:
        if own_runtime:
            rt.close()

    # 4. tasks -------------------------------------------------------------------
    short = {k: len(v) for k, v in kept.items() if len(v) < recipe.min_per_project}
    total = sum(len(v) for v in kept.values())
    if short or total < recipe.min_total:
        raise BuildError(f"too few validated tasks: {dict((k, len(v)) for k, v in kept.items())} "
                         f"(need >= {recipe.min_per_project} per project, >= {recipe.min_total} "
                         f"in all); raise max_candidates_per_project or change the seed")
    rows = []
    for p in recipe.projects:
        for c in kept[p.name]:
            msgs = failure_messages(c.screen_log, c.f2p)
            rows.append(Task(
                instance_id=c.instance_id, repo=f"pypi/{p.name}", base_commit=c.commit,
                problem_statement=make_problem_statement(p, c.module.tests, c.f2p, msgs,
                                                         recipe.max_problem_tests),
                patch=c.gold, test_patch="", FAIL_TO_PASS=c.f2p, PASS_TO_PASS=c.p2p,
                version=p.version, environment_setup_commit=pristine[p.name], image=image,
                eval_script=c.eval_script, log_parser=PARSER, repo_dir=f"repos/{p.name}",
                extra={"bundled": True, "project": p.name, "sdist_sha256": p.sha256,
                       "pristine_commit": pristine[p.name], "test_files": list(c.module.tests),
                       "recipe_hash": stats["recipe_hash"],
                       # build metadata; reveals the bug, never put it in a prompt
                       "mutation": {"kind": c.mutation.kind, "path": c.mutation.path,
                                    "line": c.mutation.line,
                                    "description": c.mutation.description}}).to_dict())
    with open(tmp / "tasks.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
    stats["candidates"] = [
        {"instance_id": c.instance_id, "kind": c.mutation.kind, "path": c.mutation.path,
         "line": c.mutation.line, "outcome": c.outcome, "f2p": len(c.f2p), "p2p": len(c.p2p)}
        for c in all_cands]
    stats["counts"] = {k: len(v) for k, v in kept.items()}
    stats["timings_s"]["total"] = round(time.monotonic() - t_start, 2)
    stats["trials"] = n_trials[0]
    (tmp / "build.json").write_text(json.dumps(stats, indent=1, sort_keys=True) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    log(f"built {total} tasks ({', '.join(f'{k} {len(v)}' for k, v in kept.items())}) in "
        f"{stats['timings_s']['total']:.1f} s -> {out}")
    return load_built(out)


def _screen(c: _Cand, r, base: dict[str, str], recipe: Recipe, parse_log) -> None:
    """Set ``c.outcome`` / F2P / P2P from the mutant's screening trial."""
    c.screen_log = r.log
    if r.exit_class != "ok":
        c.outcome = f"rejected({r.exit_class})"
        return
    parsed = parse_log(r.log, PARSER)
    listed = sorted(i for i in base if _in_files(i, c.module.tests))
    status = parsed.status_map
    f2p = [i for i in listed if status.get(i) in ("FAILED", "ERROR")]
    p2p = [i for i in listed if status.get(i) == "PASSED"]
    odd = [i for i in listed if status.get(i) not in ("FAILED", "ERROR", "PASSED")]
    c.f2p, c.p2p = f2p, p2p
    if parsed.rejected or odd:
        c.outcome = f"rejected({parsed.rejected or f'{len(odd)} tests not observed/skipped'})"
    elif not f2p:
        c.outcome = "no_failure"
    elif len(f2p) > recipe.max_fail_to_pass:
        c.outcome = f"rejected({len(f2p)} FAIL_TO_PASS > {recipe.max_fail_to_pass})"
    else:
        c.outcome = "screened"


def _control(c: _Cand, g, e, grade) -> None:
    """Gold must resolve (complete); empty must not: every F2P FAILED/ERROR, every P2P PASSED."""
    gr = grade(g.log, f2p=c.f2p, p2p=c.p2p, parser=PARSER)
    er = grade(e.log, f2p=c.f2p, p2p=c.p2p, parser=PARSER)
    empty_ok = (er.complete and not er.resolved
                and all(s in ("FAILED", "ERROR") for s in er.f2p.values())
                and all(s == "PASSED" for s in er.p2p.values()))
    if g.exit_class == "ok" and e.exit_class == "ok" and gr.resolved and gr.complete and empty_ok:
        c.outcome = "kept"
    else:
        c.outcome = (f"control_failed(gold {g.exit_class} resolved={gr.resolved}, "
                     f"empty {e.exit_class} ok={empty_ok})")


def load_built(out: Path) -> list[Task]:
    """Tasks of a built folder (``tasks.jsonl``; ``repo_dir`` resolved against ``out``).

    Raises: FileNotFoundError, ValueError (malformed rows).
    """
    path = Path(out) / "tasks.jsonl"
    rows, nums = read_rows(path)
    return tasks_from_rows(rows, source=str(path), base_dir=Path(out).resolve(), row_numbers=nums)


@contextlib.contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def built_dir(recipe: Recipe, image: str | None = None) -> Path:
    """Cache folder of ``recipe``: ``$ECREDIT_CACHE/bundled/<recipe hash>``."""
    from sandbox.images import default_image

    return cache_dir() / "bundled" / recipe_hash(recipe, image or default_image())


def ensure_built(recipe_path: str | Path | None = None, *, out: str | Path | None = None,
                 concurrency: int = 2, force: bool = False, log=None, runtime=None) -> list[Task]:
    """Tasks of the recipe: loaded from ``out`` (default :func:`built_dir`) when built there,
    else built now (printing progress). A file lock serialises concurrent builders.

    Raises: see :func:`build` and :func:`load_recipe`.
    """
    if log is None:
        def log(msg):
            print(f"[build_tasks] {msg}", file=sys.stderr, flush=True)
    recipe = load_recipe(recipe_path)
    out = Path(out) if out else built_dir(recipe)
    with _lock(out.with_name(out.name + ".lock")):
        if not force and (out / "tasks.jsonl").is_file():
            return load_built(out)
        log(f"building bundled tasks of {recipe_path or default_recipe_path()} into {out}")
        return build(recipe, out, concurrency=concurrency, runtime=runtime, log=log)


def materialize(recipe: Recipe, out: Path, log=print, ids: set[str] | None = None
                ) -> dict[str, dict]:
    """Re-create the repositories and candidate commits without running any test.

    For determinism checks: returns ``{instance_id: {"base_commit", "patch",
    "environment_setup_commit"}}`` for every candidate (or only ``ids``) of every project,
    with the ids :func:`build` gives them. Needs only git and the (cached) sdists.
    """
    cache = cache_dir()
    res: dict[str, dict] = {}
    for p in recipe.projects:
        repo = GitRepo(Path(out) / p.name)
        unpack_sdist(fetch_sdist(p, cache, log), repo.path)
        needed = [m.path for m in p.modules] + list(p.all_tests) + list(p.test_support)
        files = {f: (repo.path / f).read_text(encoding="utf-8") for f in needed}
        base = repo.init_pristine(
            f"{p.name} {p.version}: pristine sdist {p.sdist} (sha256 {p.sha256[:16]})")
        for k, m in enumerate(choose_candidates(p, files, recipe)):
            iid = f"bundled__{p.name}-{p.version}-{k:04d}"
            if ids is not None and iid not in ids:
                continue
            sha = repo.commit_file(base, m.path, m.apply(files[m.path]).encode("utf-8"), iid,
                                   f"refs/ecredit/{iid}")
            res[iid] = {"base_commit": sha, "patch": repo.diff(sha, base),
                        "environment_setup_commit": base}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.build_tasks",
                                 description="Build (or load from cache) the bundled tasks.")
    ap.add_argument("--recipe", default=None, help="recipe YAML (default datasets/bundled.yaml)")
    ap.add_argument("--out", default=None, help="output folder (default: the cache folder "
                    "$ECREDIT_CACHE/bundled/<recipe hash>)")
    ap.add_argument("--concurrency", type=int, default=2, help="verifier trials at once")
    ap.add_argument("--force", action="store_true", help="rebuild even when built")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        tasks = ensure_built(args.recipe, out=args.out, concurrency=args.concurrency,
                             force=args.force)
    except (BuildError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.extra.get("project", t.repo)] = counts.get(t.extra.get("project", t.repo), 0) + 1
    print(json.dumps({"tasks": len(tasks), "per_project": counts,
                      "dir": str(Path(tasks[0].repo_dir).parent.parent) if tasks else None,
                      "seconds": round(time.monotonic() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
