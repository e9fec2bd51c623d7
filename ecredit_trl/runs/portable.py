"""Recorded command lines without a machine's absolute paths (design page, "Run records").

A record (``study.json``'s ``command``, the study report's "command:" line) keeps the argv as
it ran, but an absolute path in it names one machine's layout. :func:`portable_argv` rewrites
each absolute path argument (also the value of ``--flag=/path``):

* under the record's own folder (the study or run dir) → ``<study>`` / ``<study>/sub/path``;
* under the directory the command ran from → that relative path (as a relative argument is);
* under the home directory → ``<home>/...``;
* anywhere else → ``<abs>/<last component>``.

Relative arguments and non-path arguments are kept as they are.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["portable_argv"]


def portable_argv(argv: Sequence[str], base: str | os.PathLike, *, label: str = "study",
                  cwd: str | os.PathLike | None = None) -> list[str]:
    """``argv`` with its absolute paths made relative or marked (see the module docstring).

    Args:
        base: the record's folder (relative: to ``cwd``); paths under it become ``<label>/...``.
        label: the marker's name (``study``, ``run``).
        cwd: the directory the command ran from (default: the current one).
    """
    here = Path(os.path.abspath(cwd or os.getcwd()))
    roots = ((Path(os.path.abspath(here / base)), f"<{label}>"), (here, None),
             (Path.home(), "<home>"))
    return [_portable(a, roots) for a in argv]


def _portable(arg: str, roots) -> str:
    flag, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    if not value.startswith("/"):
        return arg
    path = Path(os.path.normpath(value))
    for root, marker in roots:
        if path == root or root in path.parents:
            rel = path.relative_to(root).as_posix()
            if marker is None:
                new = rel
            else:
                new = marker if rel == "." else f"{marker}/{rel}"
            break
    else:
        new = f"<abs>/{path.name}" if path.name else "<abs>"
    return f"{flag}{eq}{new}" if eq else new
