"""Edit blocks, eligibility, verifier-blind selection and restore (design page, "Edit blocks
and eligibility" and "Selection and restore").

Input is the list of per-turn snapshot trees ``S_0..S_K`` of one rollout (tree
ids in one git repository, ``S_0`` = base; see :class:`sandbox.snapshots.snapshot.Snapshotter`).
Everything here is a function of those trees, the run seed, the task id and the
rollout index: nothing takes a verifier result, so nothing can look at one.

* **Edit block** ``b_k`` (k = 1..K): the paths whose content or mode differ
  between ``S_{k-1}`` and ``S_k`` (created, modified, deleted, mode/type
  changed; binary files included). Turns that change nothing have no block.
* **Eligibility** (all must hold; the reason codes of those that fail are kept):

  - ``not_last_touch``: some later turn j > k changes a path of ``b_k``, judged
    on ``S_{j-1} → S_j`` (a path changed and changed back within one turn is
    not a touch; changed in one turn and back in another is two touches);
  - ``test_only``: every path of ``b_k`` matches a test-path pattern
    (:data:`DEFAULT_TEST_PATTERNS`, see :func:`is_test_path`);
  - ``not_restorable``: restoring ``b_k``'s paths on ``S_K`` to ``S_{k-1}`` is
    not a valid tree that differs from ``S_K`` only on those paths (a restored
    file would collide with a directory ``S_K`` holds, or the reverse).

* **Selection**: uniform over the eligible turns with ``random.Random`` seeded
  from sha256 of ``(run seed, task id, rollout index)`` (:func:`selection_seed`),
  so it is the same on every machine and Python process (no salted ``hash()``).
* **Restore / ablation**: every path of the selected block takes its blob and
  mode from ``S_{k-1}``, or is deleted when absent there, applied to ``S_K``;
  the ablated artifact is ``git diff --binary`` from base and may be empty.

source: the design page, "Edit blocks and eligibility" and "Selection and restore"
"""

from __future__ import annotations

import hashlib
import json
import operator
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from sandbox.snapshots.snapshot import SnapshotError, artifact, changed_paths, restore_paths
from sandbox.trials.protect import check_pattern, matches

__all__ = [
    "DEFAULT_TEST_PATTERNS",
    "REASONS",
    "Ablation",
    "EditBlock",
    "Eligibility",
    "SelectionRecord",
    "ablate",
    "edit_blocks",
    "eligibility",
    "is_test_path",
    "select_block",
    "selection_seed",
]

DEFAULT_TEST_PATTERNS: tuple[str, ...] = (
    "tests/",
    "testing/",
    "test_*.py",
    "*_test.py",
    "conftest.py",
)
"""Default test-path patterns (design page, "Edit blocks and eligibility"). See
:func:`is_test_path` for how each form matches."""

REASONS: tuple[str, ...] = ("not_last_touch", "test_only", "not_restorable")
"""Reason codes of an ineligible block, in the order they are checked."""


# ----------------------------------------------------------------------------
# edit blocks
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EditBlock:
    """The paths one turn changed.

    Attributes:
        turn: k, 1-based (turn k produced ``S_k`` from ``S_{k-1}``).
        paths: changed paths, sorted, repository-relative POSIX strings.
        statuses: one per path, same order: ``A`` created, ``D`` deleted,
            ``M`` content changed, ``T`` type changed (file ↔ symlink), ``X``
            mode only (see :class:`sandbox.snapshots.snapshot.ChangedPath`).
        old_modes, new_modes: git octal modes per path (``000000`` when absent).
    """

    turn: int
    paths: tuple[str, ...]
    statuses: tuple[str, ...]
    old_modes: tuple[str, ...] = ()
    new_modes: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"turn": self.turn, "paths": list(self.paths), "statuses": list(self.statuses),
                "old_modes": list(self.old_modes), "new_modes": list(self.new_modes)}


def _check_snapshots(snapshots: Sequence[str]) -> list[str]:
    snaps = list(snapshots)
    if len(snaps) < 1:
        raise ValueError("snapshots: need at least S_0 (the base tree)")
    for i, s in enumerate(snaps):
        if not isinstance(s, str) or not s:
            raise ValueError(f"snapshots[{i}]: expected a tree id string, got {s!r}")
    return snaps


