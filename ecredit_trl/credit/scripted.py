"""Scripted trajectories with known answers, derived from each task's gold patch.

For tests and the signal pilot: no policy is needed, yet every kind of edit block
appears and the expected eligibility (and, where it is knowable, the sign of D)
is written into the trajectory itself (``extra["scripted"]``).

Kinds (one rollout each, rollout index = position in :data:`KINDS`):

``mixed``
    notes file created · test-only edit · a draft of the gold file that a later
    turn overwrites · a needed module deleted (damage) · gold part 1 · a no-op
    comment in another module · gold part 2 · the deleted module written back
    with its base bytes (a repair: eligible, absent from the final diff) · an
    unreferenced documentation file deleted. The gold fix is split over two
    turns by file when it touches several files, else by hunk when it has
    several hunks; a one-hunk fix lands in one turn (``gold_split: "none"``).
``gold_only``
    the whole gold fix in one turn (its ablation is the empty patch).
``nofix``
    notes file · no-op comment · test-only edit (the original fails).
``tests_only``
    one test-only edit (no eligible block).
``format_error``
    a rollout flagged ``format_error``.
``gold_split``
    only the two halves of the split gold fix, one turn each (not built when the
    fix cannot be split, e.g. a one-line bug: ``gold_split: "none"``).

Expected D signs per turn (``expect_d``): ``"+"`` removing a needed gold block
from a resolving artifact; ``"0"`` a no-op (comment, new notes file); ``"?"``
not knowable in advance (repair of a module the tests may not import, deleted
docs, the two halves of a split fix).

``python -m ecredit_trl.credit.scripted --tasks bundled --out FILE [--max-tasks N]``
writes them as JSONL.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ecredit_trl.credit.blocks import DEFAULT_TEST_PATTERNS, is_test_path, selection_seed
from ecredit_trl.credit.taskbase import s0_source
from ecredit_trl.credit.trajectory import (
    FileWrite,
    ReplayError,
    Trajectory,
    Turn,
    checkout_base,
    dump_trajectories,
)
from eval.tasks.splits import load_tasks
from sandbox.bounds import ArgumentParser, Int, OutFile, Source, Text
from sandbox.snapshots.snapshot import Snapshotter, changed_paths

__all__ = ["KINDS", "GoldInfo", "gold_info", "scripted_for_task", "scripted_trajectories"]

KINDS: tuple[str, ...] = ("mixed", "gold_only", "nofix", "tests_only", "format_error",
                          "gold_split")

NOTES_PATH = "agent_notes.md"
NOISE_LINE = b"# agent: no-op note\n"


def _git(args: list[str], cwd, *, input: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True)
    if proc.returncode != 0:
        raise ReplayError(f"git {args[0]} failed in {cwd}: "
                          f"{proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


class GoldInfo:
    """What a task's gold patch does, as file contents.

    Attributes:
        base: path -> base bytes (None when absent) for every gold path.
        gold: path -> bytes after the gold patch (None when deleted).
        split: ``"files"``, ``"hunks"`` or ``"none"``.
        part1: path -> bytes of the first half of the split fix (empty for "none").
        files: every file of the base tree (sorted).
        base_bytes: callable path -> bytes of the base tree.
    """

    def __init__(self, base, gold, split, part1, files, reader):
        self.base, self.gold, self.split, self.part1 = base, gold, split, part1
        self.files, self.base_bytes = files, reader


def _split_sections(patch: str) -> list[str]:
    parts = re.split(r"(?m)^(?=diff --git )", patch)
    return [p for p in parts if p.strip()]


def _first_hunks(section: str) -> str | None:
    """The section with only its first ceil(h/2) hunks, or None when h < 2."""
    lines = section.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.startswith("@@")]
    if len(starts) < 2:
        return None
    keep = (len(starts) + 1) // 2
    return "".join(lines[:starts[keep]])


def gold_info(task, tmp: Path, source: tuple[str, str] | None = None) -> GoldInfo:
    """Apply ``task.patch`` in scratch clones under ``tmp`` and read the contents.

    ``source``: ``(repository, commit)`` of S_0 (:func:`ecredit_trl.credit.taskbase.s0_source`;
    default ``(task.repo_dir, task.base_commit)``); it must outlive the returned reader.

    Raises: ReplayError when the base cannot be checked out or the gold patch
    does not apply.
    """
    repo, commit = source or (task.repo_dir, task.base_commit)
    work = checkout_base(repo, commit, tmp / "gold")
    files = sorted(_git(["ls-tree", "-r", "--name-only", "-z", "HEAD"], work)
                   .decode().split("\0"))
    files = [f for f in files if f]

    def reader(path: str) -> bytes:  # reads ``source``, which outlives the clones in ``tmp``
        return _git(["cat-file", "blob", f"{commit}:{path}"], repo)

    with Snapshotter(work, store=work / ".git") as snap:  # our clone: its .git is ours alone
        _git(["apply", "--whitespace=nowarn", "-"], work, input=task.patch.encode())
        gold_tree = snap.snapshot()
        base_tree = snap.base_tree
    changes = changed_paths(work, base_tree, gold_tree)
    base = {c.path: (reader(c.path) if c.old_mode != "000000" else None) for c in changes}
    gold = {c.path: (_git(["cat-file", "blob", f"{gold_tree}:{c.path}"], work)
                     if c.new_mode != "000000" else None) for c in changes}
    split, part1 = "none", {}
    paths = sorted(gold)
    if len(paths) >= 2:
        split = "files"
        part1 = {p: gold[p] for p in paths[: (len(paths) + 1) // 2]}
    elif len(paths) == 1:
        sections = _split_sections(task.patch)
        half = _first_hunks(sections[0]) if len(sections) == 1 else None
        if half is not None:
            w2 = checkout_base(repo, commit, tmp / "half")
            _git(["apply", "--whitespace=nowarn", "-"], w2, input=half.encode())
            p = paths[0]
            content = (w2 / p).read_bytes()
            if content not in (base[p], gold[p]):
                split, part1 = "hunks", {p: content}
    return GoldInfo(base, gold, split, part1, files, reader)


def _pick(rng: random.Random, items: Sequence[str]) -> str | None:
    return rng.choice(sorted(items)) if items else None


def scripted_for_task(task, *, kinds: Sequence[str] = KINDS, seed: int = 0,
                      test_patterns: Sequence[str] = DEFAULT_TEST_PATTERNS,
                      cache_dir: str | Path | None = None) -> list[Trajectory]:
    """Scripted rollouts of one task (see the module docstring for the kinds).

    Args:
        task: an :class:`eval.tasks.schema.Task` with a gold ``patch`` and either ``repo_dir`` +
            ``base_commit`` or, image-held, an ``image`` present locally: then the writes
            are made against S_0 = the image's tree at reset, the base the agent
            environment starts from (:func:`ecredit_trl.credit.taskbase.s0_source`).
        kinds: which kinds to build, a subset of :data:`KINDS`.
        seed: seeds token counts and the choice of noise/repair/doc files.
        test_patterns: test-path patterns (files matching them are never used
            as noise or repair targets).
        cache_dir: where an image's S_0 store is made (default: a temporary folder
            removed before returning).

    Returns: one :class:`Trajectory` per kind (``gold_split`` only when the fix can be
    split); rollout index = ``KINDS.index(kind)``.

    Raises:
        ValueError: an unknown kind, or a task with neither ``repo_dir`` nor ``image``.
        ReplayError: the gold patch does not apply to the base.
        sandbox.workspace.imagetree.ImageTreeError: the task's image cannot be read.
    """
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"kinds: unknown {bad}; expected a subset of {KINDS}")
    tmp = Path(tempfile.mkdtemp(prefix="ecredit-scripted-"))
    try:  # the S_0 store (image tasks) must outlive gold_info: its reader is used below
        source = s0_source(task, cache_dir or tmp / "images")
        info = gold_info(task, tmp, source)
        return _build(task, info, kinds, seed, test_patterns)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build(task, info: GoldInfo, kinds: Sequence[str], seed: int,
           test_patterns: Sequence[str]) -> list[Trajectory]:
    """The trajectories of :func:`scripted_for_task` from the task's :class:`GoldInfo`."""
    rng = random.Random(selection_seed(seed, task.instance_id, -1))
    tg = _targets(info, rng, test_patterns)
    turn = _TurnMaker(rng)  # every turn draws its token count: the call order is the seed's
    common = {
        "notes": turn("create", {tg.notes: _w(b"# notes\nlooked at the failing tests\n")},
                      (), "0"),
        "test": turn("test_only", {tg.test_file: _w(b"# scratch notes of the agent (no tests)\n")},
                     ("test_only",), "?"),
        "noise": (turn("noise", {tg.noise: _w(_append(info.base_bytes(tg.noise)))}, (), "0")
                  if tg.noise else None),
    }
    gold_paths = set(info.gold)
    out: list[Trajectory] = []
    for kind in kinds:
        plan = _kind_plan(kind, info, tg, turn, common)
        if plan is None:
            continue
        turns = tuple(t for t, _ in plan)
        expect = [e for _, e in plan]
        out.append(Trajectory(
            task_id=task.instance_id, rollout_index=KINDS.index(kind),
            format_error=kind == "format_error", turns=turns,
            extra={"scripted": {"kind": kind, "gold_split": info.split,
                                "gold_paths": sorted(gold_paths), "turns": expect}}))
    return out


