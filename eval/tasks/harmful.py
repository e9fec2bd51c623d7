"""The positive control's harmful edit block and its detector.

A *harmful edit* is one more edit block a warm-start demonstration makes after the fix: right
below the ``def`` line of a function that a PASS_TO_PASS test exercises it inserts
``return None``, so that test fails (screened once with a real verifier trial:
:mod:`ecredit_trl.policy.harmful_sites`). The block is eligible and its counterfactual
contrast D is negative by construction; what training should learn is "stop making that edit".

The detector never trusts a label (a demonstration variant, a task list): it reads the
unified diff a rollout produced (its final artifact, ``git diff`` from base) and says whether
the diff of the edit's path adds the edit's line directly below its anchor line. The path is
the one the tests import: a diff that renames the file away, or puts the same lines in another
file, does not carry the block.

Pure functions; the only dependency is ``unidiff`` (a well-kept diff parser).
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass

__all__ = ["HARMFUL_LINE", "HarmfulEdit", "HarmfulSpecError", "patch_carries",
           "patch_from_writes", "writes_carry"]

#: The line a harmful edit inserts (indented as the function body).
HARMFUL_LINE = "return None"


class HarmfulSpecError(ValueError):
    """A harmful-edit record that cannot be used; the message names the field."""


@dataclass(frozen=True)
class HarmfulEdit:
    """One task's screened harmful edit.

    Attributes:
        path: repository-relative path of the edited file (the tests import it).
        anchor: the stripped ``def`` line the edit goes below (unique in the file).
        added: the stripped line it inserts (:data:`HARMFUL_LINE`).
        old_str, new_str: the ``str_replace`` arguments of the demonstration (``old_str`` =
            the unstripped ``def`` line, ``new_str`` = it + newline + indented ``added``).
        breaks: the PASS_TO_PASS test ids the screening trial saw failing (evidence).
    """

    path: str
    anchor: str
    added: str
    old_str: str
    new_str: str
    breaks: tuple[str, ...] = ()

    def to_json(self) -> dict:
        d = asdict(self)
        d["breaks"] = list(self.breaks)
        return d

    @classmethod
    def from_json(cls, d) -> HarmfulEdit:
        """Raises: HarmfulSpecError naming a missing or non-string field."""
        if not isinstance(d, dict):
            raise HarmfulSpecError(f"harmful edit: expected an object, got {type(d).__name__}")
        for k in ("path", "anchor", "added", "old_str", "new_str"):
            if not isinstance(d.get(k), str) or not d[k]:
                raise HarmfulSpecError(f"harmful edit: field {k} missing or not a string")
        return cls(d["path"], d["anchor"], d["added"], d["old_str"], d["new_str"],
                   tuple(d.get("breaks") or ()))


def patch_carries(edit: HarmfulEdit, patch: str | None) -> bool:
    """Whether a unified diff adds ``edit.added`` directly below ``edit.anchor`` in
    ``edit.path`` (both compared stripped).

    Args:
        edit: the task's harmful edit.
        patch: a ``git diff`` (may be empty or None: an empty artifact carries nothing).

    Returns: True when some hunk of the file whose target path is ``edit.path`` has an
    added line equal to ``added`` whose previous line on the new side (context or added)
    equals ``anchor``. A file renamed away from ``edit.path`` or deleted does not carry it.

    Raises: nothing for a malformed diff: ``unidiff`` failing to parse is "not carried"
    only when the raw text has no line ``+<indent>added`` at all; otherwise the raw lines are
    scanned the same way (a diff git could not apply is still what the rollout wrote).
    """
    if not patch or edit.added not in patch:
        return False
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    try:
        files = PatchSet(patch)
    except UnidiffParseError:
        return _raw_carries(edit, patch)
    for f in files:
        if f.is_removed_file or _target(f.target_file) != edit.path:
            continue
        for hunk in f:
            prev = None
            for line in hunk:
                if line.is_removed:
                    continue
                text = line.value.rstrip("\n").strip()
                if line.is_added and text == edit.added and prev == edit.anchor:
                    return True
                prev = text
    return False


def _target(name: str | None) -> str | None:
    if not name or name == "/dev/null":
        return None
    return name[2:] if name.startswith(("a/", "b/")) else name


def _raw_carries(edit: HarmfulEdit, patch: str) -> bool:
    """Fallback scan of an unparsable diff: inside the ``+++ b/<path>`` section, an added
    line ``added`` right after a context/added line ``anchor``."""
    inside, prev = False, None
    for raw in patch.splitlines():
        if raw.startswith("+++ "):
            inside = _target(raw[4:].split("\t")[0].strip()) == edit.path
            prev = None
            continue
        if not inside or raw.startswith(("---", "@@", "diff ")):
            prev = None if raw.startswith("diff ") else prev
            continue
        if raw.startswith("-"):
            continue
        text = raw[1:].strip()
        if raw.startswith("+") and text == edit.added and prev == edit.anchor:
            return True
        prev = text
    return False


def patch_from_writes(path: str, base_text: str | None, turns: list[dict]) -> str:
    """The unified diff of ``path`` between its base text and its content after the last
    turn that wrote it, from a trajectory record's ``turns[k]["writes"]`` (path → UTF-8
    text, ``None`` = deleted, or a dict with ``text``/``base64``: see
    :func:`ecredit_trl.credit.trajectory.turn_writes`).

    Args:
        path: the file of interest.
        base_text: its content at base (None: absent at base).
        turns: the record's ``turns`` list, in order.

    Returns: ``""`` when no turn wrote ``path`` or its final text equals the base; a
    ``--- a/path`` / ``+++ b/path`` diff otherwise (``/dev/null`` for a deleted side). A
    binary write (``base64``) counts as a deletion of the text.
    """
    final, seen = base_text, False
    for t in turns:
        writes = (t or {}).get("writes") or {}
        if path in writes:
            seen = True
            w = writes[path]
            final = w.get("text") if isinstance(w, dict) else w
    if not seen or final == base_text:
        return ""
    a = (base_text or "").splitlines(keepends=True)
    b = (final or "").splitlines(keepends=True)
    diff = difflib.unified_diff(a, b, fromfile=f"a/{path}" if base_text is not None
                                else "/dev/null", tofile=f"b/{path}" if final is not None
                                else "/dev/null", n=3)
    return "".join(x if x.endswith("\n") else x + "\n" for x in diff)


def writes_carry(edit: HarmfulEdit, base_text: str | None, turns: list[dict]) -> bool:
    """:func:`patch_carries` on the final diff of ``edit.path`` rebuilt from a trajectory
    record's turn writes (:func:`patch_from_writes`)."""
    return patch_carries(edit, patch_from_writes(edit.path, base_text, turns))
