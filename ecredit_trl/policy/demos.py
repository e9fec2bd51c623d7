"""Gold-patch demonstrations for the SFT warm start (:mod:`ecredit_trl.policy.warmstart`).

For every training task, one episode built from its gold patch:

    user(task_prompt)  →  assistant: view(path, line)         →  tool: <editor output>
                       →  assistant: str_replace(path, old, new) →  tool: <editor output>
                       →  assistant: submit()                 →  tool: <submit output>
                       →  assistant: "Done." (no tool call: ends the episode)

(one ``view`` + ``str_replace`` pair per changed region: a pair task, two mutations, shows
two), where every tool output is what the environment really returns (``ecredit_trl.agent.editor``
run on a checkout of the task repository at ``base_commit``; the submit text is
``SWEAgentEnv.submit``'s). The closing assistant message is there because TRL's tool loop
asks the model for another turn after every tool result: without it the policy would never
learn to stop after ``submit``.

:data:`SUBMIT_OUTPUT` and :data:`CLOSING_MESSAGE` are part of the warm start's cache key
(:func:`ecredit_trl.policy.warmstart.recipe_for`).

**Variants** (:class:`DemoVariants`): so that trajectories carry edit blocks
whose counterfactual contrast D is 0 and blocks with D > 0 (and the credit's block selection
has a choice), a seeded fraction of the demonstrations (:func:`demo_variant`) is not plain:

* ``extra``: after the fix, one more ``str_replace`` adds a comment line above a function
  definition (a harmless D = 0 block). It goes into another library file of the same
  package when there is one (the fix blocks stay eligible: the last-touch rule is per
  path, see the design page, "Edit blocks and eligibility"), else into the fixed file itself (then
  it is that file's last touch). No ``view`` precedes it (it keeps episodes within ``max_turns``).
* ``revert``: right after the first ``view``, an exploratory wrong edit (another one-line
  mutation, :func:`eval.tasks.bundled.mutations.find_mutations`, on the buggy line or the nearest
  line of the view window) that the next ``str_replace`` corrects; the final patch is the
  gold patch (checked).
* ``harmful`` (the positive control): after the fix, one more ``str_replace``
  inserts ``return None`` below the ``def`` line of a function a PASS_TO_PASS test exercises
  (a D < 0 block; the site is screened with real verifier trials,
  :mod:`ecredit_trl.policy.harmful_sites`). A task drawn ``harmful`` without a screened site
  stays plain. The final patch is the gold patch + that block (checked).
"""

from __future__ import annotations

import ast
import difflib
import json
import random
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ecredit_trl.agent import editor
from ecredit_trl.agent.env import _clone_at
from ecredit_trl.agent.prompts import policy_tools, task_prompt
from eval.tasks.bundled.mutations import find_mutations, mutation_is_valid

__all__ = ["CLOSING_MESSAGE", "EXTRA_COMMENT", "SUBMIT_OUTPUT", "DemoError", "DemoVariants",
           "GoldEdit", "call_message", "closing_messages", "demo_conversation",
           "demo_conversations", "demo_steps", "demo_variant", "gold_edits", "run_steps"]

#: Exact text of ``SWEAgentEnv.submit`` (checked against agent.py by the tests).
SUBMIT_OUTPUT = "Submitted. The repository's current state is the final patch."

#: Final assistant message after the submit result (no tool call: the episode ends).
CLOSING_MESSAGE = "Done."