@dataclass(frozen=True)
class _Targets:
    """Files a scripted task's turns write besides the gold ones (None: none suitable)."""

    noise: str | None  # a source file near the fix, appended to (D = 0)
    repair: str | None  # a source file deleted, then restored
    test_file: str  # a new file under a test directory (test-only block)
    notes: str  # a new notes file (D = 0)
    doc: str | None  # an unreferenced doc file deleted


def _targets(info: GoldInfo, rng: random.Random, test_patterns: Sequence[str]) -> _Targets:
    """Pick the noise / repair / test / notes / doc files (noise and repair from the source
    files next to the fix when there are any, drawn from ``rng`` in that order)."""
    gold_paths = set(info.gold)
    gold_dirs = {str(PurePosixPath(p).parent) for p in gold_paths}
    src_py = [f for f in info.files if f.endswith(".py") and f not in gold_paths
              and not is_test_path(f, test_patterns)]
    near = [f for f in src_py if str(PurePosixPath(f).parent) in gold_dirs]
    noise = _pick(rng, near or src_py)
    repair_pool = [f for f in (near or src_py) if f != noise]
    repair = _pick(rng, repair_pool)
    test_dirs = sorted({str(PurePosixPath(f).parent) for f in info.files
                        if is_test_path(f, test_patterns) and f.endswith(".py")})
    tdir = next((d for d in test_dirs if is_test_path(f"{d}/x.txt", test_patterns)), "tests")
    test_file = f"{tdir}/test_agent_scratch.py" if tdir != "." else "test_agent_scratch.py"
    while test_file in info.files:
        test_file = test_file.replace(".py", "_x.py")
    notes = NOTES_PATH
    while notes in info.files:
        notes = "x_" + notes
    return _Targets(noise, repair, test_file, notes, _unreferenced_doc(info))


