"""Site demonstrations: a copy curriculum for the warm start on a localized world.

A localized world's problem statement quotes the broken line as a traceback frame (file,
line, function, the line's text; the design page, "Evaluation"). A policy that transfers to
held-out functions must *copy* from that frame: the line number into ``view``, the quoted
text into ``str_replace``'s ``old_str``. One demonstration per training instance does not
teach that: a small model trained from scratch on a few hundred of them memorises which
lines each function's bugs sit on and writes those numbers on unseen code.

So the warm start may add demonstrations at **mutation sites** of the training functions
that no instance was built for (no verifier trial is needed to demonstrate undoing a
change): every site :func:`eval.tasks.bundled.mutations.find_mutations` finds, of the kinds
the training instances use, inside a function (the held-out unit) that some training
instance already mutates, never any other function, so no held-out function is ever
broken in a demonstration. Each site is demonstrated ``per_site`` times, each time with
the file shifted down by a seeded number of padding comment lines (``0..max_shift``), so
the line number to copy differs from one demonstration of a site to the next and cannot
be memorised.

A demonstration's statement is a training instance's statement of the same function (its
failing tests and messages) with the frame replaced by the site's; the episode is the plain
demonstration (``view`` → ``str_replace`` → ``submit`` → closing message,
:mod:`ecredit_trl.policy.demos`), every tool output from the real editor on a checkout of
the pristine commit with the shifted, mutated file written in.
"""

from __future__ import annotations

import json
import random
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ecredit_trl.agent.env import _clone_at
from ecredit_trl.agent.prompts import policy_tools, task_prompt
from ecredit_trl.policy.demos import DemoError, closing_messages, demo_steps, run_steps
from eval.tasks.bundled.mutations import Mutation, find_mutations, mutation_is_valid
from eval.tasks.bundled.world import unit_of

__all__ = ["FRAME_HEADER", "PADDING_LINE", "SiteCurriculum", "site_demonstrations",
           "training_sites", "with_frame"]

#: The line a localized statement puts before its frames (``make_problem_statement``).
FRAME_HEADER = "The failures trace to this library code:"

#: Each padding line prepended to a shifted file (a comment: the module's behaviour is
#: unchanged).
PADDING_LINE = "#"