#: The comment line an ``extra`` demonstration adds (a D = 0 edit block).
EXTRA_COMMENT = "# reviewed: unchanged"


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
# variants
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class DemoVariants:
    """Which demonstrations get an extra D = 0 block or a reverted exploratory edit.

    Attributes:
        extra_fraction: expected share of ``extra`` demonstrations (0..1).
        revert_fraction: expected share of ``revert`` demonstrations (0..1; the shares
            are disjoint, their sum <= 1).
        seed: seeds :func:`demo_variant` and the choice of edit sites.
        harmful_fraction: expected share of ``harmful`` demonstrations (0..1).
    """

    extra_fraction: float = 0.0
    revert_fraction: float = 0.0
    seed: int = 0
    harmful_fraction: float = 0.0

    def __post_init__(self) -> None:
        for name in ("extra_fraction", "revert_fraction", "harmful_fraction"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1:
                raise ValueError(f"{name}: expected a number in [0, 1], got {v!r}")
        total = self.extra_fraction + self.revert_fraction + self.harmful_fraction
        if total > 1:
            raise ValueError(f"extra_fraction + revert_fraction + harmful_fraction: must be "
                             f"<= 1, got {total}")


def demo_variant(instance_id: str, variants: DemoVariants) -> str:
    """``"extra"``, ``"revert"``, ``"harmful"`` or ``"plain"`` for one task: ``u`` uniform in
    [0, 1) from ``random.Random(f"{seed}:{instance_id}")``; ``extra`` when
    ``u < extra_fraction``, ``revert`` when ``u < extra_fraction + revert_fraction``,
    ``harmful`` when ``u < extra + revert + harmful_fraction``."""
    u = random.Random(f"{variants.seed}:{instance_id}").random()
    if u < variants.extra_fraction:
        return "extra"
    if u < variants.extra_fraction + variants.revert_fraction:
        return "revert"
    if u < variants.extra_fraction + variants.revert_fraction + variants.harmful_fraction:
        return "harmful"
    return "plain"


def _def_lines(text: str, avoid: set[int]) -> list[tuple[int, str]]:
    """(1-based line, stripped ``def`` line) of functions whose ``def`` line is unique in
    ``text`` and not in ``avoid`` (lines the fix touches)."""
    out = []
    lines = text.split("\n")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            line = lines[node.lineno - 1].strip()
            if (line.startswith(("def ", "async def ")) and text.count(line) == 1
                    and not any(abs(node.lineno - a) <= 1 for a in avoid)):
                out.append((node.lineno, line))
    return sorted(out)


def _wrong_text(buggy: str, gold: str, line: int, rng: random.Random) -> str | None:
    """``buggy`` with one more one-line mutation on ``line`` or the nearest line within
    ±7 (another wrong fix), never one that gives ``gold``; ``None`` when there is none."""
    try:
        sites = [m for m in find_mutations("f.py", buggy) if abs(m.line - line) <= 7]
    except SyntaxError:
        return None
    sites = [m for m in sites if mutation_is_valid(buggy, m) and m.apply(buggy) != gold]
    if not sites:
        return None
    best = min(abs(m.line - line) for m in sites)
    return rng.choice([m for m in sites if abs(m.line - line) == best]).apply(buggy)


def demo_steps(old: dict[str, str], new: dict[str, str], variant: str = "plain",
               rng: random.Random | None = None, others: dict[str, str] | None = None,
               harmful=None) -> tuple[list[tuple], str]:
    """The tool calls of a demonstration (pure: texts in, calls out).

    Args:
        old, new: path -> buggy / gold text of each file the gold patch changes.
        variant: ``plain`` | ``extra`` | ``revert`` | ``harmful`` (module docstring).
        rng: chooses edit sites of a variant.
        others: path -> text of other library files an ``extra`` edit may go to.
        harmful: the task's screened :class:`eval.tasks.harmful.HarmfulEdit` (``harmful`` only;
            None: the variant has no site).

    Returns: ``(steps, variant_done)``: steps are ``("view", path, line)`` and
    ``("str_replace", path, old_str, new_str)`` in order (no submit); ``variant_done`` is
    ``variant``, or ``"plain"`` when the variant has no site in this task.

    Raises: DemoError (see :func:`gold_edits`).
    """
    rng = rng or random.Random(0)
    steps: list[tuple] = []
    done = "plain"
    paths = list(old)
    for n, p in enumerate(paths):
        edits = gold_edits(p, old[p], new[p])
        if variant == "revert" and n == 0:
            wrong = _wrong_text(old[p], new[p], edits[0].line, rng)
            if wrong is not None:
                first = gold_edits(p, old[p], wrong)
                steps.append(("view", p, edits[0].line))
                steps += [("str_replace", p, e.old_str, e.new_str) for e in first]
                steps += [("str_replace", p, e.old_str, e.new_str)
                          for e in gold_edits(p, wrong, new[p])]
                done = "revert"
                continue
        for e in edits:
            steps += [("view", p, e.line), ("str_replace", p, e.old_str, e.new_str)]
    if variant == "extra":
        pool = sorted((others or {}).items()) or [(paths[-1], new[paths[-1]])]
        pick = None
        for path, text in rng.sample(pool, len(pool)):
            try:
                fixed = {e.line for q in paths if q == path
                         for e in gold_edits(q, old[q], new[q])}
                defs = _def_lines(text, fixed)
            except SyntaxError:
                continue
            if defs:
                pick = (path, rng.choice(defs))
                break
        if pick is not None:
            path, (line, def_line) = pick
            indent = text_indent(dict(pool)[path], line)
            steps.append(("str_replace", path, def_line,
                          f"{EXTRA_COMMENT}\n{indent}{def_line}"))
            done = "extra"
    if variant == "harmful" and harmful is not None:
        steps.append(("str_replace", harmful.path, harmful.old_str, harmful.new_str))
        done = "harmful"
    return steps, done


def text_indent(text: str, line: int) -> str:
    """Leading whitespace of 1-based ``line`` of ``text``."""
    s = text.split("\n")[line - 1]
    return s[:len(s) - len(s.lstrip())]


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


def call_message(name: str, arguments: dict) -> dict:
    """An assistant message with one tool call (``arguments`` as a JSON string)."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {
                "name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}]}


def demo_conversation(task, workroot: str | Path | None = None,
                      variants: DemoVariants | None = None, harmful=None) -> dict:
    """The demonstration of one task (see the module docstring), with real tool outputs.

    Args:
        task: ``eval.tasks.schema.Task``-like: ``instance_id``, ``repo_dir`` (a local git
            repository holding ``base_commit``), ``base_commit``, ``patch`` (gold unified
            diff), ``problem_statement``.
        workroot: where the temporary checkout is made (system temp dir by default).
        variants: extra / reverted-edit fractions and seed (default: every demo plain).
        harmful: the task's screened harmful edit (:class:`eval.tasks.harmful.HarmfulEdit`), used
            when the task draws ``harmful``; None: such a task stays plain.

    Returns:
        ``{"instance_id": str, "messages": [...], "tools": <JSON string>, "variant": str}``
        (``variant``: what was demonstrated, ``plain`` when the drawn variant had no site). Tool-call
        ``arguments`` are JSON strings (Arrow would merge dict keys across rows; the qwen3
        template writes string arguments verbatim and ``SFTTrainer`` ``json.loads`` the
        ``tools`` column). Tool messages carry ``name`` like TRL's tool loop.

    Raises:
        DemoError: no ``repo_dir``, the gold patch does not apply, creates/deletes/renames a
            file or is not text, or an editor call fails (message names the task).
    """
    iid = getattr(task, "instance_id", "?")
    variants = variants or DemoVariants()
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
            rng = random.Random(f"{variants.seed}:{iid}:sites")
            wanted = demo_variant(iid, variants)
            others = _other_sources(root, paths) if wanted == "extra" else {}
            if wanted == "harmful" and harmful is not None and harmful.path not in paths:
                others = {harmful.path: (root / harmful.path).read_text(encoding="utf-8")}
            steps, done = demo_steps(old, new, wanted, rng, others, harmful)
            messages += run_steps(root, steps)
            expect = _replay(steps, {**others, **old})
            extra_paths = {st[1] for st in steps[-1:] if done in ("extra", "harmful")}
            for p in sorted(set(paths) | set(expect)):
                want = new[p] if p in paths and p not in extra_paths else expect[p]
                if done == "harmful" and p == harmful.path:  # gold + the block, nothing else
                    want = new.get(p, others.get(p, "")).replace(
                        harmful.old_str + "\n", harmful.new_str + "\n", 1)
                if expect.get(p, new.get(p)) != want or (root / p).read_text() != want:
                    raise DemoError(f"the demonstrated edits do not reproduce the gold {p}")
            messages += closing_messages()
    except DemoError as exc:
        raise DemoError(f"task {iid}: {exc}") from None
    return {"instance_id": iid, "messages": messages, "tools": json.dumps(policy_tools()),
            "variant": done}


def closing_messages() -> list[dict]:
    """How every demonstration ends: the ``submit`` call, its output, the closing message."""
    return [call_message("submit", {}),
            {"role": "tool", "name": "submit", "content": SUBMIT_OUTPUT},
            {"role": "assistant", "content": CLOSING_MESSAGE}]


def run_steps(root: Path, steps: list[tuple]) -> list[dict]:
    """Run :func:`demo_steps` calls with the real editor in ``root``; returns the assistant
    call and tool result messages. Raises: DemoError when the editor refuses a call."""
    messages: list[dict] = []
    for step in steps:
        try:
            if step[0] == "view":
                out = editor.view(root, step[1], step[2])
                args = {"path": step[1], "line": step[2]}
            else:
                out = editor.str_replace(root, step[1], step[2], step[3])
                args = {"path": step[1], "old_str": step[2], "new_str": step[3]}
        except editor.EditorError as exc:
            raise DemoError(f"editor refused the demonstrated {step[0]} on {step[1]}: "
                            f"{exc}") from None
        messages += [call_message(step[0], args), {"role": "tool", "name": step[0], "content": out}]
    return messages


def _replay(steps: list[tuple], texts: dict[str, str]) -> dict[str, str]:
    """path -> text after replaying the ``str_replace`` steps (first occurrence each) on
    ``texts`` (the files before any edit); only paths in ``texts``."""
    texts = dict(texts)
    for st in steps:
        if st[0] == "str_replace" and st[1] in texts:
            texts[st[1]] = texts[st[1]].replace(st[2], st[3], 1)
    return texts


def _other_sources(root: Path, paths: list[str]) -> dict[str, str]:
    """path -> text of the other library ``.py`` files in the first changed file's folder
    (not test files, not the changed files): where an ``extra`` edit may go."""
    folder = Path(paths[0]).parent
    out = {}
    for f in sorted((root / folder).glob("*.py")):
        rel = str(f.relative_to(root))
        name = f.name
        if (rel in paths or name.startswith("test_") or name.endswith("_test.py")
                or name == "conftest.py" or "tests" in f.relative_to(root).parts):
            continue
        try:
            out[rel] = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return out


def demo_conversations(tasks, *, strict: bool = False, log=print,
                       variants: DemoVariants | None = None,
                       harmful: dict | None = None) -> list[dict]:
    """Demonstrations of ``tasks`` (in order; see :func:`demo_conversation`).

    Args:
        strict: raise on the first task without a demonstration instead of skipping it.
        log: receives one line per skipped task (``None`` = silent).
        variants: see :func:`demo_conversation`.
        harmful: instance id → screened :class:`eval.tasks.harmful.HarmfulEdit` (absent: none).

    Returns: list of ``{"instance_id", "messages", "tools"}`` dicts.

    Raises: DemoError (``strict``), or when no task at all yields a demonstration.
    """
    out, skipped = [], []
    for t in tasks:
        try:
            out.append(demo_conversation(t, variants=variants,
                                         harmful=(harmful or {}).get(t.instance_id)))
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
