"""Gold-patch demonstrations for the SFT warm start (:mod:`ecredit_trl.policy.warmstart`).

For every training task, one episode built from its gold patch:

    user(task_prompt)  →  assistant: view(path, line)         →  tool: <editor output>
                       →  assistant: str_replace(path, old, new) →  tool: <editor output>
                       →  assistant: submit()                 →  tool: <submit output>
                       →  assistant: "Done." (no tool call: ends the episode)

where every tool output is what the environment really returns (``ecredit_trl.agent.editor``
run on a checkout of the task repository at ``base_commit``; the submit text is
``SWEAgentEnv.submit``'s). The closing assistant message is there because TRL's tool loop
asks the model for another turn after every tool result: without it the policy would never
learn to stop after ``submit``.

:data:`SUBMIT_OUTPUT` and :data:`CLOSING_MESSAGE` are part of the warm start's cache key
(:func:`ecredit_trl.policy.warmstart.recipe_for`).
"""

from __future__ import annotations

import difflib
import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CLOSING_MESSAGE", "SUBMIT_OUTPUT", "DemoError", "GoldEdit", "demo_conversation",
           "demo_conversations", "gold_edits"]

#: Exact text of ``SWEAgentEnv.submit`` (checked against agent.py by the tests).
SUBMIT_OUTPUT = "Submitted. The repository's current state is the final patch."

#: Final assistant message after the submit result (no tool call: the episode ends).
CLOSING_MESSAGE = "Done."


class DemoError(ValueError):
    """A demonstration cannot be built for a task; the message names the task and reason."""


# ---------------------------------------------------------------------------
# gold edits
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GoldEdit:
    """One ``view`` + ``str_replace`` pair of a demonstration.

    Attributes:
        path: repository-relative path, as written in the tool calls.
        line: 1-based line passed to ``view`` (the first changed line of the buggy file).
        old_str, new_str: ``str_replace`` arguments; ``old_str`` occurs exactly once in the
            file at that point and the replacement turns it into the gold content region.
    """

    path: str
    line: int
    old_str: str
    new_str: str


def _common_lead(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n] and a[n] in " \t":
        n += 1
    return a[:n]


def _common_trail(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n] and a[-1 - n] in " \t":
        n += 1
    return a[len(a) - n:]


def _edit_for(old_lines: list[str], new_lines: list[str], i1: int, i2: int, j1: int, j2: int,
              old_text: str) -> tuple[str, str]:
    """Smallest ``(old_str, new_str)`` around one changed line region that is unique.

    Starts with the changed lines (the neighbouring line added when one side is empty),
    strips the shared leading/trailing whitespace (the "stripped buggy line"), and widens by
    one line of context at a time until ``old_str`` occurs exactly once in ``old_text``.
    """
    before, after = 0, 0
    if i1 == i2 or j1 == j2:  # pure insertion / deletion: anchor on a neighbouring line
        if i1 > 0:
            before = 1
        else:
            after = 1
    while True:
        a, b = i1 - before, i2 + after
        olds = old_lines[a:b]
        news = old_lines[a:i1] + new_lines[j1:j2] + old_lines[i2:b]
        old_str, new_str = "\n".join(olds), "\n".join(news)
        if olds and news:
            lead = _common_lead(olds[0], news[0])
            trail = _common_trail(olds[-1], news[-1])
            if len(olds) == 1 and len(news) == 1:
                # one line each: strip whole-line indentation / trailing blanks
                old_str = old_str[len(lead):len(old_str) - len(trail)]
                new_str = new_str[len(lead):len(new_str) - len(trail)]
            else:
                old_str, new_str = old_str[len(lead):], new_str[len(lead):]
        elif olds and not news:  # deleting whole lines: take the newline with them
            old_str = old_str + "\n" if b < len(old_lines) else "\n" + old_str
        if old_str and old_text.count(old_str) == 1:
            return old_str, new_str
        if a == 0 and b >= len(old_lines):
            raise DemoError("no unique old_str around the change")
        if a > 0 and (before <= after or b >= len(old_lines)):
            before += 1
        else:
            after += 1


def gold_edits(path: str, old_text: str, new_text: str) -> list[GoldEdit]:
    """The ``str_replace`` edits, applied in order, that turn ``old_text`` into ``new_text``.

    Regions are the non-equal line opcodes of ``difflib.SequenceMatcher``, handled top to
    bottom against the progressively edited text.

    Raises: DemoError when a region has no unique anchor or the edits do not reproduce
    ``new_text`` exactly.
    """
    edits: list[GoldEdit] = []
    text = old_text
    for _ in range(64):
        if text == new_text:
            return edits
        old_lines, new_lines = text.split("\n"), new_text.split("\n")
        sm = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
        op = next(o for o in sm.get_opcodes() if o[0] != "equal")
        _, i1, i2, j1, j2 = op
        old_str, new_str = _edit_for(old_lines, new_lines, i1, i2, j1, j2, text)
        line = min(max(1, i1 + 1 if i2 > i1 else i1), len(old_lines))
        edits.append(GoldEdit(path, line, old_str, new_str))
        text = text.replace(old_str, new_str, 1)
    raise DemoError(f"{path}: the gold change needs more than 64 edits")


