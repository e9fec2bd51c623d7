"""Mutation candidates: every one-line bug that can be injected into a recipe module
(pipeline step 2 of :mod:`eval.tasks.bundled`).
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from dataclasses import dataclass

from eval.tasks.bundled.recipe import KINDS, ProjectRecipe, Recipe


@dataclass(frozen=True)
class Mutation:
    """One single-line textual edit: ``text[start:end]`` becomes ``replacement``.

    ``start``/``end`` are character offsets into the file's text; ``line`` is 1-based.
    ``description`` is build metadata (never shown to an agent). ``function`` is the
    top-level function or method holding the site, class-qualified (``"LRUCache.popitem"``;
    a nested function counts as part of the function it is defined in): the unit a
    function-level held-out split groups by.
    """

    path: str
    kind: str
    line: int
    start: int
    end: int
    original: str
    replacement: str
    description: str
    function: str = ""

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
        self.function = ""  # class-qualified name of the outermost enclosing function
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
        self.out.append(Mutation(self.path, kind, node.lineno, start, end, original, repl, desc,
                                 self.function))

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
        if not self.in_func:
            self.function = ".".join(self.stack)
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