class _TurnMaker:
    """``turn(role, writes, expect_reasons, expect_d)`` → (Turn with a token count drawn
    from ``rng`` in [20, 160], the turn's expectation dict)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def __call__(self, role, writes, expect_reasons=(), expect_d="?"):
        return (Turn(self.rng.randint(20, 160), writes),
                {"role": role, "expect_reasons": list(expect_reasons), "expect_d": expect_d})


def _w(data, exe=None) -> FileWrite:
    return FileWrite(data, exe)


def _gold_parts(info: GoldInfo, turn: _TurnMaker) -> tuple:
    """The two turns of a split fix (part 1 is overwritten by part 2 when the split is by
    hunks, so it is then not last-touch)."""
    p1_reasons = ("not_last_touch",) if info.split == "hunks" else ()
    part1 = turn("gold_part1", {p: _w(c) for p, c in info.part1.items()}, p1_reasons, "?")
    rest = {p: _w(c) for p, c in info.gold.items()
            if info.split == "hunks" or p not in info.part1}
    part2 = turn("gold_part2", rest, (), "?" if info.split == "files" else "+")
    return part1, part2


def _kind_plan(kind: str, info: GoldInfo, tg: _Targets, turn: _TurnMaker,
               common: dict) -> list[tuple] | None:
    """The (turn, expectation) list of one kind; None for ``gold_split`` when the fix cannot
    be split."""
    gold_all = {p: _w(c) for p, c in info.gold.items()}
    notes_t, test_t, noise_t = common["notes"], common["test"], common["noise"]
    plan: list[tuple] = []
    if kind == "mixed":
        plan += [notes_t, test_t]
        first = sorted(info.gold)[0]
        draft = (info.base[first] or b"") + b"\n# draft: not done yet\n"
        plan.append(turn("draft", {first: _w(draft)}, ("not_last_touch",), "?"))
        if tg.repair:
            plan.append(turn("damage", {tg.repair: _w(None)}, ("not_last_touch",), "?"))
        if info.split == "none":
            plan.append(turn("gold", gold_all, (), "+"))
            if noise_t:
                plan.append(noise_t)
        else:
            part1, part2 = _gold_parts(info, turn)
            plan += [part1] + ([noise_t] if noise_t else []) + [part2]
        if tg.repair:
            plan.append(turn("repair", {tg.repair: _w(info.base_bytes(tg.repair))}, (), "?"))
        if tg.doc:
            plan.append(turn("delete_doc", {tg.doc: _w(None)}, (), "?"))
    elif kind == "gold_only":
        plan.append(turn("gold", gold_all, (), "+"))
    elif kind == "nofix":
        plan += [notes_t] + ([noise_t] if noise_t else []) + [test_t]
    elif kind == "tests_only":
        plan.append(test_t)
    elif kind == "format_error":
        plan.append(notes_t)
    elif kind == "gold_split":
        if info.split == "none":
            return None
        plan += list(_gold_parts(info, turn))
    return plan


def _append(data: bytes) -> bytes:
    if data and not data.endswith(b"\n"):
        data += b"\n"
    return data + NOISE_LINE


def _unreferenced_doc(info: GoldInfo) -> str | None:
    """A top-level documentation file whose name no other text file mentions."""
    cands = [f for f in info.files if "/" not in f
             and re.search(r"(?i)^(readme|changes|changelog|history|authors|contributing)"
                           r"|\.(rst|md|txt)$", f)
             and f not in info.gold and not f.lower().startswith(("license", "setup", "requirements"))]
    for cand in sorted(cands):
        name = cand.encode()
        stem = PurePosixPath(cand).stem.encode()
        referenced = False
        for f in info.files:
            if f == cand:
                continue
            try:
                data = info.base_bytes(f)
            except ReplayError:
                continue
            if len(data) > 1_000_000 or b"\0" in data[:1024]:
                continue
            if name in data or (len(stem) > 3 and stem in data and f.endswith((".cfg", ".toml",
                                                                               ".in", ".py"))):
                referenced = True
                break
        if not referenced:
            return cand
    return None


def scripted_trajectories(tasks: Sequence, *, kinds: Sequence[str] = KINDS, seed: int = 0,
                          max_tasks: int | None = None) -> list[Trajectory]:
    """Scripted rollouts over several tasks, picked round-robin over repositories.

    Args:
        tasks: :class:`eval.tasks.schema.Task` list (with ``repo_dir``, or image-held: see
            :func:`scripted_for_task`).
        kinds: kinds per task (see :data:`KINDS`).
        seed: see :func:`scripted_for_task`.
        max_tasks: use at most this many tasks (None: all), alternating repositories
            so that several projects are covered.

    Returns: up to ``len(kinds)`` trajectories per task used, task by task.
    """
    by_repo: dict[str, list] = {}
    for t in tasks:
        by_repo.setdefault(t.repo, []).append(t)
    order: list = []
    queues = [list(v) for _, v in sorted(by_repo.items())]
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    if max_tasks is not None:
        order = order[:max_tasks]
    out: list[Trajectory] = []
    cache = Path(tempfile.mkdtemp(prefix="ecredit-scripted-images-"))
    try:  # one S_0 store per image, shared by its tasks
        for t in order:
            out.extend(scripted_for_task(t, kinds=kinds, seed=seed, cache_dir=cache))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m ecredit_trl.credit.scripted",
                                 description="Write scripted trajectories (replay format).")
    ap.add_argument("--tasks", type=Source(), required=True, help="task source for eval.tasks.splits.load_tasks")
    ap.add_argument("--out", type=OutFile(), required=True, help="trajectory JSONL to write")
    ap.add_argument("--max-tasks", type=Int(ge=1), default=None)
    ap.add_argument("--seed", type=Int(ge=0, le=2**32 - 1, why="32-bit seeds"), default=0)
    ap.add_argument("--kinds", type=Text(), default=",".join(KINDS), help=f"comma list of {KINDS}")
    args = ap.parse_args(argv)

    trajs = scripted_trajectories(load_tasks(args.tasks), kinds=args.kinds.split(","),
                                  seed=args.seed, max_tasks=args.max_tasks)
    dump_trajectories(trajs, args.out)
    print(f"wrote {len(trajs)} trajectories to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