def edit_blocks(repo, snapshots: Sequence[str]) -> list[EditBlock]:
    """The edit blocks ``b_1..b_K`` of a rollout, one per turn that changed something.

    Args:
        repo: path of the git repository holding the snapshot trees.
        snapshots: ``[S_0, S_1, ..., S_K]`` tree ids (length K + 1, K >= 0).

    Returns:
        Blocks in turn order; a turn with ``S_{k-1} == S_k`` has no block.

    Raises:
        ValueError: ``snapshots`` is empty or holds a non-string.
        SnapshotError: a tree id is unknown in ``repo``.

    source: the design page, "Edit blocks and eligibility"
    """
    snaps = _check_snapshots(snapshots)
    blocks: list[EditBlock] = []
    for k in range(1, len(snaps)):
        if snaps[k] == snaps[k - 1]:
            continue
        changes = changed_paths(repo, snaps[k - 1], snaps[k])
        if not changes:
            continue
        blocks.append(EditBlock(
            turn=k,
            paths=tuple(c.path for c in changes),
            statuses=tuple(c.status for c in changes),
            old_modes=tuple(c.old_mode for c in changes),
            new_modes=tuple(c.new_mode for c in changes),
        ))
    return blocks


# ----------------------------------------------------------------------------
# test paths
# ----------------------------------------------------------------------------


def is_test_path(path: str, patterns: Iterable[str] = DEFAULT_TEST_PATTERNS) -> bool:
    """Whether a repository path is a test path under ``patterns``.

    Pattern forms (``fnmatch`` wildcards ``* ? [..]``, case-sensitive):

    * ``name/`` (trailing slash): a **directory** pattern; matches when any
      directory component of the path matches ``name`` (``tests/`` matches
      ``tests/a.py``, ``pkg/tests/unit/a.py``, not ``pkg/tests.py`` and not a
      file called ``tests``).
    * no slash: a **basename** pattern; matches the file name in any directory
      (``test_*.py`` matches ``test_x.py`` and ``a/b/test_x.py``;
      ``conftest.py`` matches every ``conftest.py``).
    * a slash inside (``docs/*.txt``, ``src/*/fixtures/``): matched against the
      whole path from the repository root, where ``*`` does not cross ``/``;
      with a trailing slash it matches that directory's prefix.

    Raises: ValueError naming the pattern for an empty one or one with a ``..`` component.

    One matcher serves the test-path patterns here and the verifier's protected set
    (:func:`sandbox.trials.protect.matches`), so both read a pattern the same way.
    """
    patterns = list(patterns)
    for pat in patterns:
        check_pattern(pat, "test pattern")
    return matches(path, patterns)


# ----------------------------------------------------------------------------
# eligibility
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Eligibility:
    """Eligibility of one edit block.

    Attributes:
        turn: the block's turn k.
        eligible: True when no reason applies.
        reasons: the failing rules, a subset of :data:`REASONS` in that order
            (empty when eligible). Every rule is checked, so a block may carry
            several reasons.
        later_touches: turns j > k that changed a path of the block.
        ablated_tree: the restored tree when restorable, else None.
        restore_error: SnapshotError text when not restorable, else None.
    """

    turn: int
    eligible: bool
    reasons: tuple[str, ...]
    later_touches: tuple[int, ...] = ()
    ablated_tree: str | None = None
    restore_error: str | None = None

    @property
    def reason(self) -> str | None:
        """The first failing rule, or None when eligible."""
        return self.reasons[0] if self.reasons else None

    def to_json(self) -> dict:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        d["later_touches"] = list(self.later_touches)
        return d


def eligibility(repo, snapshots: Sequence[str], blocks: Sequence[EditBlock] | None = None,
                *, test_patterns: Iterable[str] = DEFAULT_TEST_PATTERNS) -> list[Eligibility]:
    """Judge every edit block of a rollout (no verifier result is read).

    Args:
        repo: git repository holding the snapshot trees.
        snapshots: ``[S_0, ..., S_K]`` tree ids.
        blocks: the rollout's blocks (default: :func:`edit_blocks` of ``snapshots``).
        test_patterns: test-path patterns (see :func:`is_test_path`).

    Returns:
        One :class:`Eligibility` per block, same order. A restorable block
        carries its ablated tree, so :func:`ablate` does not recompute it.

    Raises:
        ValueError: bad ``snapshots`` or a block whose turn is out of range.
        SnapshotError: a tree id is unknown (a failed restore is not raised:
            it is the ``not_restorable`` reason).

    source: the design page, "Edit blocks and eligibility"
    """
    snaps = _check_snapshots(snapshots)
    patterns = tuple(test_patterns)
    if blocks is None:
        blocks = edit_blocks(repo, snaps)
    K = len(snaps) - 1
    # paths changed by each turn j (S_{j-1} -> S_j), computed once.
    touched: dict[int, set[str]] = {}
    for j in range(1, K + 1):
        touched[j] = (set() if snaps[j] == snaps[j - 1]
                      else {c.path for c in changed_paths(repo, snaps[j - 1], snaps[j])})
    out: list[Eligibility] = []
    for b in blocks:
        if not 1 <= b.turn <= K:
            raise ValueError(f"blocks: turn {b.turn} outside 1..{K}")
        reasons: list[str] = []
        paths = set(b.paths)
        later = tuple(j for j in range(b.turn + 1, K + 1) if touched[j] & paths)
        if later:
            reasons.append("not_last_touch")
        if all(is_test_path(p, patterns) for p in b.paths):
            reasons.append("test_only")
        tree: str | None = None
        err: str | None = None
        try:
            tree = restore_paths(repo, snaps[-1], snaps[b.turn - 1], list(b.paths))
        except SnapshotError as exc:
            err = str(exc)
            reasons.append("not_restorable")
        out.append(Eligibility(turn=b.turn, eligible=not reasons, reasons=tuple(reasons),
                               later_touches=later, ablated_tree=tree, restore_error=err))
    return out


