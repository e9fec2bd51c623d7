"""The verifier's protected set: test infrastructure an artifact must not change.

Design page, "Threat model" (artifact → verdict): before the listed tests run in a
verifier trial, every path of the task's protected set that the artifact touched is
put back to its base content (or removed when the artifact created it). The artifact
is still applied whole; only what decides how tests are *collected, run and reported*
is the verifier's.

This module is pure (no I/O): pattern matching and reading the paths a patch names.
The in-sandbox part (stash, restore) is in :mod:`sandbox.trials.script`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from pathlib import PurePosixPath

TEST_PATH_PATTERNS: tuple[str, ...] = ("tests/", "testing/", "test_*.py", "*_test.py",
                                       "conftest.py")
"""The default test-path patterns (design page, "Edit blocks and eligibility"; the same list as
``ecredit_trl.credit.blocks.DEFAULT_TEST_PATTERNS``; ``sandbox`` may not import it)."""

INFRA_PATTERNS: tuple[str, ...] = (
    "conftest.py",          # every conftest at any depth (hooks, fixtures, plugins)
    "pytest.ini",           # pytest config that always wins
    "tox.ini",              # [pytest] section
    "sitecustomize.py",     # imported by every interpreter that finds it on sys.path
    "usercustomize.py",
    "*.pth",                # path hooks when the tree is (part of) a site dir
    "*.dist-info/",         # entry points (pytest11 plugins) of a "distribution" on sys.path
    "*.egg-info/",
)
"""Test infrastructure protected by default, beyond the test-path patterns.
``*.dist-info/`` and ``*.egg-info/`` are ours: ``python -m pytest`` puts the working
directory on ``sys.path``, where a ``pytest11`` entry point in a made-up distribution
would be loaded as a plugin. pytest config inside ``setup.cfg`` / ``pyproject.toml`` is
protected only when a task adds those files (``Task.protected_paths``)."""

DEFAULT_PROTECTED: tuple[str, ...] = tuple(dict.fromkeys(INFRA_PATTERNS + TEST_PATH_PATTERNS))
"""The default protected set (patterns), listed test files come on top per task."""


def check_pattern(pat: object, where: str = "pattern") -> str:
    """Return ``pat`` when it is a usable pattern, else raise.

    Raises: ValueError naming ``where`` for a non-string, empty, ``/``-only pattern or one
    with a ``..`` component.
    """
    if not isinstance(pat, str) or not pat.strip("/").strip():
        raise ValueError(f"{where}: expected a non-empty path pattern, got {pat!r}")
    if ".." in PurePosixPath(pat.strip("/")).parts:
        raise ValueError(f"{where}: '..' is not allowed in a path pattern, got {pat!r}")
    return pat


def matches(path: str, patterns: Iterable[str]) -> bool:
    """Whether repository path ``path`` matches any of ``patterns``.

    Same forms as ``ecredit_trl.credit.blocks.is_test_path`` (``fnmatch`` wildcards,
    case-sensitive): ``name/`` = a directory component anywhere; no slash = a basename
    anywhere; a slash inside (or a leading ``/``) = the whole path from the root, ``*`` not
    crossing ``/``, with a trailing slash meaning that directory's prefix.

    Raises: ValueError for an empty pattern.
    """
    parts = PurePosixPath(path).parts
    if not parts:
        return False
    dirs, base = parts[:-1], parts[-1]
    for pat in patterns:
        check_pattern(pat)
        is_dir = pat.endswith("/")
        body = pat.rstrip("/")
        anchored = body.startswith("/")
        body = body.lstrip("/")
        if "/" not in body and not anchored:
            if is_dir:
                if any(fnmatch.fnmatchcase(d, body) for d in dirs):
                    return True
            elif fnmatch.fnmatchcase(base, body):
                return True
            continue
        pparts = PurePosixPath(body).parts
        if is_dir:
            if len(dirs) >= len(pparts) and all(
                    fnmatch.fnmatchcase(p, q) for p, q in zip(dirs, pparts, strict=False)):
                return True
        elif len(parts) == len(pparts) and all(
                fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pparts, strict=True)):
            return True
    return False


def exact_pattern(path: str) -> str:
    """An anchored pattern matching exactly ``path`` (fnmatch specials escaped)."""
    return "/" + re.sub(r"([*?\[])", r"[\1]", path.strip("/"))


def listed_test_files(test_ids: Iterable[str]) -> list[str]:
    """Files named by pytest-style test ids (``path.py::test[param]`` → ``path.py``).

    Ids without a ``.py`` file part (Django / unittest styles) name no file and are skipped:
    their files are covered by the test-path patterns.
    """
    out: dict[str, None] = {}
    for tid in test_ids:
        head = tid.split("::", 1)[0].strip()
        if head.endswith(".py") and ".." not in PurePosixPath(head).parts:
            out[head.lstrip("/")] = None
    return list(out)


_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(name: str) -> str:
    """Undo git's C-style quoting of a path (``"a\\tb\\303\\251"``)."""
    if not (len(name) >= 2 and name[0] == '"' and name[-1] == '"'):
        return name
    raw, i, body = bytearray(), 0, name[1:-1]
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and i + 3 < len(body) + 1 and re.fullmatch(r"[0-7]{3}",
                                                                            body[i + 1:i + 4]):
                raw.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            raw.append(_C_ESCAPES.get(nxt, ord(nxt)))
            i += 2
            continue
        raw += ch.encode("utf-8", errors="surrogateescape")
        i += 1
    return raw.decode("utf-8", errors="surrogateescape")


