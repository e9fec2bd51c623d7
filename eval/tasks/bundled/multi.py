"""Multi-block bundled tasks: two validated mutations of one project in one task.

A single-mutation task is fixed by one edit block, so trajectories on it carry one block and
the credit arms B and M differ only in where that block's credit lands. A *pair* task
combines two mutations that each passed screening on their own (never one used by another
task: a mutation shared with a holdout task would leak its fix), preferably
in two files, else in two functions of one file. Its FAIL_TO_PASS must hold at least one
test broken by each part, so fixing one part alone leaves a listed test failing; the build
(:mod:`eval.tasks.bundled.build`) then screens and controls the pair as a whole.

Everything here is pure (texts in, texts / ids out); the build does the git and Podman work.
"""

from __future__ import annotations

import ast
import re

from eval.tasks.bundled.mutations import Mutation

__all__ = ["apply_all", "enclosing_function", "interleave_tests", "pair_components",
           "pair_id", "parse_pair_id"]


def enclosing_function(text: str, line: int) -> str | None:
    """Qualified name (``Class.method`` / ``outer.inner``) of the innermost function whose
    lines hold ``line`` (1-based) in the Python source ``text``; ``None`` at module level.

    Raises: SyntaxError when ``text`` does not parse."""
    best: tuple[int, str] | None = None

    def walk(node, prefix: str) -> None:
        nonlocal best
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if (isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and child.lineno <= line <= (child.end_lineno or child.lineno)
                        and (best is None or child.lineno >= best[0])):
                    best = (child.lineno, name)
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(text), "")
    return best[1] if best else None


def pair_components(muts: list[Mutation], texts: dict[str, str]) -> list[tuple[int, int]]:
    """Disjoint pairs ``(i, j)``, ``i < j``, of indices into ``muts`` (deterministic, greedy in
    list order): each unused ``i`` takes the first unused ``j > i`` in another file; failing
    that, the first in another function of the same file; failing both, ``i`` stays unpaired.

    Args:
        muts: validated single mutations of one project, in candidate order.
        texts: repo-relative path -> pristine source text (every ``m.path`` of ``muts``).
    """
    fn = [(m.path, enclosing_function(texts[m.path], m.line)) for m in muts]
    used: set[int] = set()
    out: list[tuple[int, int]] = []
    for i in range(len(muts)):
        if i in used:
            continue
        rest = [j for j in range(i + 1, len(muts)) if j not in used]
        j = next((j for j in rest if fn[j][0] != fn[i][0]), None)
        if j is None:
            j = next((j for j in rest if fn[j][1] != fn[i][1]), None)
        if j is not None:
            used |= {i, j}
            out.append((i, j))
    return out


def apply_all(muts: tuple[Mutation, ...] | list[Mutation], texts: dict[str, str]
              ) -> dict[str, str]:
    """path -> mutated text for every path ``muts`` touch (mutations of one file applied from
    the last offset to the first, so earlier offsets stay valid).

    Raises: ValueError when two mutations of one file overlap or a source text changed."""
    out: dict[str, str] = {}
    for path in dict.fromkeys(m.path for m in muts):
        mine = sorted((m for m in muts if m.path == path), key=lambda m: m.start, reverse=True)
        for a, b in zip(mine[1:], mine, strict=False):
            if a.end > b.start:
                raise ValueError(f"mutations {path}:{a.line} and {path}:{b.line} overlap")
        text = texts[path]
        for m in mine:
            text = m.apply(text)
        out[path] = text
    return out


def pair_id(name: str, version: str, i: int, j: int, prefix: str = "bundled") -> str:
    """Instance id of the pair of candidates ``i`` and ``j``:
    ``<prefix>__<name>-<version>-<i>-<j>`` (4 digits each; a single task's id ends after
    ``<i>``, :func:`single_id`)."""
    return f"{prefix}__{name}-{version}-{i:04d}-{j:04d}"


def single_id(name: str, version: str, k: int, prefix: str = "bundled") -> str:
    """Instance id of single candidate ``k``: ``<prefix>__<name>-<version>-<k>`` (4 digits)."""
    return f"{prefix}__{name}-{version}-{k:04d}"


_PAIR = re.compile(r"^[a-z][a-z0-9_]*__.+-(\d{4})-(\d{4})$")


def parse_pair_id(iid: str) -> tuple[int, int] | None:
    """``(i, j)`` of a :func:`pair_id`, ``None`` for any other id."""
    m = _PAIR.match(iid)
    return (int(m.group(1)), int(m.group(2))) if m else None


def interleave_tests(f2p: list[str], parts: list[list[str]]) -> list[str]:
    """``f2p`` reordered so its first entries alternate between the parts' failing tests
    (part 1's first, part 2's first, part 1's second ...), then the rest in order: a problem
    statement quoting the first few names failing tests of every part."""
    listed = set(f2p)
    queues = [[t for t in p if t in listed] for p in parts]
    out: list[str] = []
    for k in range(max((len(q) for q in queues), default=0)):
        for q in queues:
            if k < len(q) and q[k] not in out:
                out.append(q[k])
    return out + [t for t in f2p if t not in out]