# ----------------------------------------------------------------------------
# selection
# ----------------------------------------------------------------------------


def selection_seed(run_seed: int, task_id: str, rollout_index: int) -> int:
    """The 64-bit RNG seed of one rollout's selection.

    First 8 bytes (big-endian) of ``sha256(json.dumps([run_seed, task_id,
    rollout_index]))``: stable across processes, machines and Python versions.

    Raises: ValueError for a non-int seed/index or a non-str task id.
    """
    if isinstance(run_seed, bool) or not isinstance(run_seed, int):
        raise ValueError(f"run_seed: expected int, got {run_seed!r}")
    if not isinstance(task_id, str) or not task_id:
        raise ValueError(f"task_id: expected a non-empty str, got {task_id!r}")
    if isinstance(rollout_index, bool) or not isinstance(rollout_index, int):
        raise ValueError(f"rollout_index: expected int, got {rollout_index!r}")
    blob = json.dumps([run_seed, task_id, rollout_index], separators=(",", ":")).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big")


def select_block(eligible_turns: Iterable[int], *, run_seed: int, task_id: str,
                 rollout_index: int) -> int | None:
    """Pick one eligible turn uniformly, deterministically, blind to the verifier.

    The signature is the whole input: turns, run seed, task id and rollout
    index. No verifier result can reach the choice.

    Args:
        eligible_turns: turn indices (ints >= 1) of the eligible blocks; order and
            duplicates do not matter (they are sorted and de-duplicated).
        run_seed: the run's seed.
        task_id: the task's instance id.
        rollout_index: index of the rollout within the task (>= 0).

    Returns:
        The selected turn, or None when there is no eligible turn.

    Raises:
        ValueError: a turn that is not an int >= 1, or a bad seed/id/index.

    source: the design page, "Selection and restore"
    """
    turns: set[int] = set()
    for t in eligible_turns:
        if isinstance(t, bool):
            raise ValueError(f"eligible_turns: expected int >= 1, got {t!r}")
        try:
            ti = operator.index(t)
        except TypeError:
            raise ValueError(f"eligible_turns: expected int >= 1, got {t!r}") from None
        if ti < 1:
            raise ValueError(f"eligible_turns: expected int >= 1, got {t!r}")
        turns.add(ti)
    seed = selection_seed(run_seed, task_id, rollout_index)
    if not turns:
        return None
    ordered = sorted(turns)
    return ordered[random.Random(seed).randrange(len(ordered))]


