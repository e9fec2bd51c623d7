"""Git snapshots of an agent's working tree, taken without touching its git state.

Each agent turn ends with :meth:`Snapshotter.snapshot`, which records the working
tree as a git *tree object* (S_k in DESIGN.md §3). The snapshot goes through a
private index file (``GIT_INDEX_FILE``) that lives outside the working tree, so the
agent's HEAD, index, branches and stash are never read or written: the agent may
``git commit``, ``git checkout -b``, ``git stash`` or delete ``.git/index`` and the
snapshots stay correct. ``.gitignore`` is honoured, as in SWE-bench patch
extraction (``git add -A`` + ``git diff``).

The private index is kept between snapshots of one rollout, so unchanged files
are only ``stat``-ed, not re-hashed. The first snapshot does not re-hash the tree
either: the index is seeded from the repository's own index when that index
describes the base tree (the usual state right after a checkout).

Tree helpers (:func:`changed_paths`, :func:`restore_paths`, :func:`artifact`) work
on tree ids of any repository and are pure with respect to the working tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
"""The id of git's empty tree (same in every SHA-1 repository)."""


class SnapshotError(RuntimeError):
    """A git operation on snapshot trees failed; the message names the repo and step."""


def _git_env(index_file: str | os.PathLike | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # A user's config must not change what a snapshot or an artifact contains.
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_OPTIONAL_LOCKS="0",
    )
    if index_file is not None:
        env["GIT_INDEX_FILE"] = str(index_file)
    return env