def _names(line: str) -> list[str]:
    """Candidate path names on one patch header line (before ``-p1`` stripping)."""
    for prefix in ("rename from ", "rename to ", "copy from ", "copy to "):
        if line.startswith(prefix):
            return [_unquote(line[len(prefix):])]
    if line.startswith("diff --git "):
        rest = line[len("diff --git "):]
        quoted = re.findall(r'"(?:[^"\\]|\\.)*"', rest)
        if quoted:
            return [_unquote(q) for q in quoted]
        half = rest.split(" b/", 1)
        return [half[0], "b/" + half[1]] if len(half) == 2 else rest.split()
    for prefix in ("--- ", "+++ ", "*** ", "Index: "):
        if line.startswith(prefix):
            name = line[len(prefix):].split("\t", 1)[0].rstrip()
            return [_unquote(name)] if name else []
    return []


def artifact_paths(artifact: str) -> list[str]:
    """Every repository path a patch could touch under ``git apply`` or ``patch -p1``.

    A deliberate superset: names from ``diff --git``, ``---``/``+++``/``***``, ``Index:``,
    ``rename``/``copy from|to`` lines, each both as written and with its first component
    stripped (``-p1``); ``/dev/null``, absolute names and names with ``..`` are dropped (both
    tools refuse them). Lines inside hunks that merely look like headers only add harmless
    extra names. Returns sorted unique paths.
    """
    out: set[str] = set()
    for line in artifact.splitlines():
        for name in _names(line):
            if name in ("/dev/null", "") or name.startswith("/"):
                continue
            parts = PurePosixPath(name).parts
            if ".." in parts:
                continue
            out.add(str(PurePosixPath(*parts)))
            if len(parts) > 1:
                out.add(str(PurePosixPath(*parts[1:])))
    return sorted(out)


def touched_protected(artifact: str, patterns: Iterable[str]) -> list[str]:
    """The paths named by ``artifact`` (:func:`artifact_paths`) that match ``patterns``."""
    pats = list(patterns)
    return [p for p in artifact_paths(artifact) if matches(p, pats)]


__all__ = ["DEFAULT_PROTECTED", "INFRA_PATTERNS", "TEST_PATH_PATTERNS", "artifact_paths",
           "check_pattern", "exact_pattern", "listed_test_files", "matches",
           "touched_protected"]