@dataclass
class SelectionRecord:
    """The verifier-blind choice for one rollout, written before any trial runs.

    Attributes:
        task_id, rollout_index: the rollout.
        run_seed: the run seed; ``seed`` is :func:`selection_seed` of the three.
        blocks: every edit block (:meth:`EditBlock.to_json`).
        eligibility: per block (:meth:`Eligibility.to_json`, ablated tree included).
        eligible_turns: sorted eligible turns.
        selected_turn: the selected turn, or None.
        selected_paths: paths of the selected block (empty when none).
        test_patterns: the test-path patterns used.
        generated_only: turns that made no block because every file they created was a
            generated file (``sandbox.snapshots.snapshot.DEFAULT_SNAPSHOT_IGNORE``, never recorded):
            ``[{"turn": k, "paths": [...]}]``, sorted by turn.
    """

    task_id: str
    rollout_index: int
    run_seed: int
    seed: int
    blocks: list[dict]
    eligibility: list[dict]
    eligible_turns: list[int]
    selected_turn: int | None
    selected_paths: list[str] = field(default_factory=list)
    test_patterns: list[str] = field(default_factory=lambda: list(DEFAULT_TEST_PATTERNS))
    generated_only: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def build(cls, *, task_id: str, rollout_index: int, run_seed: int,
              blocks: Sequence[EditBlock], judged: Sequence[Eligibility],
              test_patterns: Iterable[str] = DEFAULT_TEST_PATTERNS,
              generated: Mapping[int, Sequence[str]] | None = None) -> SelectionRecord:
        """Select (with :func:`select_block`) and record the choice.

        ``generated`` maps a turn to the generated files that appeared in it (not in
        any snapshot); a turn with such files and no block is reported in
        ``generated_only``.

        Raises: ValueError when ``blocks`` and ``judged`` disagree on turns.
        """
        if [b.turn for b in blocks] != [e.turn for e in judged]:
            raise ValueError("judged: eligibility turns do not match the blocks")
        eligible = sorted(e.turn for e in judged if e.eligible)
        sel = select_block(eligible, run_seed=run_seed, task_id=task_id,
                           rollout_index=rollout_index)
        paths = next((list(b.paths) for b in blocks if b.turn == sel), [])
        return cls(task_id=task_id, rollout_index=rollout_index, run_seed=run_seed,
                   seed=selection_seed(run_seed, task_id, rollout_index),
                   blocks=[b.to_json() for b in blocks],
                   eligibility=[e.to_json() for e in judged],
                   eligible_turns=eligible, selected_turn=sel, selected_paths=paths,
                   test_patterns=list(test_patterns),
                   generated_only=[{"turn": k, "paths": sorted(ps)}
                                   for k, ps in sorted((generated or {}).items())
                                   if ps and k not in {b.turn for b in blocks}])


# ----------------------------------------------------------------------------
# ablation
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ablation:
    """The final artifact with one edit block removed.

    Attributes:
        selected_turn: the removed block's turn k.
        paths: the block's paths.
        final_tree: ``S_K``; ``ablated_tree``: ``S_K`` with the block's paths
            restored to ``S_{k-1}``.
        artifact: ``git diff --binary`` base → ablated tree (text, may be "").
        artifact_empty: ``artifact == ""`` (the ablated tree equals the base).
        final_changed: paths changed base → ``S_K`` (the final diff), sorted.
        touched_fraction: ``|paths ∩ final_changed| / |final_changed|`` in [0, 1];
            None when the final diff is empty.
        off_final_diff: no path of the block is in the final diff (the block
            repaired damage an earlier turn did).
    """

    selected_turn: int
    paths: tuple[str, ...]
    final_tree: str
    ablated_tree: str
    artifact: str
    artifact_empty: bool
    final_changed: tuple[str, ...]
    touched_fraction: float | None
    off_final_diff: bool

    def to_json(self, with_artifact: bool = False) -> dict:
        d = asdict(self)
        d["paths"] = list(self.paths)
        d["final_changed"] = list(self.final_changed)
        if not with_artifact:
            d.pop("artifact")
        d["artifact_bytes"] = len(self.artifact.encode("utf-8", errors="surrogateescape"))
        return d


def ablate(repo, snapshots: Sequence[str], block: EditBlock) -> Ablation:
    """Remove ``block`` from the final tree and build the ablated artifact.

    Args:
        repo: git repository holding the snapshot trees.
        snapshots: ``[S_0, ..., S_K]``.
        block: the selected block (normally eligible; restore is still checked).

    Returns:
        :class:`Ablation`.

    Raises:
        ValueError: the block's turn is outside 1..K.
        SnapshotError: the block is not restorable, or a tree is unknown.

    source: the design page, "Selection and restore"
    """
    snaps = _check_snapshots(snapshots)
    K = len(snaps) - 1
    if not 1 <= block.turn <= K:
        raise ValueError(f"block: turn {block.turn} outside 1..{K}")
    base, final = snaps[0], snaps[-1]
    tree = restore_paths(repo, final, snaps[block.turn - 1], list(block.paths))
    patch = artifact(repo, base, tree)
    final_changed = tuple(c.path for c in changed_paths(repo, base, final))
    inter = set(block.paths) & set(final_changed)
    frac = len(inter) / len(final_changed) if final_changed else None
    return Ablation(selected_turn=block.turn, paths=tuple(block.paths), final_tree=final,
                    ablated_tree=tree, artifact=patch, artifact_empty=patch == "",
                    final_changed=final_changed, touched_fraction=frac,
                    off_final_diff=not inter)