def _run_git(repo: str | os.PathLike, args: list[str], *, index_file=None,
             input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        input=input,
        capture_output=True,
        env=_git_env(index_file),
    )
    if check and proc.returncode != 0:
        raise SnapshotError(
            f"git {' '.join(args[:3])} failed in {repo}: "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return proc


def _git_dir(repo: str | os.PathLike) -> Path:
    out = _run_git(repo, ["rev-parse", "--absolute-git-dir"]).stdout.decode().strip()
    return Path(out)


class Snapshotter:
    """Snapshots one working tree into git tree objects, turn after turn.

    Args:
        workdir: the agent's working tree (a git repository; ``.git`` must exist).
        base: tree-ish describing the start state S_0 (default ``HEAD``). When the
            repository's own index matches it, that index seeds the private one,
            so the first snapshot is stat-only.

    Raises:
        SnapshotError: ``workdir`` is not a git working tree or ``base`` is unknown.

    The private index lives in a temporary directory owned by this object; call
    :meth:`close` (or use it as a context manager) to remove it.
    """

    def __init__(self, workdir: str | os.PathLike, base: str = "HEAD") -> None:
        self.workdir = Path(workdir).resolve()
        if not (self.workdir / ".git").exists():
            raise SnapshotError(f"{self.workdir} is not a git working tree (no .git)")
        self.repo = git.Repo(self.workdir)
        self._tmp = Path(tempfile.mkdtemp(prefix="ecredit-snap-"))
        self.index_file = self._tmp / "index"
        self.base_tree = self.tree_of(base)
        self._seed_index()

    # -- lifecycle -----------------------------------------------------------
    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> Snapshotter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- core ----------------------------------------------------------------
    def tree_of(self, treeish: str) -> str:
        """Tree id (40 hex) of ``treeish``. Raises SnapshotError when unknown."""
        try:
            return self.repo.git.rev_parse(f"{treeish}^{{tree}}")
        except git.GitCommandError as exc:
            raise SnapshotError(f"unknown tree-ish {treeish!r} in {self.workdir}") from exc

    def _seed_index(self) -> None:
        own_index = _git_dir(self.workdir) / "index"
        if own_index.exists():
            shutil.copyfile(own_index, self.index_file)
            probe = _run_git(self.workdir, ["write-tree"], index_file=self.index_file,
                             check=False)
            if probe.returncode == 0 and probe.stdout.decode().strip() == self.base_tree:
                return
        # The repo's index does not describe the base: start from the base tree.
        # read-tree leaves no stat data, so this path re-hashes once; it is only
        # taken when the agent's repo was not freshly checked out at base.
        self.index_file.unlink(missing_ok=True)
        _run_git(self.workdir, ["read-tree", self.base_tree], index_file=self.index_file)
        _run_git(self.workdir, ["update-index", "-q", "--refresh"],
                 index_file=self.index_file, check=False)

    def snapshot(self) -> str:
        """Record the working tree as a tree object and return its id (40 hex).

        Created, modified, deleted, mode-changed and untracked (not ignored)
        files are included; binary content is stored as is. Cost: one ``stat``
        per tracked file plus hashing of changed files (see
        ``benchmarks/snapshot_cost.py``).

        Raises:
            SnapshotError: git could not read the working tree.
        """
        _run_git(self.workdir, ["add", "-A", "--", "."], index_file=self.index_file)
        return _run_git(self.workdir, ["write-tree"],
                        index_file=self.index_file).stdout.decode().strip()


# -- tree helpers ------------------------------------------------------------

@dataclass(frozen=True)
class ChangedPath:
    """One path that differs between two trees.

    ``status``: ``A`` created, ``D`` deleted, ``M`` content changed, ``T`` type
    changed (file ↔ symlink), ``X`` mode only (exec bit). Modes are git's octal
    strings (``100644``, ``100755``, ``120000``; ``000000`` when absent).
    """

    path: str
    status: str
    old_mode: str
    new_mode: str


def changed_paths(repo: str | os.PathLike, tree_a: str, tree_b: str) -> list[ChangedPath]:
    """Paths whose content or mode differ between ``tree_a`` and ``tree_b``.

    Renames are reported as a delete plus a create (edit blocks are sets of
    paths, DESIGN.md §3). Binary files are compared by blob id like any other.

    Returns: the changed paths sorted by path.
    Raises: SnapshotError when a tree id is unknown in ``repo``.
    """
    out = _run_git(repo, ["diff-tree", "-r", "-z", "--no-renames", "--raw",
                          tree_a, tree_b]).stdout
    fields = out.split(b"\0")
    result: list[ChangedPath] = []
    i = 0
    while i + 1 < len(fields):
        meta = fields[i].decode()
        if not meta.startswith(":"):
            i += 1
            continue
        old_mode, new_mode, old_sha, new_sha, status = meta[1:].split()
        path = fields[i + 1].decode("utf-8", errors="surrogateescape")
        i += 2
        if status == "M" and old_sha == new_sha:
            status = "X"
        result.append(ChangedPath(path, status[0], old_mode, new_mode))
    return sorted(result, key=lambda c: c.path)


def _ls_tree(repo, tree: str, paths: list[str]) -> dict[str, tuple[str, str]]:
    if not paths:
        return {}
    out = _run_git(repo, ["ls-tree", "-r", "-z", "--full-tree", tree, "--", *paths]).stdout
    entries: dict[str, tuple[str, str]] = {}
    for rec in out.split(b"\0"):
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        mode, _type, sha = meta.decode().split()
        entries[path.decode("utf-8", errors="surrogateescape")] = (mode, sha)
    return entries


def restore_paths(repo: str | os.PathLike, final_tree: str, source_tree: str,
                  paths: list[str] | set[str]) -> str:
    """Restore ``paths`` of ``final_tree`` to their state in ``source_tree``.

    Each path takes its blob and mode from ``source_tree``, or is removed when
    absent there (DESIGN.md §3 "Restore"). Other paths are untouched.

    Returns: the id of the resulting tree (may equal the base or the empty tree).
    Raises: SnapshotError when the result is not a valid tree (e.g. a restored
    file collides with a directory the final tree still holds): the block is
    then "not restorable".
    """
    paths = sorted(set(paths))
    source = _ls_tree(repo, source_tree, paths)
    with tempfile.TemporaryDirectory(prefix="ecredit-restore-") as tmp:
        index = Path(tmp) / "index"
        _run_git(repo, ["read-tree", final_tree], index_file=index)
        lines = []
        for path in paths:
            if path in source:
                mode, sha = source[path]
                lines.append(f"{mode} {sha}\t{path}")
            else:
                lines.append(f"0 {'0' * 40}\t{path}")  # mode 0 removes the entry
        data = ("\0".join(lines) + "\0").encode("utf-8", errors="surrogateescape")
        _run_git(repo, ["update-index", "-z", "--index-info"], index_file=index, input=data)
        tree = _run_git(repo, ["write-tree"], index_file=index).stdout.decode().strip()
    # git resolves a file/directory clash by silently dropping the other side; a
    # restore may only change the block's own paths, so such a clash is refused.
    collateral = sorted({c.path for c in changed_paths(repo, final_tree, tree)} - set(paths))
    if collateral:
        raise SnapshotError(
            f"not restorable in {repo}: restoring {paths} would also change {collateral}")
    return tree


def artifact(repo: str | os.PathLike, base_tree: str, tree: str) -> str:
    """The patch from ``base_tree`` to ``tree``: what a verifier applies.

    ``git diff --binary --full-index`` with fixed ``a/``/``b/`` prefixes and no
    renames, so ``git apply`` (and SWE-bench's fallback chain) accepts it on a
    clean checkout of the base; binary files are included. Returns ``""`` when
    the trees are equal.

    Raises: SnapshotError when a tree id is unknown in ``repo``.
    """
    out = _run_git(repo, ["diff", "--binary", "--full-index", "--no-renames",
                          "--no-color", "--no-ext-diff", "--src-prefix=a/",
                          "--dst-prefix=b/", base_tree, tree]).stdout
    return out.decode("utf-8", errors="surrogateescape")