@dataclass(frozen=True)
class SiteCurriculum:
    """How many site demonstrations the warm start adds.

    Attributes:
        per_site: demonstrations per mutation site (0: none; each with its own shift).
        max_shift: most padding lines prepended to the mutated file (uniform in
            ``0..max_shift``, drawn per demonstration).
        seed: seeds the shifts and the statement templates.
    """

    per_site: int = 0
    max_shift: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for name, lo in (("per_site", 0), ("max_shift", 0), ("seed", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"site demonstrations: {name} must be an int >= {lo}, "
                                 f"got {v!r}")


def with_frame(statement: str, frame: tuple[str, int, str, str]) -> str:
    """``statement`` (a localized one) with its frames replaced by one ``(path, line,
    function, text)`` frame, written as ``make_problem_statement`` writes it.

    Raises: DemoError when ``statement`` has no :data:`FRAME_HEADER` (not a localized world).
    """
    head, sep, rest = statement.partition("\n" + FRAME_HEADER + "\n")
    if not sep:
        raise DemoError(f"problem_statement: no {FRAME_HEADER!r} line (site demonstrations "
                        "need a localized world's tasks)")
    tail = rest.split("\n\n", 1)[1] if "\n\n" in rest else ""
    path, line, function, text = frame
    quoted = (f'  File "{path}", line {line}, in {function or "<module>"}\n'
              f"    {text.strip()}")
    return f"{head}\n{FRAME_HEADER}\n{quoted}\n\n{tail}"


def _extra(task) -> dict:
    ex = getattr(task, "extra", None) or {}
    return json.loads(ex) if isinstance(ex, str) else ex


def _show(repo: str, commit: str, path: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"],
                          capture_output=True)
    if proc.returncode != 0:
        raise DemoError(f"{repo}: cannot read {path} at {commit}: "
                        f"{proc.stderr.decode(errors='replace').strip()[:200]}")
    return proc.stdout.decode("utf-8")


def training_sites(tasks) -> list[tuple[object, Mutation, str]]:
    """The mutation sites the curriculum demonstrates, with the pristine text of their file.

    Args:
        tasks: a world's training tasks (``extra`` with ``split == "train"``, ``unit``
            ``"<path>::<function>"``, ``project``, ``pristine_commit``, ``mutations``;
            ``repo_dir`` a local repository).

    Returns: ``(template task, mutation, pristine text)`` per site, in a fixed order: every
    valid site of the training instances' mutation kinds whose function is the unit of some
    training instance (the template is one such instance, the first by id).

    Raises:
        ValueError: a task is not a world training instance (names the task and field),
            or one project's tasks disagree on the pristine commit.
        DemoError: a file cannot be read at the pristine commit.
    """
    by_unit: dict[tuple[str, str], list] = {}
    pristine: dict[str, tuple[str, str]] = {}
    kinds: set[str] = set()
    for t in sorted(tasks, key=lambda t: t.instance_id):
        ex = _extra(t)
        if ex.get("split") != "train":
            raise ValueError(f"task {t.instance_id}: extra.split is {ex.get('split')!r}; site "
                             "demonstrations take a world's training instances only")
        for field in ("unit", "project", "pristine_commit"):
            if not isinstance(ex.get(field), str) or not ex[field]:
                raise ValueError(f"task {t.instance_id}: extra.{field} missing")
        if not getattr(t, "repo_dir", None):
            raise ValueError(f"task {t.instance_id}: repo_dir missing")
        got = (str(t.repo_dir), ex["pristine_commit"])
        if pristine.setdefault(ex["project"], got) != got:
            raise ValueError(f"task {t.instance_id}: project {ex['project']} has another "
                             f"repository or pristine commit than {pristine[ex['project']]}")
        by_unit.setdefault((ex["project"], ex["unit"]), []).append(t)
        kinds |= {m["kind"] for m in ex.get("mutations", []) if "kind" in m}
    out = []
    paths = sorted({(proj, unit.split("::", 1)[0]) for proj, unit in by_unit})
    for proj, path in paths:
        repo, commit = pristine[proj]
        text = _show(repo, commit, path)
        for m in find_mutations(path, text, tuple(sorted(kinds))):
            unit = (proj, unit_of(m, "function")) if m.function else None
            if unit in by_unit and mutation_is_valid(text, m):
                out.append((by_unit[unit][0], m, text))
    return out


def site_demonstrations(tasks, curriculum: SiteCurriculum, *, workroot=None,
                        log=print) -> list[dict]:
    """The curriculum's demonstrations (module docstring), ``per_site`` per site.

    Args:
        tasks: a world's training tasks (:func:`training_sites`).
        curriculum: how many and how shifted.
        workroot: where the temporary checkouts go (system temp dir by default).
        log: one summary line (``None`` = silent).

    Returns: ``{"instance_id": "site__<project>__<site index>__<path>:<line>:<kind>:<n>+<shift>",
    "messages", "tools", "variant": "site"}`` dicts, the shape of
    :func:`ecredit_trl.policy.demos.demo_conversation`'s.

    Raises: ValueError / DemoError (:func:`training_sites`); DemoError when a demonstrated
    edit does not restore the pristine file.
    """
    if curriculum.per_site == 0:
        return []
    sites = training_sites(tasks)
    rng = random.Random(f"{curriculum.seed}:sites")
    tools = json.dumps(policy_tools())
    out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ecredit-sites-", dir=workroot) as tmp:
        roots: dict[str, Path] = {}
        for i, (template, m, text) in enumerate(sites):
            ex = _extra(template)
            root = roots.get(ex["project"])
            if root is None:
                root = roots[ex["project"]] = Path(tmp) / ex["project"]
                _clone_at(template.repo_dir, ex["pristine_commit"], root)
            buggy = m.apply(text)
            buggy_line = buggy.split("\n")[m.line - 1]
            for n in range(curriculum.per_site):
                shift = rng.randint(0, curriculum.max_shift)
                pad = (PADDING_LINE + "\n") * shift
                old, new = pad + buggy, pad + text
                statement = with_frame(template.problem_statement,
                                       (m.path, m.line + shift, m.function, buggy_line))
                steps, _ = demo_steps({m.path: old}, {m.path: new})
                (root / m.path).write_text(old, encoding="utf-8")
                messages = task_prompt(_Statement(statement)) + run_steps(root, steps)
                if (root / m.path).read_text(encoding="utf-8") != new:
                    raise DemoError(f"site {m.path}:{m.line}: the demonstrated edits do not "
                                    "restore the pristine file")
                (root / m.path).write_text(text, encoding="utf-8")
                messages += closing_messages()
                out.append({"instance_id": f"site__{ex['project']}__{i:04d}__{m.path}:"
                                           f"{m.line}:{m.kind}:{n}+{shift}",
                            "messages": messages, "tools": tools,
                            "variant": "site"})
    if log:
        log(f"warmstart: {len(out)} site demonstrations ({len(sites)} sites x "
            f"{curriculum.per_site}, shifts 0..{curriculum.max_shift})")
    return out


@dataclass(frozen=True)
class _Statement:
    """What :func:`task_prompt` reads of a task."""

    problem_statement: str
    instance_id: str = "site"