# ---------------------------------------------------------------------------
# demonstrations
# ---------------------------------------------------------------------------

def _git(repo: Path, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(["git", "-c", "advice.detachedHead=false", "-C", str(repo), *args],
                          input=input, capture_output=True)
    if proc.returncode != 0:
        raise DemoError(f"git {' '.join(args[:2])} failed: "
                        f"{proc.stderr.decode(errors='replace').strip()[:300]}")
    return proc.stdout.decode(errors="replace")


def _call(name: str, arguments: dict) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {
                "name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}]}


def demo_conversation(task, workroot: str | Path | None = None) -> dict:
    """The demonstration of one task (see the module docstring), with real tool outputs.

    Args:
        task: ``eval.tasks.Task``-like: ``instance_id``, ``repo_dir`` (a local git
            repository holding ``base_commit``), ``base_commit``, ``patch`` (gold unified
            diff), ``problem_statement``.
        workroot: where the temporary checkout is made (system temp dir by default).

    Returns:
        ``{"instance_id": str, "messages": [...], "tools": <JSON string>}``. Tool-call
        ``arguments`` are JSON strings (Arrow would merge dict keys across rows; the qwen3
        template writes string arguments verbatim and ``SFTTrainer`` ``json.loads`` the
        ``tools`` column). Tool messages carry ``name`` like TRL's tool loop.

    Raises:
        DemoError: no ``repo_dir``, the gold patch does not apply, creates/deletes/renames a
            file or is not text, or an editor call fails (message names the task).
    """
    from ecredit_trl.agent import editor
    from ecredit_trl.agent.env import _clone_at
    from ecredit_trl.agent.prompts import policy_tools, task_prompt

    iid = getattr(task, "instance_id", "?")
    try:
        if not getattr(task, "repo_dir", None):
            raise DemoError("repo_dir: the task has no local repository")
        patch = getattr(task, "patch", "") or ""
        if not patch.strip():
            raise DemoError("patch: the gold patch is empty")
        with tempfile.TemporaryDirectory(prefix="ecredit-demo-", dir=workroot) as tmp:
            root = Path(tmp) / "repo"
            try:
                _clone_at(task.repo_dir, task.base_commit, root)
            except subprocess.CalledProcessError as exc:
                raise DemoError(f"checkout of {task.base_commit} failed: "
                                f"{exc.stderr.decode(errors='replace').strip()[:300]}") from None
            numstat = _git(root, "apply", "--numstat", "--summary", "-", input=patch.encode())
            if any(w in numstat for w in (" create mode ", " delete mode ", " rename ")):
                raise DemoError("patch: the gold patch creates, deletes or renames a file")
            paths = []
            for row in numstat.splitlines():
                parts = row.split("\t")
                if len(parts) == 3:
                    if parts[0] == "-":
                        raise DemoError(f"patch: binary change to {parts[2]}")
                    paths.append(parts[2])
            if not paths:
                raise DemoError("patch: no file changes found")
            old = {p: (root / p).read_text() for p in paths}
            _git(root, "apply", "-", input=patch.encode())
            new = {p: (root / p).read_text() for p in paths}
            _git(root, "checkout", "-q", "--", *paths)

            messages = task_prompt(task)
            for p in paths:
                for e in gold_edits(p, old[p], new[p]):
                    try:
                        out_v = editor.view(root, e.path, e.line)
                        out_r = editor.str_replace(root, e.path, e.old_str, e.new_str)
                    except editor.EditorError as exc:
                        raise DemoError(f"editor refused the gold edit on {e.path}: {exc}") from None
                    messages += [_call("view", {"path": e.path, "line": e.line}),
                                 {"role": "tool", "name": "view", "content": out_v},
                                 _call("str_replace", {"path": e.path, "old_str": e.old_str,
                                                       "new_str": e.new_str}),
                                 {"role": "tool", "name": "str_replace", "content": out_r}]
            for p in paths:
                if (root / p).read_text() != new[p]:
                    raise DemoError(f"the demonstrated edits do not reproduce the gold {p}")
            messages += [_call("submit", {}),
                         {"role": "tool", "name": "submit", "content": SUBMIT_OUTPUT},
                         {"role": "assistant", "content": CLOSING_MESSAGE}]
    except DemoError as exc:
        raise DemoError(f"task {iid}: {exc}") from None
    return {"instance_id": iid, "messages": messages, "tools": json.dumps(policy_tools())}


def demo_conversations(tasks, *, strict: bool = False, log=print) -> list[dict]:
    """Demonstrations of ``tasks`` (in order; see :func:`demo_conversation`).

    Args:
        strict: raise on the first task without a demonstration instead of skipping it.
        log: receives one line per skipped task (``None`` = silent).

    Returns: list of ``{"instance_id", "messages", "tools"}`` dicts.

    Raises: DemoError (``strict``), or when no task at all yields a demonstration.
    """
    out, skipped = [], []
    for t in tasks:
        try:
            out.append(demo_conversation(t))
        except DemoError as exc:
            if strict:
                raise
            skipped.append(str(exc))
            if log:
                log(f"warmstart: skipped {exc}")
    if not out:
        raise DemoError(f"no task yields a demonstration ({len(skipped)} skipped: "
                        f"{'; '.join(skipped[:3])})")
    return out
