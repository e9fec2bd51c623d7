"""What a task's gold patch changes, as keys two tasks share exactly when they fix the same
change: how the train/eval overlap check recognises one bug under two ids (a renamed copy of a
held-out row, or the same mutation built by two recipes; design page, "Evaluation").
Pure functions over unified-diff text.
"""

from __future__ import annotations

import re

_FILE = re.compile(r"^\+\+\+ (?:b/)?(\S+)")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")


def change_keys(patch: str) -> frozenset[tuple[str, int, str, str]]:
    """One key per contiguous change of a unified diff: ``(path, line, removed, added)``:
    the line of the original file where the change starts, and the removed and added lines
    (without their ``-`` / ``+``) joined by newlines. The line number keeps apart one textual
    edit made at two places of a file (two different bugs). A change that only adds or only
    removes blank lines is left out (unrelated patches share those).

    Args:
        patch: unified diff text (``git diff`` output; ``+++ b/<path>`` names the file).

    Returns: the keys (empty for an empty patch or one without ``+++`` headers).
    """
    keys: set[tuple[str, int, str, str]] = set()
    path = None
    line = 0  # original-file line of the next context or removed line
    start = 0
    minus: list[str] = []
    plus: list[str] = []

    def flush() -> None:
        if path is not None and (minus or plus):
            if any(x.strip() for x in minus + plus):
                keys.add((path, start, "\n".join(minus), "\n".join(plus)))
        minus.clear()
        plus.clear()

    for text in patch.splitlines():
        m = _FILE.match(text)
        h = _HUNK.match(text)
        if m:
            flush()
            path = m.group(1)
        elif h:
            flush()
            line = int(h.group(1))
        elif text.startswith("--- ") or text.startswith("diff "):
            flush()
        elif text.startswith("-") or text.startswith("+"):
            if not minus and not plus:
                start = line
            if text.startswith("-"):
                minus.append(text[1:])
                line += 1
            else:
                plus.append(text[1:])
        else:
            flush()
            if text.startswith(" "):
                line += 1
    flush()
    return frozenset(keys)


def shared_changes(train: dict[str, tuple[str, str]], evals: dict[str, tuple[str, str]]
                   ) -> list[tuple[str, str]]:
    """``(eval id, training id)`` pairs of one repository whose gold patches share a change
    key (:func:`change_keys`: same file, line and text), sorted; each eval id is paired with the first training id (in
    id order) that shares one of its changes.

    Args:
        train, evals: task id -> ``(repo, gold patch text)``.
    """
    owner: dict[tuple[str, tuple[str, int, str, str]], str] = {}
    for tid in sorted(train):
        repo, patch = train[tid]
        for k in change_keys(patch):
            owner.setdefault((repo, k), tid)
    pairs = set()
    for eid, (repo, patch) in evals.items():
        for k in change_keys(patch):
            if (repo, k) in owner:
                pairs.add((eid, owner[(repo, k)]))
    return sorted(pairs)
